// "Try the environment" under the submit form: the form's spec (its environment:) plays one
// episode on the service (POST /v1/environments/run) on scripted actions, without a model or a
// job, so an environment is tried before training. The item is the dataset row reset(item)
// gets (a JSON object); the actions are the model's turns, one per line.

import {api} from "./api.js";
import {el, fill, table} from "./dom.js";
import {number} from "./format.js";

export const ITEM_TEMPLATE = JSON.stringify({target: 7});
export const ACTIONS_TEMPLATE = ["5", "7"].join("\n");

// {item, actions} read from the two fields, or {problem} saying what to fix.
export function parseEpisodeInput(itemText, actionsText) {
  let item;
  try {
    item = itemText.trim() ? JSON.parse(itemText) : {};
  } catch (error) {
    return {problem: `The item is not JSON: ${error.message}.`};
  }
  if (typeof item !== "object" || item === null || Array.isArray(item)) {
    return {problem: "The item must be a JSON object: the dataset row reset(item) gets."};
  }
  const actions = actionsText.split("\n").filter((line) => line.trim());
  return actions.length ? {item, actions} : {problem: "Write at least one action, one per line."};
}

function episodeTable(answer) {
  const rows = [{turn: "reset", action: "", observation: answer.first_observation, reward: null, done: null},
    ...answer.steps.map((step, index) => ({turn: String(index + 1), ...step}))];
  return table([
    {title: "turn", cell: (row) => row.turn},
    {title: "action", className: "text", cell: (row) => row.action},
    {title: "reward", cell: (row) => (row.reward === null || row.reward === undefined ? "—" : number(row.reward))},
    {title: "done", cell: (row) => (row.done === null ? "" : row.done ? "yes" : "no")},
    {title: "observation", className: "text", cell: (row) => row.observation ?? "—"},
  ], rows);
}

export function mountEnvironmentTrial(container, specText, errorList) {
  const item = el("textarea", {name: "episode-item", rows: 2, cols: 80, spellcheck: "false"});
  item.value = ITEM_TEMPLATE;
  const actions = el("textarea", {name: "episode-actions", rows: 3, cols: 80, spellcheck: "false"});
  actions.value = ACTIONS_TEMPLATE;
  const result = el("div", {className: "trial-result", role: "status"});
  const button = el("button", {type: "button", onclick: () => run()}, "Try the environment");
  container.append(el("details", {className: "environment-trial"},
    el("summary", {}, "Try the environment on scripted actions (no job)"),
    el("p", {className: "hint"}, "The dataset row reset(item) gets, as a JSON object:"), item,
    el("p", {className: "hint"}, "The model's turns, one per line, given to step(action) until it is done:"),
    actions, el("div", {className: "toolbar"}, button), result));

  async function run() {
    fill(result);
    const parsed = parseEpisodeInput(item.value, actions.value);
    if (parsed.problem) {
      result.append(el("p", {className: "notice error"}, parsed.problem));
      return;
    }
    button.disabled = true;
    try {
      const answer = await api("/v1/environments/run", {method: "POST",
        body: {spec: specText.value, item: parsed.item, actions: parsed.actions}});
      result.append(episodeTable(answer),
        el("p", {className: "hint"}, `Total reward ${number(answer.total_reward)}; `
          + `${answer.done ? "done" : "not done"}` + (answer.unused_actions ? `, ${answer.unused_actions} action(s) unused.` : ".")));
    } catch (error) {
      result.append(errorList(error));
    } finally {
      button.disabled = false;
    }
  }
}
