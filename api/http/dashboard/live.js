// Following one job: its history from REST (metrics and events, paged), then the WebSocket
// `/v1/jobs/{id}/stream?after=<last step>&after_event=<last event id>` for what comes next. A
// dropped socket reconnects from the same cursors, so each step is handed on once.

import {KEY_REVOKED_CLOSE, allPages, keyRevoked, openStream} from "./api.js";

const RECONNECT_MS = 2000;
const FINISHED_CLOSE = 1000; // the server closes with 1000 after a finished job's last status
// Steps count from 1, but step 0 holds the evaluation before training: the cursors start before it.
const BEFORE_FIRST_STEP = -1;

// handlers: {metrics(records), event(event), samples(step, rows), status(job), caughtUp(), note(text)}:
// caughtUp runs once the history is in, just before the socket opens; note says what is wrong with
// the live updates ("" once they flow again).
export function followJob(jobId, handlers) {
  let step = BEFORE_FIRST_STEP;
  let eventId = 0;
  let socket = null;
  let retry = null;
  let stopped = false;
  const live = () => !stopped;

  function metrics(records) {
    const fresh = records.filter((record) => record.step > step);
    if (!fresh.length) return;
    step = fresh.at(-1).step;
    handlers.metrics(fresh);
  }

  function event(item) {
    if (item.id <= eventId) return;
    eventId = item.id;
    handlers.event(item);
  }

  async function history() {
    const base = `/v1/jobs/${jobId}`;
    const records = await allPages(`${base}/metrics`, {after_step: BEFORE_FIRST_STEP, limit: 1000}, "after_step", live);
    if (stopped) return;
    metrics(records.map((item) => item.values));
    const events = await allPages(`${base}/events`, {after: 0, limit: 1000}, "after", live);
    if (!stopped) events.forEach(event);
  }

  function receive(message) {
    const data = JSON.parse(message.data);
    if (data.type === "metrics") metrics([data.values]);
    else if (data.type === "event") event(data.event);
    else if (data.type === "samples") handlers.samples(data.step, data.rows);
    else if (data.type === "status" && data.job) handlers.status(data.job);
  }

  async function connect() {
    if (stopped) return;
    let opened;
    try {
      opened = await openStream(jobId, step, eventId);
    } catch (error) {
      if (error.status === 401 || stopped) return;  // the app shows the login page
      handlers.note(`live updates interrupted (${error.message}); reconnecting…`);
      retry = setTimeout(connect, RECONNECT_MS);
      return;
    }
    if (stopped) {
      opened.close(1000);
      return;
    }
    socket = opened;
    socket.onmessage = receive;
    socket.onclose = (closed) => {
      socket = null;
      if (stopped || closed.code === FINISHED_CLOSE) return;
      if (closed.code === KEY_REVOKED_CLOSE) {
        keyRevoked();
        return;
      }
      handlers.note(`live updates interrupted (code ${closed.code}); reconnecting…`);
      retry = setTimeout(connect, RECONNECT_MS);
    };
    socket.onopen = () => handlers.note("");
  }

  history().then(() => {
    if (stopped) return;
    handlers.caughtUp();
    connect();
  }, (error) => {
    if (!stopped) handlers.note(`could not load the history: ${error.message}`);
  });

  return {
    stop() {
      stopped = true;
      clearTimeout(retry);
      if (socket) socket.close(1000);
    },
  };
}
