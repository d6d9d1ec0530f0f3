// The job page's training and eval charts (Plotly.js, served by the API from the `plotly` package).
// Records (one per optimizer step, docs/architecture.md §5 names; step 0 holds only the evaluation
// before training) are buffered and drawn in batches with Plotly.extendTraces, so a long backlog or
// a fast stream costs one redraw per flush, not per step. A chart appears with the first record that
// has one of its metrics and takes only such records: the eval charts exist only for a job that
// evaluates, and hold its eval points alone (a line through the steps between would break at each).
// Every line is drawn smoothed (smoothing.js, the weight the page's control holds) over its raw
// values kept faint, as TensorBoard does; the ± std band's edges are smoothed alike.

import {Ema, smooth} from "./smoothing.js";

const FLUSH_MS = 250;
const REWARD_FN = /^rewards\/(.+)\/mean$/;
const EVAL_REWARD_FN = /^eval_rewards\/(.+)\/mean$/;
const EVAL_COLOR = "214,39,40"; // eval lines in red, beside training's blue reward
// Plotly's own colours, given to each line explicitly: its faint raw copy must wear the same one.
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf"];
const RAW_OPACITY = 0.25;
const RAW_SUFFIX = " (raw)"; // the faint trace's name: its hover says which value it shows

const matching = (pattern) => (record) => Object.keys(record).filter((name) => pattern.test(name)).sort();

// Each chart: the metrics it plots, one trace each; `band` draws mean ± std as a shaded area.
// `metrics` may be a function of a record (the reward functions are only known then).
// `fromZero` keeps 0 on the axis: a constant learning rate or clip ratio then reads as what it is.
// `markers`: the eval charts have a point every eval interval only, each worth seeing.
export const CHARTS = [
  {id: "reward", title: "reward (± std)", band: {mean: "reward", std: "reward_std"}},
  {id: "eval_reward", title: "eval reward (± std)", markers: true,
    band: {mean: "eval_reward", std: "eval_reward_std", color: EVAL_COLOR}},
  {id: "eval_pass", title: "eval pass@k", fromZero: true, markers: true, metrics: ["eval_pass@k"]},
  {id: "eval_length", title: "eval completion length (tokens)", markers: true,
    metrics: ["eval_completions/mean_length", "eval_completions/min_length", "eval_completions/max_length"]},
  {id: "rewards", title: "reward per function (mean)", metrics: matching(REWARD_FN)},
  {id: "eval_rewards", title: "eval reward per function (mean)", markers: true,
    metrics: matching(EVAL_REWARD_FN)},
  {id: "kl", title: "KL", metrics: ["kl"]},
  {id: "clip", title: "clip ratio", fromZero: true,
    metrics: ["clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean"]},
  {id: "length", title: "completion length (tokens)",
    metrics: ["completions/mean_length", "completions/min_length", "completions/max_length"]},
  {id: "entropy", title: "entropy", metrics: ["entropy"]},
  {id: "grad_norm", title: "grad norm", metrics: ["grad_norm"]},
  {id: "learning_rate", title: "learning rate", fromZero: true, metrics: ["learning_rate"]},
  {id: "tokens_per_second", title: "tokens / second", metrics: ["tokens_per_second"]},
];

const LAYOUT = {
  height: 240, margin: {l: 55, r: 10, t: 30, b: 25}, legend: {orientation: "h", y: -0.15, font: {size: 10}},
  yaxis: {exponentformat: "e"}, font: {size: 11}, paper_bgcolor: "rgba(0,0,0,0)",
};
const CONFIG = {displayModeBar: false, responsive: true};

// Steps are whole numbers, so the x axis is ticked at multiples of 1, 2, 5, 10, 20, 50...: the
// smallest that leaves at most about 6 ticks up to the newest step. Left to itself, Plotly ticks
// a short run at 0.5 and labels steps that never happen.
const STEP_TICKS = 6;
function stepTick(lastStep) {
  const rough = Math.max(1, lastStep / STEP_TICKS);
  const power = 10 ** Math.floor(Math.log10(rough));
  return [1, 2, 5, 10].map((m) => m * power).find((tick) => tick >= rough);
}

// Steps are never negative: a lone point at step 0 (an evaluation before training) gets [0, 1],
// not Plotly's [-1, 1]. Points on the edge then keep their whole marker (`cliponaxis: false`).
const stepAxis = (dtick) => ({tickmode: "linear", tick0: 0, dtick, tickformat: "d", rangemode: "nonnegative"});

const value = (record, name) => (typeof record[name] === "number" ? record[name] : null);
const label = (name) => (name.match(REWARD_FN) || name.match(EVAL_REWARD_FN))?.[1] || name.split("/").at(-1);

// One trace per series: {name, y: record -> number | null} plus Plotly trace options; from the
// first of `records` that names any (a chart of reward functions), none when no record does.
function seriesOf(chart, records) {
  const mode = chart.markers ? "lines+markers" : "lines";
  if (chart.band) {
    const {mean, std, color = "31,119,180"} = chart.band;
    const edge = (sign) => (r) => {
      const center = value(r, mean);
      return center === null ? null : center + sign * (value(r, std) || 0);
    };
    const hidden = {line: {width: 0}, showlegend: false, hoverinfo: "skip", mode: "lines"};
    return [
      {name: `${mean} + std`, y: edge(1), ...hidden},
      {name: `${mean} - std`, y: edge(-1), ...hidden, fill: "tonexty", fillcolor: `rgba(${color},0.2)`},
      {name: mean, y: (r) => value(r, mean), mode, line: {color: `rgb(${color})`}},
    ];
  }
  const names = typeof chart.metrics === "function"
    ? records.map(chart.metrics).find((found) => found.length) || []
    : chart.metrics;
  return names.map((name, i) => ({name: label(name), y: (r) => value(r, name), mode,
    line: {color: PALETTE[i % PALETTE.length]}}));
}

// The traces drawing a chart's series: a line is its raw values, faint (shown only while smoothing),
// then the same smoothed; a hidden band edge is smoothed alone. Each trace keeps its raw values
// (`values`) so a new weight can smooth them again, and an EMA that carries on as records come.
function tracesOf(series, weight) {
  return series.flatMap(({y, ...options}) => {
    const smoothed = {y, options: {...options, cliponaxis: false}, values: [], ema: new Ema(weight)};
    if (options.showlegend === false) return [smoothed];
    const raw = {y, raw: true, values: [], options: {...options, name: options.name + RAW_SUFFIX,
      showlegend: false, opacity: RAW_OPACITY, visible: weight > 0, cliponaxis: false}};
    return [raw, smoothed];
  });
}

// A trace's y values for these records, its raw ones kept for a later re-smoothing.
function valuesOf(trace, records) {
  const raw = records.map(trace.y);
  trace.values.push(...raw);
  return trace.raw ? raw : raw.map((v) => trace.ema.next(v));
}

// The records that hold a value for any of a chart's series.
const charted = (series, records) => records.filter((r) => series.some(({y}) => y(r) !== null));

// The layout's shapes and annotations marking each alert: a vertical dashed line at its step across
// the plot (paper y), its rule written at the top.
function alertMarks(alerts) {
  return {
    shapes: alerts.map(({step}) => ({type: "line", xref: "x", yref: "paper", x0: step, x1: step, y0: 0, y1: 1,
      line: {color: "rgb(214,39,40)", width: 1, dash: "dash"}})),
    annotations: alerts.map(({step, rule, action}) => ({x: step, xref: "x", y: 1, yref: "paper", yanchor: "bottom",
      text: rule, hovertext: `${rule} (${action}) at step ${step}`, showarrow: false,
      font: {size: 10, color: "rgb(214,39,40)"}})),
  };
}

export class ChartSet {
  constructor(container, weight) {
    this.container = container;
    this.placeholder = container.appendChild(document.createElement("p"));
    this.placeholder.className = "muted";
    this.placeholder.textContent = "No step yet: the charts start with the job's first optimizer step.";
    this.pending = [];
    this.timer = null;
    this.charts = new Map(); // chart id -> {div, series}, once a record had one of its metrics
    this.tick = null;
    this.weight = weight;
    this.drawing = Promise.resolve();
    this.alerts = []; // {step, rule, action}: a health rule's trip, a marker on every chart
  }

  // A health alert (its event's data): a dashed line at its step on every chart, named by its
  // rule; charts drawn later get it too. In turn with the draws, like them.
  markAlert(alert) {
    if (this.alerts.some((a) => a.step === alert.step && a.rule === alert.rule)) return;
    this.alerts.push({step: alert.step, rule: alert.rule, action: alert.action});
    const marks = alertMarks(this.alerts);
    this.drawing = this.drawing.then(() => Promise.all([...this.charts.values()].map(({div}) =>
      Plotly.relayout(div, marks)))).catch(console.error);
  }

  // A new smoothing weight: every chart's lines are smoothed again from their raw values, in turn
  // with the draws (a batch being drawn is smoothed with the weight it started with, then redone).
  smoothWith(weight) {
    this.weight = weight;
    this.drawing = this.drawing.then(() => Promise.all([...this.charts.values()].map((entry) => {
      const indices = entry.traces.map((_, i) => i);
      for (const trace of entry.traces) if (!trace.raw) trace.ema = new Ema(weight);
      const ys = entry.traces.map((trace) => (trace.raw ? trace.values : trace.values.map((v) => trace.ema.next(v))));
      const visible = entry.traces.map((trace) => (trace.raw ? weight > 0 : true));
      return Plotly.restyle(entry.div, {y: ys, visible}, indices);
    }))).catch(console.error);
    return this.drawing;
  }

  add(records) {
    if (!records.length) return;
    this.pending.push(...records);
    if (this.timer === null) this.timer = setTimeout(() => this.flush(), FLUSH_MS);
  }

  flush() {
    this.timer = null;
    const records = this.pending.splice(0);
    if (records.length) this.drawing = this.drawing.then(() => this.draw(records)).catch(console.error);
  }

  async draw(records) {
    if (this.destroyed) return;
    const tick = stepTick(records.at(-1).step);
    if (this.tick !== null && tick !== this.tick) { // the run grew past what the ticks were spaced for
      const drawn = [...this.charts.values()];
      await Promise.all(drawn.map(({div}) => Plotly.relayout(div, {"xaxis.dtick": tick})));
    }
    this.tick = tick;
    await Promise.all(CHARTS.map((chart) => {
      const shown = this.charts.get(chart.id);
      if (!shown) {
        const series = seriesOf(chart, records);
        const mine = charted(series, records);
        return mine.length ? this.create(chart, series, mine) : null;
      }
      const mine = charted(shown.series, records);
      const steps = mine.map((r) => r.step);
      return mine.length && Plotly.extendTraces(shown.div, {x: shown.traces.map(() => steps),
        y: shown.traces.map((trace) => valuesOf(trace, mine))}, shown.traces.map((_, i) => i));
    }));
  }

  // The chart's div goes before the next one of CHARTS already drawn, so the order stays CHARTS'
  // whichever chart's metrics come first.
  async create(chart, series, records) {
    this.placeholder.remove();
    const div = document.createElement("div");
    div.className = "chart";
    div.dataset.chart = chart.id;
    const later = CHARTS.slice(CHARTS.indexOf(chart) + 1).map((next) => this.charts.get(next.id))
      .find(Boolean);
    this.container.insertBefore(div, later ? later.div : null);
    const entry = {div, series, traces: tracesOf(series, this.weight)};
    this.charts.set(chart.id, entry);
    const traces = entry.traces.map((trace) => ({...trace.options, type: "scatter",
      x: records.map((r) => r.step), y: valuesOf(trace, records)}));
    const layout = {...LAYOUT, title: {text: chart.title, font: {size: 13}},
      showlegend: traces.filter((trace) => trace.showlegend !== false).length > 1,
      xaxis: stepAxis(this.tick), yaxis: {...LAYOUT.yaxis, rangemode: chart.fromZero ? "tozero" : "normal"},
      ...alertMarks(this.alerts)};
    await Plotly.newPlot(div, traces, layout, CONFIG);
    return entry;
  }

  destroy() {
    this.destroyed = true;
    clearTimeout(this.timer);
    this.pending = [];
    for (const {div} of this.charts.values()) Plotly.purge(div);
  }
}

// One chart of whole series drawn at once (the compare page: a line per job), styled, step-ticked
// and smoothed like the job page's. series: [{name, points: [[step, value], ...]}].
export async function plotSeries(div, title, series, weight) {
  const lastStep = Math.max(1, ...series.flatMap(({points}) => points.map(([step]) => step)));
  const traces = series.flatMap(({name, points}, i) => {
    const line = {type: "scatter", mode: "lines+markers", marker: {size: 4}, cliponaxis: false,
      line: {color: PALETTE[i % PALETTE.length]}, x: points.map(([step]) => step)};
    const raw = points.map(([, y]) => y);
    return [{...line, name: name + RAW_SUFFIX, y: raw, showlegend: false, opacity: RAW_OPACITY, visible: weight > 0},
      {...line, name, y: smooth(raw, weight)}];
  });
  const layout = {...LAYOUT, height: 360, title: {text: title, font: {size: 13}}, showlegend: true,
    xaxis: stepAxis(stepTick(lastStep))};
  await Plotly.react(div, traces, layout, CONFIG);
}
