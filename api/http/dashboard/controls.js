// What the job list and the job page share: the statuses, a waiting job's place and reason, and
// the cancel button.

import {api} from "./api.js";
import {el} from "./dom.js";

export const STATUSES = ["queued", "dispatched", "running", "cancelling", "succeeded", "failed", "cancelled",
  "preempted"];
export const FINISHED = ["succeeded", "failed", "cancelled"];

export function waitNote(job) {
  if (!job.pending_reason && !job.queue_position) return null;
  const place = job.queue_position ? `#${job.queue_position} in queue` : "";
  return el("span", {className: "muted wait"}, ` ${[place, job.pending_reason].filter(Boolean).join(", ")}`);
}

// Cancel: a waiting job ends at once, a running one stops after its next step (`cancelling`).
export function cancelButton(job, after, onError) {
  if (FINISHED.includes(job.status) || job.status === "cancelling") return null;
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
