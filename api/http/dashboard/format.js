// How numbers and times read on the page.

export function number(value, digits = 4) {
  if (value === null || value === undefined || value === "") return "–";
  const n = Number(value);
  if (!Number.isFinite(n)) return String(value);
  if (n !== 0 && (Math.abs(n) >= 1e5 || Math.abs(n) < 1e-3)) return n.toExponential(2);
  return String(Number(n.toFixed(digits)));
}

export function age(iso, now = Date.now()) {
  if (!iso) return "–";
  const seconds = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ${Math.floor((seconds % 3600) / 60)}m`;
  return `${Math.floor(seconds / 86400)}d`;
}

export function time(iso) {
  return iso ? new Date(iso).toLocaleString() : "–";
}

export function megabytes(mb) {
  if (mb === null || mb === undefined) return "–";
  return mb >= 1024 ? `${(mb / 1024).toFixed(1)} GiB` : `${mb} MiB`;
}

// A size in bytes, in binary units: "512 B", "3.2 MiB".
export function bytes(count) {
  if (count === null || count === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(count);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

// Every worker a job holds devices on, node-rank order: "w1 [0, 1] + w2 [0]" (a worker alone when
// its devices were not recorded: all of them). Empty while the job holds none.
export function placement(hosts) {
  return (hosts || []).map((h) => (h.devices ? `${h.worker} [${h.devices.join(", ")}]` : h.worker))
    .join(" + ");
}

// A value as a spec or a dataset row would write it: text as it is, anything else as JSON; a
// value a row lacks reads "–".
export function valueText(value) {
  if (value === null || value === undefined) return "–";
  return typeof value === "string" ? value : JSON.stringify(value);
}
