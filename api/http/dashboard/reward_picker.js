// The submit form's reward picker: every reward of GET /v1/rewards (built-ins and plugins alike,
// so a new reward appears without touching this file), its description and its args, read from
// the args JSON schema, and a button that adds it to the spec being edited (a JSON spec; YAML is
// left for the user to edit by hand).

import {api} from "./api.js";
import {el, fill} from "./dom.js";

// A JSON schema property as one line: type or choices, default, bounds.
function describeField(name, property, required) {
  const choices = property.enum || (property.anyOf || []).flatMap((option) => option.enum || []);
  const types = property.type ? [property.type]
    : (property.anyOf || []).map((option) => option.type).filter(Boolean);
  const kind = choices.length ? choices.map((c) => JSON.stringify(c)).join(" | ") : types.join(" | ");
  const bounds = [
    property.minimum !== undefined ? `≥ ${property.minimum}` : null,
    property.exclusiveMinimum !== undefined ? `> ${property.exclusiveMinimum}` : null,
    property.maximum !== undefined ? `≤ ${property.maximum}` : null,
    property.maxLength !== undefined ? `≤ ${property.maxLength} chars` : null,
  ].filter(Boolean).join(", ");
  const extra = required ? "required" : `default ${JSON.stringify(property.default ?? null)}`;
  return el("li", {dataset: {arg: name}}, el("code", {}, name), ` (${kind || "any"}; ${extra}`,
    bounds ? `; ${bounds}` : "", ")", property.description ? ` ${property.description}` : "");
}

// The value a required field starts with in the spec: something of the right type to replace.
function placeholder(property) {
  const kind = property.type || (property.anyOf || []).map((option) => option.type).find(Boolean);
  if (property.enum) return property.enum[0];
  if (kind === "integer" || kind === "number") return property.minimum ?? 0;
  if (kind === "boolean") return false;
  if (kind === "array") return [];
  return "";
}

export function rewardEntry(reward) {
  const schema = reward.args_schema || {};
  const args = {};
  for (const name of schema.required || []) args[name] = placeholder(schema.properties[name] || {});
  return {name: reward.name, weight: 1.0, args};
}

export function mountRewardPicker(container, specField) {
  const select = el("select", {name: "reward"});
  const about = el("div", {className: "reward-about muted"});
  const note = el("p", {className: "muted", role: "status"});
  const add = el("button", {type: "button", onclick: () => addSelected()}, "Add reward to the spec");
  let rewards = [];
  container.append(el("div", {className: "reward-picker"},
    el("label", {}, "Rewards this service knows: ", select), add, about, note));
  select.addEventListener("change", () => showSelected());
  load();

  async function load() {
    try {
      rewards = (await api("/v1/rewards")).items;
    } catch {
      fill(note, "The reward catalog could not be read.");
      return;
    }
    fill(select, rewards.map((reward) => el("option", {value: reward.name}, reward.name)));
    showSelected();
  }

  function selected() {
    return rewards.find((reward) => reward.name === select.value);
  }

  function showSelected() {
    const reward = selected();
    if (!reward) return fill(about);
    const schema = reward.args_schema || {};
    const required = new Set(schema.required || []);
    const fields = Object.entries(schema.properties || {});
    fill(about, el("p", {}, reward.description),
      fields.length ? el("ul", {className: "reward-args"},
        fields.map(([name, property]) => describeField(name, property, required.has(name))))
        : el("p", {}, "No args."));
  }

  function addSelected() {
    fill(note);
    const reward = selected();
    if (!reward) return;
    let spec;
    try {
      spec = JSON.parse(specField.value);
    } catch {
      fill(note, "Adding works on a JSON spec; in YAML, add the reward by hand.");
      return;
    }
    spec.rewards = [...(Array.isArray(spec.rewards) ? spec.rewards : []), rewardEntry(reward)];
    specField.value = JSON.stringify(spec, null, 2);
    fill(note, `Added ${reward.name}; fill in its args.`);
  }
}
