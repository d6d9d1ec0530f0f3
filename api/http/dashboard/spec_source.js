// Writing an uploaded file's `file:ID` into the submit form's spec text as `model.source` or
// `dataset.source`. A JSON spec is parsed, changed and written back; a YAML spec (the page bundles
// no YAML parser) is edited line by line in its block style, the style the job page and most
// hand-written specs use: the top-level `model:` / `dataset:` block's `source:` line is replaced
// or added. A dataset takes one origin, so its inline `prompts:` go when a source comes in.

// The spec text as JSON: {value}; text that looks like JSON but does not parse: {problem};
// anything else: {} (YAML, for the service to read).
export function readJson(text) {
  try {
    return {value: JSON.parse(text)};
  } catch (error) {
    if (/^\s*[{[]/.test(text)) return {problem: `Not valid JSON: ${error.message}.`};
    return {};
  }
}

// The keys a section loses when a source is set: the other origin of its rows.
const REPLACED = {model: [], dataset: ["prompts"]};

// -> {text} with `section.source` set to `source`, or {problem} saying why it was left alone.
export function withSource(text, section, source) {
  const json = readJson(text);
  if (json.problem) return json;
  if (json.value !== undefined) return withJsonSource(json.value, section, source);
  return withYamlSource(text, section, source);
}

function withJsonSource(spec, section, source) {
  if (typeof spec !== "object" || spec === null || Array.isArray(spec)) {
    return {problem: "The spec is not a JSON object."};
  }
  const old = typeof spec[section] === "object" && spec[section] !== null ? spec[section] : {};
  const kept = Object.entries(old).filter(([key]) => key !== "source" && !REPLACED[section].includes(key));
  spec[section] = {source, ...Object.fromEntries(kept)};
  return {text: JSON.stringify(spec, null, 2)};
}

const KEY_LINE = /^( *)([A-Za-z_][\w-]*)\s*:(.*)$/;

function isContent(line) {
  return line.trim() !== "" && !line.trim().startsWith("#");
}

function withYamlSource(text, section, source) {
  const lines = text.split("\n");
  const byHand = `add \`source: ${source}\` under \`${section}:\` by hand.`;
  const start = lines.findIndex((line) => {
    const match = KEY_LINE.exec(line);
    return match && match[1] === "" && match[2] === section;
  });
  if (start < 0) return {problem: `No top-level \`${section}:\` block in the YAML spec; ${byHand}`};
  if (isContent(KEY_LINE.exec(lines[start])[3].replace(/^\s*#.*/, ""))) {
    return {problem: `\`${section}:\` is written on one line; ${byHand}`};
  }
  let end = start + 1;  // the block runs to the next line that starts at column 0
  while (end < lines.length && !(isContent(lines[end]) && /^\S/.test(lines[end]))) end += 1;
  const block = lines.slice(start + 1, end);
  const first = block.find(isContent);
  const indent = first ? first.length - first.trimStart().length : 2;
  if (indent === 0) return {problem: `\`${section}:\` holds no mapping; ${byHand}`};
  // Each child key, with the lines under it (its value, nested keys, a list at its own indent).
  const children = [];
  for (const line of block) {
    const match = KEY_LINE.exec(line);
    if (match && match[1].length === indent) children.push({key: match[2], lines: [line]});
    else if (children.length) children.at(-1).lines.push(line);
    else children.push({key: null, lines: [line]});  // blank or comment lines before the first key
  }
  const sourceLine = `${" ".repeat(indent)}source: ${source}`;
  const kept = children.filter((child) => !REPLACED[section].includes(child.key));
  const at = kept.findIndex((child) => child.key === "source");
  if (at >= 0) kept[at] = {key: "source", lines: [sourceLine]};
  else kept.splice(kept[0] && kept[0].key === null ? 1 : 0, 0, {key: "source", lines: [sourceLine]});
  const body = kept.flatMap((child) => child.lines);
  return {text: [...lines.slice(0, start + 1), ...body, ...lines.slice(end)].join("\n")};
}
