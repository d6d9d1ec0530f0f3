// #/compare?ids=1,2: jobs side by side (GET /v1/jobs/compare). One metric at a time, picked from
// those any of the jobs recorded, drawn as a line per job; then the spec fields whose values
// differ between them, as the server computed them within its byte budget (a field a spec lacks
// shows as "–"; a note counts the differences the budget left out).

import {api} from "./api.js";
import {plotSeries} from "./charts.js";
import {el, fill, jobLink, notice, section, statusBadge, table} from "./dom.js";
import {valueText} from "./format.js";
import {smoothingControl, storedWeight} from "./smoothing.js";

const DEFAULT_METRIC = "reward";

export function mount(container, {ids}) {
  let alive = true;
  let latest = 0; // only the newest answer is drawn when the picker changes quickly
  const errors = notice();
  const picker = el("select", {dataset: {metricPicker: "metric"}, onchange: () => load(picker.value)});
  const chart = el("div", {className: "chart", dataset: {chart: "compare"}});
  const jobsBox = el("div");
  const diffBox = el("div");
  container.append(
    section("compare", `Compare ${ids.length} jobs`, jobsBox,
      el("div", {className: "toolbar"}, el("label", {}, "Metric ", picker), smoothingControl(redraw)),
      errors.node, chart),
    section("spec-diff", "Spec differences", diffBox));

  let drawn = null; // the metric on the chart and its series, drawn again when the smoothing changes
  async function redraw(weight) {
    if (alive && drawn) await plotSeries(chart, drawn.metric, drawn.series, weight);
  }

  async function load(metric) {
    const ticket = ++latest;
    try {
      const view = await api("/v1/jobs/compare", {query: {ids: ids.join(","), metrics: metric}});
      if (!alive || ticket !== latest) return;
      errors.set("");
      fill(picker, [...new Set([metric, ...view.metric_names])].sort()
        .map((name) => el("option", {value: name}, name)));
      picker.value = metric;
      fill(jobsBox, jobsTable(view.jobs));
      fill(diffBox, diffTable(view.jobs, view.spec_diff), omittedNote(view.spec_diff_omitted));
      const byJob = view.metrics[metric] || {};
      const series = view.jobs.map((job) => ({name: `#${job.id} ${job.name}`, points: byJob[job.id] || []}));
      drawn = {metric, series};
      await redraw(storedWeight());
    } catch (error) {
      if (alive && ticket === latest) errors.set(`Could not compare jobs ${ids.join(", ")}: ${error.message}`);
    }
  }

  load(DEFAULT_METRIC);
  return () => {
    alive = false;
    Plotly.purge(chart);
  };
}

function jobsTable(jobs) {
  return table([
    {title: "id", cell: (job) => jobLink(job.id)},
    {title: "name", cell: (job) => jobLink(job.id, job.name)},
    {title: "status", cell: (job) => statusBadge(job.status)},
  ], jobs, {rowProps: (job) => ({dataset: {jobId: job.id}})});
}

function diffTable(jobs, differences) {
  return table([
    {title: "field", cell: (row) => el("code", {}, row.field)},
    ...jobs.map((job) => ({title: `#${job.id} ${job.name}`, cell: (row) => valueText(row.values[job.id])})),
  ], differences, {empty: "The specs do not differ.", rowProps: (row) => ({dataset: {field: row.field}})});
}

// The server keeps the differences within GRPO_COMPARE_DIFF_BYTES and counts the ones it left out.
function omittedNote(omitted) {
  return omitted ? el("p", {className: "hint", dataset: {specDiffOmitted: omitted}},
    `${omitted} more differing field(s) left out to keep the answer small.`) : null;
}
