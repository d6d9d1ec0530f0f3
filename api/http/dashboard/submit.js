// The submit form: a JobSpec as JSON or YAML. Text that parses as JSON is sent as JSON; anything
// else goes as YAML, which the service parses (the page bundles no YAML library). Prefilled with
// a template to edit: model and data sources are `path:` names under the deployment's roots, so
// they differ from one to the next. A team's own uploads (above the spec: uploads.js) go in as
// `file:ID`. The service's 422 lists every invalid field; each is shown with its path in the spec.
// A job's Clone opens it filled with that job's spec. "Estimate GPU-hours" sends the spec as a
// dry run: every check of a submit, nothing queued, and the job's GPU-hours estimated.

import {api} from "./api.js";
import {el, fill, jobLink} from "./dom.js";
import {number} from "./format.js";
import {mountRewardPicker} from "./reward_picker.js";
import {mountEnvironmentTrial} from "./environment_trial.js";
import {mountRewardTrial} from "./reward_trial.js";
import {readJson} from "./spec_source.js";
import {mountUploads} from "./uploads.js";

export const TEMPLATE = {
  name: "tiny-say-yes",
  model: {source: "path:tiny-model", dtype: "float32"},
  dataset: {prompts: [{prompt: "Is it good?"}, {prompt: "What is 2+3?"}, {prompt: "hello world"},
    {prompt: "Is the cat a dog?"}]},
  rewards: [{name: "contains", weight: 1.0, args: {text: "yes"}}],
  grpo: {num_generations: 4, prompts_per_step: 2, max_completion_length: 16, learning_rate: 3e-3,
    max_steps: 60, seed: 0},
  checkpoint_every: 20,
  log_completions_every: 10,
  priority: "normal",
};

function templateText() {
  return JSON.stringify(TEMPLATE, null, 2);
}

// A spec handed over to the next form mounted (a job's Clone): it opens with that text to edit,
// and nothing is queued until its Submit.
let draft = null;

export function openSubmitFormWith(text) {
  draft = text;
  location.hash = "#/jobs";
}

// JSON when it is JSON; text that looks like JSON but does not parse is a typo to point out
// here, anything else is YAML for the service to read.
function parseSpec(text) {
  const json = readJson(text);
  if (json.problem) return json;
  if (json.value !== undefined) return {request: {body: json.value}};
  return {request: {text, contentType: "application/yaml"}};
}

export function mountSubmitForm(container, onSubmitted) {
  const spec = el("textarea", {name: "spec", rows: 18, cols: 80, spellcheck: "false"});
  const handed = draft;
  draft = null;
  spec.value = handed ?? templateText();
  const result = el("div", {className: "submit-result", role: "status"});
  const rewards = el("div");
  const button = el("button", {type: "submit"}, "Submit");
  const estimateButton = el("button", {type: "button", className: "estimate", onclick: () => estimate(),
    title: "Check the spec as a submit would and estimate its GPU-hours; nothing is submitted"},
  "Estimate GPU-hours");
  const form = el("form", {className: "submit-form", onsubmit: (event) => {
    event.preventDefault();
    submit();
  }}, spec, rewards, el("div", {className: "toolbar"}, button, estimateButton,
    el("button", {type: "button", onclick: () => { spec.value = templateText(); fill(result); }},
      "Reset to template")), result);
  const uploads = el("div");
  container.append(el("details", {className: "panel", dataset: {panel: "submit"}, open: handed !== null},
    el("summary", {}, "Submit a job"), uploads, form));
  if (handed !== null) spec.focus();
  mountUploads(uploads, spec);
  mountRewardPicker(rewards, spec);
  mountRewardTrial(form, spec, errorList);
  mountEnvironmentTrial(form, spec, errorList);

  // The spec sent as a submit, or as its dry run (`query`); `control` is disabled meanwhile and
  // `shown(answer)` puts the answer on the form.
  async function send(control, query, shown) {
    fill(result);
    const parsed = parseSpec(spec.value);
    if (parsed.problem) {
      result.append(el("p", {className: "notice error"}, parsed.problem));
      return;
    }
    control.disabled = true;
    try {
      shown(await api("/v1/jobs", {method: "POST", query, ...parsed.request}));
    } catch (error) {
      result.append(errorList(error));
    } finally {
      control.disabled = false;
    }
  }

  function submit() {
    return send(button, undefined, (job) => {
      result.append(el("p", {className: "notice info"}, "Submitted ", jobLink(job.id, `job #${job.id}`),
        ` (${job.name}), ${job.status}.`));
      if (job.warnings && job.warnings.length) result.append(warningList(job.warnings));
      onSubmitted(job);
    });
  }

  // The submit's dry run (POST /v1/jobs?dry_run=true): every check it makes, and the GPU-hours.
  function estimate() {
    return send(estimateButton, {dry_run: "true"}, (answer) => {
      result.append(estimateView(answer));
      if (answer.warnings.length) result.append(warningList(answer.warnings));
    });
  }
}

// Tokens a step × steps over the pool's throughput (measured on its succeeded jobs, else the
// deployment's default), and what the team has left of its budget this period.
function estimateView({estimate, team_budget: budget}) {
  const hours = estimate.gpu_hours === null ? "unknown until the job has loaded its dataset"
    : `about ${number(estimate.gpu_hours, 4)} GPU-hours`;
  const jobs = estimate.measured_jobs === 1 ? "its latest succeeded job" : `its ${estimate.measured_jobs} latest `
    + "succeeded jobs";
  const basis = estimate.basis === "measured" ? `measured on ${jobs}`
    : "assumed: no job of this pool has succeeded yet";
  const left = budget.gpu_hours_budget === null ? "no GPU-hour budget"
    : `${number(budget.left_gpu_hours, 4)} of ${number(budget.gpu_hours_budget, 4)} GPU-hours left this `
      + `${budget.period}`;
  return el("div", {className: "notice info estimate", dataset: {gpuHours: estimate.gpu_hours ?? ""}},
    el("p", {}, `Estimate: ${hours}: ${estimate.steps ?? "?"} steps of ${estimate.tokens_per_step} tokens `
      + `at the pool's ${number(estimate.tokens_per_gpu_second, 0)} tokens per GPU-second, plus `
      + `${number(estimate.startup_gpu_seconds, 1)} GPU-seconds of start-up a GPU (${basis}).`),
    el("p", {}, `Team ${budget.team}: ${left}. Nothing was submitted.`));
}

function errorList(error) {
  if (!error.fields.length) return el("p", {className: "notice error"}, error.message);
  return el("div", {className: "notice error"}, el("p", {}, `The service refused the spec (${error.code}):`),
    el("ul", {className: "field-errors"}, error.fields.map((field) =>
      el("li", {dataset: {param: field.param || ""}}, el("code", {}, field.param || "spec"),
        ` ${field.message}`))));
}

// Fields the service took but ignores (a TRL field at its "off" value): told once, in the answer
// to the submit, so shown here where the user submitted.
function warningList(warnings) {
  return el("div", {className: "notice warning"}, el("p", {}, "Taken, but ignored:"),
    el("ul", {className: "spec-warnings"}, warnings.map((warning) =>
      el("li", {dataset: {param: warning.param}}, el("code", {}, warning.param), ` ${warning.message}`))));
}
