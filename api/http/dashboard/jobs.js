// #/jobs: the caller's jobs (the API scopes them to the key), newest first, filtered by status,
// tags (all of them) and a text in the name or description, paged by cursor, refreshed every few seconds; each with its progress, latest reward and a
// cancel button, and a box to tick it for comparing (2 to 10 ticked open #/compare). The submit
// form sits above the list. A job that evaluates shows its latest eval reward (the list's own
// `eval_reward`); the duration is from its start to its end, or to now while it runs.

import {api} from "./api.js";
import {alertBadges} from "./codes.js";
import {cancelButton, waitNote} from "./controls.js";
import {el, fill, jobLink, notice, progressBar, section, statusBadge, table} from "./dom.js";
import {age, number} from "./format.js";
import {isTerminal, statuses} from "./lifecycle.js";
import {loadTeamNames, teamName} from "./session.js";
import {mountSubmitForm} from "./submit.js";

const REFRESH_MS = 3000;
const PAGE_SIZE = 20;
const TYPING_MS = 300; // a filter typed in is applied once the typing pauses, not at each key
const COMPARE_MIN = 2; // GET /v1/jobs/compare takes 2 to 10 jobs
const COMPARE_MAX = 10;

// "a, b c" -> ["a", "b", "c"]: tags hold no comma or space, so either separates them.
const tagsOf = (text) => text.split(/[\s,]+/).filter(Boolean);

// Filter name -> the statuses it lists: all, the active ones, or one status.
const filters = () => ({"": [], active: statuses().filter((s) => !isTerminal(s)),
  ...Object.fromEntries(statuses().map((s) => [s, [s]]))});

const duration = (job) => (job.started_at
  ? age(job.started_at, job.finished_at ? Date.parse(job.finished_at) : Date.now()) : "–");

export function mount(container) {
  const byFilter = filters(); // the lifecycle is loaded before any page mounts
  let alive = true;
  let timer = null;
  let latest = 0; // only the newest refresh renders and schedules the next one
  const cursors = [0]; // the `after` of each page shown so far; the last is the current page
  let nextAfter = null;
  const rewards = new Map(); // job id -> {step, reward}: fetched again only when the job moved on
  const errors = notice();
  const body = el("div", {className: "job-table"});
  const firstPage = () => { cursors.length = 1; refresh(); };
  const filter = el("select", {dataset: {filter: "status"}, onchange: firstPage},
    Object.keys(byFilter).map((name) => el("option", {value: name}, name || "all")));
  let typing = null;
  const typed = () => { clearTimeout(typing); typing = setTimeout(firstPage, TYPING_MS); };
  const tagFilter = el("input", {type: "search", dataset: {filter: "tag"}, placeholder: "tag, tag…",
    title: "Only jobs with all these tags", oninput: typed});
  const search = el("input", {type: "search", dataset: {filter: "q"}, placeholder: "name or description",
    maxLength: 200, title: "Only jobs whose name or description holds this text", oninput: typed});
  const previous = el("button", {type: "button", onclick: () => { cursors.pop(); refresh(); }}, "← Previous");
  const next = el("button", {type: "button", onclick: () => { cursors.push(nextAfter); refresh(); }},
    "Next →");
  const ticked = new Set(); // job ids to compare; kept across refreshes, pages and filters
  const compare = el("button", {type: "button", dataset: {compare: "jobs"},
    onclick: () => { location.hash = `#/compare?ids=${[...ticked].join(",")}`; }});
  const showTicked = () => {
    fill(compare, `Compare (${ticked.size})`);
    compare.disabled = ticked.size < COMPARE_MIN || ticked.size > COMPARE_MAX;
    compare.title = `Tick ${COMPARE_MIN} to ${COMPARE_MAX} jobs to compare their metrics and specs`;
  };
  const tick = (job, on) => {
    if (on) ticked.add(job.id);
    else ticked.delete(job.id);
    showTicked();
  };
  showTicked();

  const form = el("div");
  mountSubmitForm(form, () => refresh());
  container.append(form, section("jobs", "Jobs", el("div", {className: "toolbar"},
    el("label", {}, "Status ", filter), el("label", {}, "Tags ", tagFilter), el("label", {}, "Search ", search),
    previous, next, compare), errors.node, body));

  const current = (ticket) => alive && ticket === latest;

  async function refresh() {
    clearTimeout(timer);
    const ticket = ++latest;
    try {
      const page = await api("/v1/jobs", {query: {status: byFilter[filter.value], tag: tagsOf(tagFilter.value),
        q: search.value.trim() || null, after: cursors.at(-1), limit: PAGE_SIZE, order: "desc"}});
      await loadTeamNames(page.items.map((job) => job.team_id));
      await latestRewards(page.items);
      if (!current(ticket)) return;
      nextAfter = page.next_after;
      previous.disabled = cursors.length === 1;
      next.disabled = nextAfter === null;
      fill(body, jobTable(page.items));
      errors.set("");
    } catch (error) {
      if (current(ticket)) errors.set(`Could not load jobs: ${error.message}`);
    }
    if (current(ticket)) timer = setTimeout(refresh, REFRESH_MS);
  }

  // One small read per visible job that made progress: its newest step's reward only.
  async function latestRewards(items) {
    const stale = items.filter((job) => job.last_step > 0 && rewards.get(job.id)?.step !== job.last_step);
    await Promise.all(stale.map(async (job) => {
      try {
        const page = await api(`/v1/jobs/${job.id}/metrics`,
          {query: {after_step: job.last_step - 1, limit: 1, names: "reward"}});
        const record = page.items[0];
        if (record) rewards.set(job.id, {step: record.step, reward: record.values.reward});
      } catch {
        // A missing reward is shown as "–"; the list itself still renders.
      }
    }));
  }

  function jobTable(items) {
    return table([
      {title: "", cell: (job) => el("input", {type: "checkbox", checked: ticked.has(job.id), title: "Tick to compare",
        dataset: {compareJob: job.id}, onchange: (event) => tick(job, event.target.checked)})},
      {title: "id", cell: (job) => jobLink(job.id)},
      {title: "name", cell: (job) => jobLink(job.id, job.name)},
      {title: "tags", cell: (job) => (job.tags || []).map((tag) =>
        el("button", {type: "button", className: "badge tag", dataset: {tag}, title: "List the jobs with this tag",
          onclick: () => { tagFilter.value = tag; firstPage(); }}, tag))},
      {title: "team", cell: (job) => teamName(job.team_id)},
      {title: "status", cell: (job) => [statusBadge(job.status), waitNote(job), ...alertBadges(job)]},
      // A serving job (kind serve) trains no steps: it answers chat requests until idle.
      {title: "progress", cell: (job) => job.kind === "serve" ? "serving" : progressBar(job.last_step, job.max_steps)},
      {title: "reward", className: "num", cell: (job) => number(rewards.get(job.id)?.reward)},
      {title: "eval reward", className: "num", cell: (job) => number(job.eval_reward),
        help: "The mean reward of the job's latest evaluation"},
      {title: "duration", className: "num", cell: duration,
        help: "From its start to its end (while it runs: to now); – before it starts"},
      {title: "age", className: "num", cell: (job) => age(job.created_at)},
      {title: "", cell: (job) => cancelButton(job, refresh, (error) => errors.set(error.message))},
    ], items, {empty: "No jobs here yet.", rowProps: (job) => ({dataset: {jobId: job.id}})});
  }

  refresh();
  return () => {
    alive = false;
    clearTimeout(timer);
    clearTimeout(typing);
  };
}
