// Building DOM nodes. Every string goes in as a text node or an attribute value, never as HTML,
// so nothing the API returns (job names, prompts, completions, messages) can inject markup.

// el("a", {href: "#/jobs", className: "x", dataset: {jobId: 1}, onclick: fn}, "text", node, [more])
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "className") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "value" || name === "checked" || name === "disabled") node[name] = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// Replace a node's children (same rules as el's: text, nodes, arrays; null is skipped).
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

// columns: [{title, cell: row => string | Node, className?, help?}]; rows: objects. `help` says
// what the column is, on hover of its heading.
export function table(columns, rows, {empty = "nothing yet", rowProps} = {}) {
  const head = el("tr", {}, columns.map((c) => el("th", {className: c.className, title: c.help}, c.title)));
  const body = rows.length
    ? rows.map((row) => el("tr", rowProps ? rowProps(row) : {},
      columns.map((c) => el("td", {className: c.className}, c.cell(row)))))
    : [el("tr", {}, el("td", {className: "empty", colspan: columns.length}, empty))];
  return el("table", {}, el("thead", {}, head), el("tbody", {}, body));
}

// A titled panel; `name` is its data-panel, by which tests (and styles) find it.
export function section(name, title, ...children) {
  return el("section", {className: "panel", dataset: {panel: name}}, el("h2", {}, title), children);
}

export function statusBadge(status) {
  return el("span", {className: `badge status-${status}`, dataset: {status}}, status);
}

export function progressBar(done, total) {
  const fraction = total > 0 ? Math.min(1, done / total) : 0;
  const bar = el("span", {className: "fill"});
  bar.style.width = `${(fraction * 100).toFixed(1)}%`;
  // No total yet: a job by epochs whose worker has not counted its dataset's prompts.
  const of = total ?? "?";
  return el("span", {className: "progress", title: `${done} / ${of} steps`},
    el("span", {className: "track"}, bar), el("span", {className: "label"}, `${done}/${of}`));
}

export function jobLink(id, text = `#${id}`) {
  return el("a", {href: `#/jobs/${id}`}, text);
}

// A message line that pages show their errors in; set(text) shows it, set("") hides it.
export function notice(kind = "error") {
  const node = el("p", {className: `notice ${kind}`, role: "status", hidden: true});
  return {node, set(text) { node.textContent = text; node.hidden = !text; }};
}
