// #/cluster: pools and their live workers (GPU model and memory, running job), each team's GPUs
// against its quota and fair share, each team's GPU-hours per pool over the last 7 days and what
// it has left of its GPU-hour budget this period, the running jobs, and the queue in the
// scheduler's order with why each job waits. A member's key sees its own team's jobs, GPU-hours
// and budget only (the API scopes them).

import {api} from "./api.js";
import {reasonText} from "./codes.js";
import {el, fill, jobLink, notice, section, statusBadge, table} from "./dom.js";
import {age, megabytes, number, placement, time} from "./format.js";
import {rememberTeams} from "./session.js";

const REFRESH_MS = 3000;
const USAGE_DAYS = 7;

export function mount(container) {
  let alive = true;
  let timer = null;
  const errors = notice();
  const body = el("div");
  container.append(errors.node, body);

  async function refresh() {
    try {
      const [cluster, queue, usage] = await Promise.all(
        [api("/v1/cluster"), api("/v1/queue"), api(`/v1/usage?days=${USAGE_DAYS}`)]);
      if (!alive) return;
      rememberTeams(cluster.teams);
      fill(body,
        section("pools", "Pools and workers", cluster.pools.map(poolView)),
        section("teams", "Teams", teamsTable(cluster.teams)),
        section("usage", `GPU-hours (last ${USAGE_DAYS} days)`, usageTable(usage)),
        section("budgets", "GPU-hour budgets (this period)", budgetsTable(usage.budgets || [])),
        section("running", "Running", runningTable(cluster.running)),
        section("queue", "Queue", queueView(queue)));
      errors.set("");
    } catch (error) {
      if (alive) errors.set(`Could not load the cluster: ${error.message}`);
    }
    if (alive) timer = setTimeout(refresh, REFRESH_MS);
  }

  refresh();
  return () => {
    alive = false;
    clearTimeout(timer);
  };
}

function poolView(pool) {
  const state = pool.held ? "held: nothing is dispatched" : "open";
  return el("div", {className: "pool", dataset: {pool: pool.name}},
    el("h3", {}, `${pool.name} `, el("span", {className: "muted"},
      `${state} · GPUs ${pool.gpus_busy} busy / ${pool.gpus_total} (${pool.gpus_free} free) · `,
      `${pool.waiting} waiting`)),
    table([
      {title: "worker", cell: (w) => w.worker_id},
      {title: "host", cell: (w) => w.hostname || "–"},
      {title: "GPUs", className: "num", cell: (w) => w.gpus},
      {title: "GPU model", cell: (w) => w.gpu_model || "–"},
      {title: "GPU memory", className: "num", cell: (w) => megabytes(w.gpu_memory_mb)},
      {title: "host memory", className: "num", cell: (w) => megabytes(w.memory_mb)},
      {title: "device: job", cell: runningOn},
    ], pool.workers, {empty: "No live worker in this pool.",
      rowProps: (w) => ({dataset: {worker: w.worker_id}})}));
}

// Which job holds each device. A member is not shown which job of another team holds one. A job
// spanning hosts (a gang) is one job: each worker's devices of it say its node rank and hosts.
function runningOn(worker) {
  if (!worker.busy) return "idle";
  const gangs = new Map((worker.gangs || []).map((g) => [g.job_id, g]));
  return worker.devices.flatMap((d, i) => [i ? ", " : null, `${d.index}: `,
    d.job_id ? jobLink(d.job_id) : (d.busy ? "another team's job" : "free"),
    gangs.has(d.job_id) ? gangMark(gangs.get(d.job_id)) : null]);
}

function gangMark(gang) {
  return el("span", {className: "muted gang", dataset: {gangJob: gang.job_id, nodeRank: gang.node_rank},
    title: "This job spans several workers; node 0 runs its rendezvous and reports its steps"},
  ` (node ${gang.node_rank} of ${gang.hosts} hosts)`);
}

function teamsTable(teams) {
  const rows = teams.flatMap((team) =>
    Object.entries(team.pools).map(([pool, usage]) => ({team, pool, usage})));
  return table([
    {title: "team", cell: (r) => r.team.team},
    {title: "weight", className: "num", cell: (r) => number(r.team.weight)},
    {title: "pool", cell: (r) => r.pool},
    {title: "GPUs held / quota", className: "num",
      cell: (r) => `${r.usage.held_gpus} / ${r.usage.quota ?? "no quota"}`},
    {title: "fair share (GPUs)", className: "num", cell: (r) => number(r.usage.fair_share, 2),
      help: "The GPUs of the pool that the team's weight entitles it to while it has jobs there"},
    {title: "recent use (avg GPUs)", className: "num", cell: (r) => number(r.usage.recent_gpus, 2),
      help: "GPUs the team held in this pool, averaged over the past with older use counting less "
        + "(the fair-share half-life): the scheduler weighs it with the GPUs held now"},
    {title: "waiting", className: "num", cell: (r) => r.usage.waiting},
  ], rows, {empty: "No team uses a pool yet."});
}

// GPUs x hours held in the window, summed over every stretch a job of the team held them.
function usageTable(usage) {
  return table([
    {title: "team", cell: (u) => u.team},
    {title: "pool", cell: (u) => u.pool},
    {title: "GPU-hours", className: "num", cell: (u) => number(u.gpu_hours, 3)},
    {title: "GPU-seconds", className: "num", cell: (u) => String(Math.round(u.gpu_seconds))},
  ], usage.items, {empty: "No GPU use in this window that this key may see.",
    rowProps: (u) => ({dataset: {team: u.team, pool: u.pool}})});
}

// Each team's GPU-hour budget in its current calendar period (UTC) and what is left: at none
// left, the scheduler pauses the team's jobs and the service refuses new ones until it renews.
function budgetsTable(budgets) {
  return table([
    {title: "team", cell: (b) => b.team},
    {title: "period", cell: (b) => b.period},
    {title: "budget (GPU-hours)", className: "num",
      cell: (b) => (b.gpu_hours_budget === null ? "no budget" : number(b.gpu_hours_budget, 3))},
    {title: "used", className: "num", cell: (b) => number(b.used_gpu_hours, 3)},
    {title: "left", className: "num", cell: (b) => number(b.left_gpu_hours, 3),
      help: "At 0 the team's jobs are paused and new ones refused until the period renews or an admin "
        + "raises the budget"},
    {title: "renews", cell: (b) => time(b.period_end)},
  ], budgets, {empty: "No team this key may see.",
    rowProps: (b) => ({dataset: {budgetTeam: b.team, left: b.left_gpu_hours ?? ""}})});
}

function runningTable(running) {
  return table([
    {title: "job", cell: (j) => jobLink(j.job_id)},
    {title: "team", cell: (j) => j.team || "–"},
    {title: "pool", cell: (j) => j.pool},
    {title: "GPUs", className: "num", cell: (j) => j.gpus},
    {title: "priority", cell: (j) => j.priority},
    {title: "status", cell: (j) => [statusBadge(j.status), j.preempt_requested ? " preempting" : null]},
    {title: "workers [devices]", cell: (j) => placement(j.placement) || "–",
      help: "Every worker the job holds devices on: several for a job larger than any one worker"},
  ], running, {empty: "No job is running that this key may see.",
    rowProps: (j) => ({dataset: {jobId: j.job_id}})});
}

function queueView(queue) {
  const counts = Object.entries(queue.waiting).map(([pool, n]) => `${pool}: ${n}`).join(", ") || "none";
  const pass = queue.scheduler_pass_at ? `${age(queue.scheduler_pass_at)} ago`
    : "never: is a scheduler running?";
  return [
    el("p", {className: "muted"}, `Waiting in all (every team): ${counts}. Scheduler's last pass: ${pass}.`),
    table([
      {title: "position", className: "num", cell: (q) => q.position},
      {title: "job", cell: (q) => jobLink(q.job_id, `#${q.job_id} ${q.name}`)},
      {title: "team", cell: (q) => q.team || "–"},
      {title: "pool", cell: (q) => q.pool},
      {title: "GPUs", className: "num", cell: (q) => q.gpus},
      {title: "priority", cell: (q) => q.priority},
      {title: "why it waits", cell: (q) => whyItWaits(q.pending_reason)},
    ], queue.items, {empty: "No job is waiting that this key may see.",
      rowProps: (q) => ({dataset: {jobId: q.job_id}})}),
  ];
}

function whyItWaits(reason) {
  if (!reason) return "–";
  const meaning = reasonText(reason);
  return [el("code", {}, reason), meaning ? el("div", {className: "muted explanation"}, meaning) : null];
}
