// Sample completions of a job (kept every `log_completions_every` steps): a step picker and a
// table of the rows grpo_core's `sample_rows` writes — prompt, completion, the answer parsed from
// the completion (headed "parsed answer": a dataset's own `answer` column is another thing), the
// row's dataset columns (`columns`, each its own column, headed by its name), a reward error where
// a row carries one (`error`), each reward function's score, the total reward and the
// group-normalised advantage. At an eval
// point the step also holds eval completions (`split: "eval"`, no advantage; step 0's are the
// evaluation before training): they are marked, and a second picker shows one split alone.

import {api} from "./api.js";
import {conversationLines} from "./conversation.js";
import {el, fill, table} from "./dom.js";
import {number, valueText} from "./format.js";

const KEPT_STEPS = 50; // steps held in the page; older ones drop out of the picker
const LATEST = "latest";
const EVAL = "eval"; // the split grpo_core marks eval rows with; training rows carry none
const SPLITS = [["all", "training and eval"], ["training", "training"], [EVAL, "eval"]];

const splitOf = (row) => (row.split === EVAL ? EVAL : "training");

// A single-turn completion as its text; an episode (a tools job's row) as its conversation.
function completionCell(row) {
  const lines = conversationLines(row.messages);
  if (!lines.length) return el("pre", {}, row.completion);
  return el("div", {className: "conversation"}, lines.map((line) =>
    el("div", {className: `turn turn-${line.role}`}, el("span", {className: "badge"}, line.label),
      el("pre", {}, line.text))));
}

export class SamplesView {
  constructor(container, jobId) {
    this.jobId = jobId;
    this.byStep = new Map();
    this.picker = el("select", {dataset: {picker: "samples"}, onchange: () => this.show()});
    this.split = el("select", {dataset: {picker: "split"}, onchange: () => this.show()},
      SPLITS.map(([value, text]) => el("option", {value}, text)));
    this.body = el("div", {className: "samples"});
    container.append(el("div", {className: "toolbar"}, el("label", {}, "Step ", this.picker),
      " ", el("label", {}, "Split ", this.split)), this.body);
    this.fillPicker();
    this.show();
  }

  async load() {
    const page = await api(`/v1/jobs/${this.jobId}/samples`, {query: {limit: 20}});
    for (const item of page.items) this.byStep.set(item.step, item.rows);
    this.fillPicker();
    this.show();
  }

  add(step, rows) {
    this.byStep.set(step, rows);
    const steps = [...this.byStep.keys()].sort((a, b) => a - b);
    for (const old of steps.slice(0, Math.max(0, steps.length - KEPT_STEPS))) this.byStep.delete(old);
    this.fillPicker();
    if (this.picker.value === LATEST) this.show(); // a chosen step stays on screen
  }

  steps() {
    return [...this.byStep.keys()].sort((a, b) => b - a);
  }

  fillPicker() {
    const chosen = this.picker.value || LATEST;
    const options = [el("option", {value: LATEST}, "latest"),
      ...this.steps().map((step) => el("option", {value: String(step)}, `step ${step}${this.evalNote(step)}`))];
    this.picker.replaceChildren(...options);
    this.picker.value = this.byStep.has(Number(chosen)) ? chosen : LATEST;
  }

  // " (eval)" for a step of eval rows only (step 0), " (+ eval)" beside training's.
  evalNote(step) {
    const splits = new Set(this.byStep.get(step).map(splitOf));
    if (!splits.has(EVAL)) return "";
    return splits.size === 1 ? " (eval)" : " (+ eval)";
  }

  show() {
    const steps = this.steps();
    const step = this.picker.value === LATEST ? steps[0] : Number(this.picker.value);
    const split = this.split.value;
    const all = this.byStep.get(step) || [];
    const rows = all.filter((row) => split === "all" || splitOf(row) === split);
    const functions = [...new Set(rows.flatMap((row) => Object.keys(row.rewards || {})))];
    const columns = [...new Set(rows.flatMap((row) => Object.keys(row.columns || {})))].sort();
    fill(this.body, table([
      {title: "split", cell: (row) => el("span", {className: `badge split-${splitOf(row)}`}, splitOf(row)),
        help: "eval: a completion of an eval prompt, scored but not trained on"},
      {title: "prompt", className: "text", cell: (row) => row.prompt},
      {title: "completion", className: "text", cell: completionCell},
      ...(rows.some((row) => row.turns !== undefined) ? [{title: "turns", className: "num",
        cell: (row) => number(row.turns), help: "The episode's turns (tool calls made: the row's conversation)"}] : []),
      {title: "parsed answer", className: "text", cell: (row) => row.answer ?? "–",
        help: "The answer the rewards read, parsed from the completion (after the reasoning, if any)"},
      ...columns.map((name) => ({title: name, className: "text dataset-column",
        cell: (row) => valueText(row.columns?.[name]), help: `The dataset row's own "${name}" column`})),
      ...(rows.some((row) => row.error) ? [{title: "reward error", className: "text reward-error",
        cell: (row) => (row.error ? el("pre", {}, row.error) : "–")}] : []),
      ...functions.map((name) => ({title: name, className: "num",
        cell: (row) => number(row.rewards?.[name])})),
      {title: "reward", className: "num", cell: (row) => number(row.reward)},
      {title: "advantage", className: "num", cell: (row) => number(row.advantage)},
    ], rows, {empty: all.length ? `No ${split} samples at step ${step}.`
      : "No samples yet: they are kept every log_completions_every steps.",
      rowProps: (row) => ({dataset: {split: splitOf(row)}})}));
  }
}
