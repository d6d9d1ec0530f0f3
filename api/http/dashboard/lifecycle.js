// The job lifecycle as the service defines it (GET /v1/lifecycle), fetched once per page load:
// every status, which of them are terminal, and the priority classes. Which actions a job offers
// comes with the job itself (its `actions`, from the same table), so the page never decides it.

import {fetchOnce} from "./api.js";

let lifecycle = {statuses: [], terminal: [], priorities: []};

export async function loadLifecycle() {
  lifecycle = await fetchOnce("/v1/lifecycle");
}

export const statuses = () => lifecycle.statuses;
export const priorities = () => lifecycle.priorities;
export const isTerminal = (status) => lifecycle.terminal.includes(status);
export const offers = (job, action) => (job.actions || []).includes(action);
