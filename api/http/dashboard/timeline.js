// A job's events (lifecycle, checkpoints, errors; newest first) and its checkpoints list.

import {api} from "./api.js";
import {downloadButton} from "./controls.js";
import {el, fill, table} from "./dom.js";
import {time} from "./format.js";

const MAX_EVENTS = 500;

export class EventsView {
  constructor(container) {
    this.list = el("ol", {className: "events"});
    container.append(this.list);
    this.count = 0;
  }

  add(event) {
    const item = el("li", {className: `level-${event.level}`, dataset: {type: event.type}},
      el("time", {datetime: event.ts}, time(event.ts)), " ", el("strong", {}, event.type), " ",
      event.message);
    this.list.prepend(item);
    if (++this.count > MAX_EVENTS) this.list.lastChild.remove();
  }
}

export class CheckpointsView {
  constructor(container, jobId, onError = () => {}) {
    this.container = container;
    this.jobId = jobId;
    this.onError = onError;
  }

  async load() {
    const page = await api(`/v1/jobs/${this.jobId}/checkpoints`);
    fill(this.container, table([
      {title: "step", className: "num", cell: (c) => c.step},
      {title: "path", className: "text", cell: (c) => el("code", {}, c.path)},
      {title: "saved", cell: (c) => time(c.created_at)},
      {title: "", cell: (c) => downloadButton(this.jobId, c.step, this.onError)},
    ], page.items, {empty: "No checkpoint yet."}));
  }
}
