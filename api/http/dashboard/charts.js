// The job page's training charts (Plotly.js, served by the API from the `plotly` package). Records
// (one per optimizer step, docs/architecture.md §5 names) are buffered and drawn in batches with
// Plotly.extendTraces, so a long backlog or a fast stream costs one redraw per flush, not per step.

const FLUSH_MS = 250;
const REWARD_FN = /^rewards\/(.+)\/mean$/;

// Each chart: the metrics it plots, one trace each; `band` draws mean ± std as a shaded area.
// `metrics` may be a function of the first record (the reward functions are only known then).
// `fromZero` keeps 0 on the axis: a constant learning rate or clip ratio then reads as what it is.
export const CHARTS = [
  {id: "reward", title: "reward (± std)", band: {mean: "reward", std: "reward_std"}},
  {id: "rewards", title: "reward per function (mean)",
    metrics: (record) => Object.keys(record).filter((name) => REWARD_FN.test(name)).sort()},
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

const stepAxis = (dtick) => ({tickmode: "linear", tick0: 0, dtick, tickformat: "d"});

const value = (record, name) => (typeof record[name] === "number" ? record[name] : null);
const label = (name) => name.match(REWARD_FN)?.[1] || name.split("/").at(-1);

// One trace per series: {name, y: record -> number | null} plus Plotly trace options.
function seriesOf(chart, first) {
  if (chart.band) {
    const {mean, std} = chart.band;
    const edge = (sign) => (r) => {
      const center = value(r, mean);
      return center === null ? null : center + sign * (value(r, std) || 0);
    };
    const hidden = {line: {width: 0}, showlegend: false, hoverinfo: "skip", mode: "lines"};
    return [
      {name: `${mean} + std`, y: edge(1), ...hidden},
      {name: `${mean} - std`, y: edge(-1), ...hidden, fill: "tonexty", fillcolor: "rgba(31,119,180,0.2)"},
      {name: mean, y: (r) => value(r, mean), mode: "lines", line: {color: "rgb(31,119,180)"}},
    ];
  }
  const names = typeof chart.metrics === "function" ? chart.metrics(first) : chart.metrics;
  return names.map((name) => ({name: label(name), y: (r) => value(r, name), mode: "lines"}));
}

export class ChartSet {
  constructor(container) {
    this.container = container;
    this.placeholder = container.appendChild(document.createElement("p"));
    this.placeholder.className = "muted";
    this.placeholder.textContent = "No step yet: the charts start with the job's first optimizer step.";
    this.pending = [];
    this.timer = null;
    this.charts = null; // [{div, series}] once the first records came
    this.drawing = Promise.resolve();
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
    if (this.charts === null) {
      this.placeholder.remove();
      this.tick = tick;
      this.charts = await Promise.all(CHARTS.map((chart) => this.create(chart, records)));
      return;
    }
    const steps = records.map((r) => r.step);
    await Promise.all(this.charts.map(({div, series}) => series.length && Plotly.extendTraces(div,
      {x: series.map(() => steps), y: series.map((s) => records.map(s.y))}, series.map((_, i) => i))));
    if (tick !== this.tick) { // the run grew past what the ticks were spaced for
      this.tick = tick;
      await Promise.all(this.charts.map(({div}) => Plotly.relayout(div, {"xaxis.dtick": tick})));
    }
  }

  async create(chart, records) {
    const div = document.createElement("div");
    div.className = "chart";
    div.dataset.chart = chart.id;
    this.container.append(div);
    const series = seriesOf(chart, records[0]);
    const traces = series.map(({y, ...options}) => ({...options, type: "scatter",
      x: records.map((r) => r.step), y: records.map(y)}));
    const layout = {...LAYOUT, title: {text: chart.title, font: {size: 13}},
      showlegend: traces.filter((trace) => trace.showlegend !== false).length > 1,
      xaxis: stepAxis(this.tick), yaxis: {...LAYOUT.yaxis, rangemode: chart.fromZero ? "tozero" : "normal"}};
    await Plotly.newPlot(div, traces, layout, CONFIG);
    return {div, series};
  }

  destroy() {
    this.destroyed = true;
    clearTimeout(this.timer);
    this.pending = [];
    for (const {div} of this.charts || []) Plotly.purge(div);
  }
}

// One chart of whole series drawn at once (the compare page: a line per job), styled and
// step-ticked like the job page's. series: [{name, points: [[step, value], ...]}].
export async function plotSeries(div, title, series) {
  const lastStep = Math.max(1, ...series.flatMap(({points}) => points.map(([step]) => step)));
  const traces = series.map(({name, points}) => ({name, type: "scatter", mode: "lines+markers",
    marker: {size: 4}, x: points.map(([step]) => step), y: points.map(([, y]) => y)}));
  const layout = {...LAYOUT, height: 360, title: {text: title, font: {size: 13}}, showlegend: true,
    xaxis: stepAxis(stepTick(lastStep))};
  await Plotly.react(div, traces, layout, CONFIG);
}
