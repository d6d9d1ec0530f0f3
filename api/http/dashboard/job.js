// #/jobs/42: one job — its state and controls, its spec (YAML), live training (and eval) charts,
// sample completions (training's and eval's), events and checkpoints. History comes from REST, then
// the WebSocket keeps everything current; the job itself is re-read every few seconds too (its
// queue position changes without an event).

import {api} from "./api.js";
import {ChartSet} from "./charts.js";
import {alertBadges, errorText, reasonText} from "./codes.js";
import {el, fill, notice, progressBar, section, statusBadge} from "./dom.js";
import {placement, time} from "./format.js";
import {mountPlayground} from "./playground.js";
import {actionButtons, cancelButton, cloneButton, deleteButton, downloadButton, waitNote} from "./controls.js";
import {isTerminal, offers, priorities} from "./lifecycle.js";
import {followJob} from "./live.js";
import {SamplesView} from "./samples.js";
import {smoothingControl, storedWeight} from "./smoothing.js";
import {teamName} from "./session.js";
import {CheckpointsView, EventsView} from "./timeline.js";
import {yamlText} from "./yaml_text.js";

const POLL_MS = 5000;

export function mount(container, {id}) {
  let alive = true;
  let timer = null;
  let follower = null;
  let charts = null;
  const errors = notice();
  const liveNote = notice("info");
  const header = el("div", {className: "job-header"});
  container.append(el("section", {className: "panel", dataset: {panel: "job"}}, header, errors.node));

  let shown = "";
  let latest = null;
  let polling = false;
  function render(job) {
    // The stream's status messages may carry no spec; the one read over REST stays (Clone needs it).
    if (!job.spec && latest) job = {...job, spec: latest.spec};
    latest = job;
    // A retried job is alive again: the polls that stopped when it ended start over.
    if (!isTerminal(job.status) && !polling && alive) {
      polling = true;
      timer = setTimeout(poll, POLL_MS);
    }
    const text = JSON.stringify(job);
    if (text === shown) return; // an unchanged poll leaves the controls alone (an open select stays open)
    shown = text;
    fill(header, jobHeader(job, render, (error) => errors.set(error.message)));
  }

  async function poll() {
    try {
      const job = await api(`/v1/jobs/${id}`);
      if (!alive) return;
      polling = false;
      render(job);
      errors.set("");
      return job;
    } catch (error) {
      if (!alive) return;
      if (error.status === 404) return notFound();
      errors.set(`Could not load job #${id}: ${error.message}`);
      polling = true;
      timer = setTimeout(poll, POLL_MS);
    }
  }

  function notFound() {
    fill(container, section("not-found", "Not found",
      el("p", {className: "notice error", dataset: {notFound: id}},
        `Job #${id} not found: there is no such job, or it is another team's.`),
      el("p", {}, el("a", {href: "#/jobs"}, "← all jobs"))));
  }

  async function start() {
    const job = await poll();
    if (!job || !alive) return;
    const chartBox = el("div", {className: "charts"});
    const samplesBox = el("div");
    const eventsBox = el("div");
    const checkpointsBox = el("div");
    const playgroundBox = el("div");
    container.append(specPanel(job.spec),
      section("charts", "Training and evaluation (x: optimizer step)", liveNote.node,
        el("div", {className: "toolbar"}, smoothingControl((weight) => charts.smoothWith(weight))), chartBox),
      el("div", {className: "columns"}, section("samples", "Sample completions", samplesBox),
        section("events", "Events", eventsBox)),
      section("checkpoints", "Checkpoints", checkpointsBox), playgroundBox);
    // Once the job has its final model (it offers the model's download): a conversation with it
    // (or a checkpoint), streamed.
    let playground = false;
    const offerPlayground = (current) => {
      if (playground || current.kind === "serve" || !offers(current, "download_model")) return;
      playground = true;
      const box = el("div");
      playgroundBox.append(section("playground", "Chat with this model", box));
      mountPlayground(box, current);
    };
    offerPlayground(job);
    charts = new ChartSet(chartBox, storedWeight());
    const samples = new SamplesView(samplesBox, id);
    const events = new EventsView(eventsBox);
    const checkpoints = new CheckpointsView(checkpointsBox, id, (error) => errors.set(error.message));
    const quietly = (promise) => promise.catch((error) => errors.set(error.message));
    quietly(checkpoints.load());
    follower = followJob(id, {
      // After the history: the stream then sends every sample past its last step.
      caughtUp: () => quietly(samples.load()),
      metrics: (records) => {
        charts.add(records);
        // The progress bar moves with the stream, not only with the next poll of the job.
        const step = records.length ? records[records.length - 1].step : 0;
        if (latest && step > latest.last_step) render({...latest, last_step: step});
      },
      samples: (step, rows) => samples.add(step, rows),
      event: (event) => {
        events.add(event);
        if (event.type === "checkpoint") quietly(checkpoints.load());
        if (event.type === "alert") charts.markAlert(event.data);
      },
      status: (current) => {
        render(current);
        offerPlayground(current);
        if (isTerminal(current.status)) quietly(checkpoints.load());
      },
      note: (text) => liveNote.set(text),
    });
  }

  start();
  return () => {
    alive = false;
    clearTimeout(timer);
    if (follower) follower.stop();
    if (charts) charts.destroy();
  };
}

function jobHeader(job, render, onError) {
  const facts = [
    ["team", teamName(job.team_id)],
    ["status", [jobStatusBadge(job), waitNote(job)]],
    // A serving job trains no steps: it answers /v1/chat/completions from the model it names.
    job.kind === "serve" ? ["serves", job.spec?.serve?.model ?? "–"]
      : ["progress", progressBar(job.last_step, job.max_steps)],
    ["priority", offers(job, "set_priority") ? prioritySelect(job, render, onError) : job.priority],
    ["pool / GPUs", `${job.pool} / ${job.gpus}`],
    ["attempt", job.attempt],
    [(job.placement || []).length > 1 ? "workers" : "worker",
      placement(job.placement) || job.worker_id || "–"],
    ["created", time(job.created_at)],
    ["started", time(job.started_at)],
    ["finished", time(job.finished_at)],
    ["latest checkpoint", job.latest_checkpoint || "–"],
    job.best ? ["best", `step ${job.best.step}: ${job.best.metric} ${formatValue(job.best.value)}`] : null,
    (job.alerts || []).length ? ["alerts", alertBadges(job)] : null,
  ].filter(Boolean);
  return [
    el("div", {className: "title"},
      el("h2", {}, job.name, " ", el("span", {className: "muted"}, `#${job.id}`)),
      cancelButton(job, render, onError),
      ...actionButtons(job, render, onError),
      cloneButton(job, onError),
      offers(job, "download_model") ? downloadButton(job.id, null, onError) : null,
      deleteButton(job, onError)),
    el("dl", {className: "facts"},
      facts.map(([name, value]) => el("div", {}, el("dt", {}, name), el("dd", {}, value)))),
    waitingNote(job),
    failureNote(job.error),
    unscoredNote(job),
  ];
}

// A success whose rewards left rows unscored is no plain green "succeeded": the service labels it
// (status_label, "succeeded with warnings"), its reward signal was partly missing, and the events
// (reward_unscored) say why.
function jobStatusBadge(job) {
  const label = job.status_label || job.status;
  if (label === job.status) return statusBadge(job.status);
  return el("span", {className: `badge status-${job.status}-warnings`, dataset: {status: job.status},
    title: `${job.unscored_rows} row(s) the rewards could not score`}, label);
}

const formatValue = (value) => (typeof value === "number" ? Number(value.toPrecision(4)) : "–");

function unscoredNote(job) {
  if (!job.unscored_rows) return null;
  return el("div", {className: "job-note unscored", dataset: {unscoredRows: job.unscored_rows}},
    el("strong", {}, "Warnings: "),
    `${job.unscored_rows} row(s) the rewards could not score; its reward_unscored events say why.`);
}

// The spec as submitted (with the service's defaults), folded away until asked for: it never
// changes, so it is drawn once, not with each poll.
function specPanel(spec) {
  if (!spec) return null;
  return el("details", {className: "panel", dataset: {panel: "spec"}}, el("summary", {}, "Spec"),
    el("pre", {className: "spec-yaml"}, yamlText(spec)));
}

// Why a waiting job waits, in full: across the page, not squeezed into a fact's cell.
function waitingNote(job) {
  if (!job.pending_reason) return null;
  const meaning = reasonText(job.pending_reason);
  return el("div", {className: "job-note waiting", dataset: {reason: job.pending_reason}},
    el("strong", {}, "Waits: "), el("code", {}, job.pending_reason), meaning ? ` — ${meaning}` : null);
}

// A failure: its code, what the code means, and the message as the job left it (line breaks kept).
function failureNote(error) {
  if (!error) return null;
  const meaning = errorText(error.code);
  return el("div", {className: "job-note failure", dataset: {errorCode: error.code}},
    el("div", {}, el("strong", {}, "Failed: "), el("code", {}, error.code), meaning ? ` — ${meaning}` : null),
    el("p", {className: "message"}, error.message));
}

// Changing the class moves a waiting job in the queue and decides whether a running one may be preempted.
function prioritySelect(job, render, onError) {
  const select = el("select", {dataset: {field: "priority"}, onchange: async () => {
    try {
      render(await api(`/v1/jobs/${job.id}`, {method: "PATCH", body: {priority: select.value}}));
    } catch (error) {
      onError(error);
      select.value = job.priority;
    }
  }}, priorities().map((name) => el("option", {value: name}, name)));
  select.value = job.priority;
  return select;
}
