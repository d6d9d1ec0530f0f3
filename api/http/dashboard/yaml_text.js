// Plain JSON data (what the API answers) as block-style YAML text, for people to read and edit:
// the page bundles no YAML library. Any YAML reader (PyYAML's 1.1 included) reads the text back
// to the same data. A string is written bare only when it cannot read as anything else; any
// other string is double-quoted with JSON's escapes (valid YAML), or, when it spans lines, a
// block literal `|`. Numbers are written so that YAML 1.1 reads them as numbers.

const INDENT = "  ";

// Bare-safe: starts with a letter, then letters, digits and `_ . / + -`, words joined by one `:`
// or one space (never ": ", a trailing ":" or " #"), and not a word YAML reads as a boolean or null.
const PLAIN = /^[A-Za-z][\w./+-]*(?:[: ][\w./+-]+)*$/;
const RESERVED = /^(?:y|n|yes|no|true|false|on|off|null)$/i;
// Characters YAML refuses in a document or folds as line breaks: always written as escapes.
const UNPRINTABLE = /[\u007f-\u009f\u2028\u2029\ufeff\ufffe\uffff]/g;
const LITERAL_UNSAFE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]/;

export function yamlText(value) {
  // A lone literal's lines go one level in: at column 0 a line of "---" would end the document.
  return `${(isBlock(value) ? block(value, 0) : inlineOrLiteral(value, 1)).join("\n")}\n`;
}

function isBlock(value) {
  return value !== null && typeof value === "object" && Object.keys(value).length > 0;
}

// A non-empty mapping or sequence, one line per entry, each at `depth` levels of indentation.
function block(value, depth) {
  const pad = INDENT.repeat(depth);
  const lines = [];
  if (Array.isArray(value)) {
    for (const item of value) {
      // The item's own first line starts one level in; "- " takes the place of that indentation.
      const [first, ...rest] = isBlock(item) ? block(item, depth + 1) : indentFirst(item, depth + 1);
      lines.push(`${pad}- ${first.slice(pad.length + INDENT.length)}`, ...rest);
    }
    return lines;
  }
  for (const [key, item] of Object.entries(value)) {
    if (isBlock(item)) {
      lines.push(`${pad}${scalar(key)}:`, ...block(item, depth + 1));
    } else {
      const [first, ...rest] = inlineOrLiteral(item, depth + 1);
      lines.push(`${pad}${scalar(key)}: ${first}`, ...rest);
    }
  }
  return lines;
}

function indentFirst(item, depth) {
  const [first, ...rest] = inlineOrLiteral(item, depth);
  return [INDENT.repeat(depth) + first, ...rest];
}

// A value after its "key: " or "- ": one scalar, or a block literal's header then its lines.
function inlineOrLiteral(value, depth) {
  if (typeof value === "string" && literalFits(value)) return literal(value, depth);
  return [scalar(value)];
}

function scalar(value) {
  if (value === null || value === undefined) return "null";
  if (typeof value === "boolean") return String(value);
  if (typeof value === "number") return number(value);
  if (Array.isArray(value)) return "[]"; // only empty ones reach here
  if (typeof value === "object") return "{}";
  return PLAIN.test(value) && !RESERVED.test(value) ? value : quoted(value);
}

// YAML 1.1 reads 1e-7 as a string: a float with an exponent needs a dot and a signed exponent.
function number(value) {
  if (!Number.isFinite(value)) return ".nan"; // JSON has none; never written by the API
  const text = String(value);
  const exponent = text.match(/^(-?\d+)(?:\.(\d+))?e([+-]\d+)$/);
  if (!exponent) return text;
  return `${exponent[1]}.${exponent[2] || "0"}e${exponent[3]}`;
}

function quoted(text) {
  return JSON.stringify(text).replace(UNPRINTABLE,
    (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

// Several lines, each kept as it is: only when nothing needs an escape, and the first line does
// not start with a space (the reader takes the indentation from it).
function literalFits(text) {
  return text.includes("\n") && !/^[ \t\n]/.test(text) && !text.includes("\r") && !LITERAL_UNSAFE.test(text);
}

function literal(text, depth) {
  const body = text.replace(/\n+$/, "");
  const trailing = text.length - body.length;
  const chomp = trailing === 0 ? "-" : trailing === 1 ? "" : "+"; // keep exactly the final line breaks
  const pad = INDENT.repeat(depth);
  const lines = body.split("\n").map((line) => (line ? pad + line : ""));
  for (let count = 1; count < trailing; count += 1) lines.push("");
  return [`|${chomp}`, ...lines];
}
