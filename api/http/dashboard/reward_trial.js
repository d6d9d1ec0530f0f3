// "Test rewards" under the submit form: the form's spec (its rewards: and reward_timeout_seconds)
// scores a few hand-written samples on the service (POST /v1/rewards/run) without queueing a job,
// so a grader is tried before training. Samples are JSON Lines: {prompt, completion, ...columns}.

import {api} from "./api.js";
import {el, fill, table} from "./dom.js";
import {number} from "./format.js";

export const SAMPLE_TEMPLATE = [
  {prompt: "Is it good?", completion: "yes, it is", answer: "yes"},
  {prompt: "Is it good?", completion: "no", answer: "yes"},
].map((sample) => JSON.stringify(sample)).join("\n");

const SAMPLE_KEYS = new Set(["prompt", "completion", "columns"]);

// Each line one sample; keys other than prompt and completion are its columns (unless it
// gives `columns` itself). Returns {samples} or {problem} naming the line.
function parseSamples(text) {
  const samples = [];
  const lines = text.split("\n");
  for (let index = 0; index < lines.length; index += 1) {
    if (!lines[index].trim()) continue;
    let sample;
    try {
      sample = JSON.parse(lines[index]);
    } catch (error) {
      return {problem: `Sample line ${index + 1} is not JSON: ${error.message}.`};
    }
    if (typeof sample !== "object" || sample === null || !("prompt" in sample) || !("completion" in sample)) {
      return {problem: `Sample line ${index + 1} needs a "prompt" and a "completion".`};
    }
    const columns = sample.columns ?? Object.fromEntries(
      Object.entries(sample).filter(([key]) => !SAMPLE_KEYS.has(key)));
    samples.push({prompt: sample.prompt, completion: sample.completion, columns});
  }
  return samples.length ? {samples} : {problem: "Write at least one sample."};
}

function scoresTable(items, samples) {
  const names = items.length ? Object.keys(items[0].rewards) : [];
  const rows = items.map((item, index) => ({item, sample: samples[index], index}));
  const columns = [
    {title: "#", cell: (row) => String(row.index)},
    {title: "completion", className: "text", cell: (row) => row.sample.completion},
    {title: "reward", help: "the weighted sum a training step would compute", cell: (row) => cell(row.item.reward)},
    ...names.map((name) => ({title: name, cell: (row) => cell(row.item.rewards[name], row.item.problems[name])})),
  ];
  return table(columns, rows);
}

function cell(value, problem) {
  if (value !== null && value !== undefined) return number(value);
  return el("span", {className: "unscored", title: problem || "not scored"}, problem ? `— ${problem}` : "—");
}

export function mountRewardTrial(container, specText, errorList) {
  const samples = el("textarea", {name: "samples", rows: 4, cols: 80, spellcheck: "false"});
  samples.value = SAMPLE_TEMPLATE;
  const result = el("div", {className: "trial-result", role: "status"});
  const button = el("button", {type: "button", onclick: () => run()}, "Test rewards");
  container.append(el("details", {className: "reward-trial"},
    el("summary", {}, "Test the rewards on samples (no job)"),
    el("p", {className: "hint"}, "One JSON object per line: prompt, completion and the row's columns."),
    samples, el("div", {className: "toolbar"}, button), result));

  async function run() {
    fill(result);
    const parsed = parseSamples(samples.value);
    if (parsed.problem) {
      result.append(el("p", {className: "notice error"}, parsed.problem));
      return;
    }
    button.disabled = true;
    try {
      const answer = await api("/v1/rewards/run", {method: "POST",
        body: {spec: specText.value, samples: parsed.samples}});
      result.append(scoresTable(answer.items, parsed.samples));
    } catch (error) {
      result.append(errorList(error));
    } finally {
      button.disabled = false;
    }
  }
}
