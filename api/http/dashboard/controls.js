// What the job list and the job page share: a waiting job's place and reason, and the buttons of
// the actions a job offers (its `actions`: the service decides which apply in which status).

import {api, download} from "./api.js";
import {codeTerm, reasonText} from "./codes.js";
import {el} from "./dom.js";
import {offers} from "./lifecycle.js";
import {openSubmitFormWith} from "./submit.js";

// " #2 in queue, no_capacity": the reason's meaning shows on hover (the job page also says it in full).
export function waitNote(job) {
  if (!job.pending_reason && !job.queue_position) return null;
  const place = job.queue_position ? `#${job.queue_position} in queue` : null;
  const reason = job.pending_reason ? codeTerm(job.pending_reason, reasonText(job.pending_reason)) : null;
  return el("span", {className: "muted wait"}, " ", place, place && reason ? ", " : null, reason);
}

// Cancel: a waiting job ends at once, a running one stops after its next step (`cancelling`).
// Save a tar of the job's final model (`step` null) or of one kept checkpoint.
export function downloadButton(jobId, step, onError) {
  const [path, name] = step === null
    ? [`/v1/jobs/${jobId}/model`, `job-${jobId}-model.tar`]
    : [`/v1/jobs/${jobId}/checkpoints/${step}/archive`, `job-${jobId}-step-${step}.tar`];
  const save = async (event) => {
    event.target.disabled = true;
    try {
      await download(path, name);
    } catch (error) {
      onError(error);
    } finally {
      event.target.disabled = false;
    }
  };
  return el("button", {type: "button", dataset: {action: "download", step: step ?? "model"}, onclick: save},
    step === null ? "Download model" : "Download");
}

// Pause, resume and retry, where the job offers them: each one POST, whose answer redraws the job.
const LABELS = {pause: "Pause", resume: "Resume", retry: "Retry"};

export function actionButtons(job, after, onError) {
  return Object.entries(LABELS).filter(([action]) => offers(job, action)).map(([action, label]) => {
    const act = async (event) => {
      event.target.disabled = true;
      try {
        after(await api(`/v1/jobs/${job.id}/${action}`, {method: "POST"}));
      } catch (error) {
        onError(error);
        event.target.disabled = false;
      }
    };
    return el("button", {type: "button", dataset: {action}, onclick: act}, label);
  });
}

// Clone: the submit form opens with this job's spec, named as the service names a clone
// (NAME-2, NAME-3...: GET /v1/jobs/{id}/clone), to edit before it is queued. As JSON, like the
// form's template, so the form's "Add reward" works on it too.
export function cloneButton(job, onError) {
  if (!offers(job, "clone") || !job.spec) return null;
  const clone = async (event) => {
    event.target.disabled = true;
    try {
      const draft = await api(`/v1/jobs/${job.id}/clone`);
      openSubmitFormWith(JSON.stringify(draft.spec, null, 2));
    } catch (error) {
      onError(error);
      event.target.disabled = false;
    }
  };
  return el("button", {type: "button", dataset: {action: "clone"}, onclick: clone}, "Clone");
}

export function cancelButton(job, after, onError) {
  if (!offers(job, "cancel")) return null;
  const cancel = async (event) => {
    event.target.disabled = true;
    try {
      after(await api(`/v1/jobs/${job.id}/cancel`, {method: "POST"}));
    } catch (error) {
      onError(error);
      event.target.disabled = false;
    }
  };
  return el("button", {type: "button", className: "danger", dataset: {action: "cancel"}, onclick: cancel},
    "Cancel");
}

// Delete: a finished job, its records and its artifacts, after the browser's confirm (nothing
// undoes it); then back to the job list, where it no longer is. The service says why it refuses
// (another job continues from this one's model, say) through onError.
export function deleteButton(job, onError) {
  if (!offers(job, "delete")) return null;
  const remove = async (event) => {
    const asked = `Delete job #${job.id} "${job.name}"? Its metrics, samples, checkpoints and final ` +
      "model are removed for good.";
    if (!window.confirm(asked)) return;
    event.target.disabled = true;
    try {
      await api(`/v1/jobs/${job.id}`, {method: "DELETE"});
      location.hash = "#/jobs";
    } catch (error) {
      onError(error);
      event.target.disabled = false;
    }
  };
  return el("button", {type: "button", className: "danger", dataset: {action: "delete"}, onclick: remove},
    "Delete");
}
