// Exponential smoothing of a chart's noisy series, as TensorBoard draws it: the smoothed line over
// the raw one kept faint. The weight w (0: none, up to 0.99) is TensorBoard's debiased EMA:
//   last = w·last + (1 − w)·value,   smoothed = last / (1 − w^n)   (n: the values seen so far)
// The division undoes the pull towards the 0 the average starts from, so the first point is the
// first value and a short series is not dragged down. A missing value (null) stays missing and
// leaves the average as it was. Pure functions (no DOM) except the control and its storage, so
// `node --test tests/dashboard_js/` checks them without a browser.

const STORAGE_KEY = "grpo.smoothing"; // per tab, like the API key: a choice for this look at the runs
export const DEFAULT_WEIGHT = 0.6; // TensorBoard's default
export const MAX_WEIGHT = 0.99;

// Feeds one value at a time, so a chart extended by a stream carries on where it stopped.
export class Ema {
  constructor(weight) {
    this.weight = weight;
    this.last = 0;
    this.count = 0;
  }

  next(value) {
    if (typeof value !== "number" || !Number.isFinite(value)) return null;
    if (this.weight === 0) return value;
    this.last = this.weight * this.last + (1 - this.weight) * value;
    this.count += 1;
    return this.last / (1 - this.weight ** this.count);
  }
}

export function smooth(values, weight) {
  const ema = new Ema(weight);
  return values.map((value) => ema.next(value));
}

// A weight as stored or typed: a number in [0, MAX_WEIGHT], anything else the default.
export function validWeight(value) {
  const weight = Number(value);
  return value !== null && value !== "" && Number.isFinite(weight) && weight >= 0 && weight <= MAX_WEIGHT
    ? weight : DEFAULT_WEIGHT;
}

export function storedWeight() {
  return validWeight(sessionStorage.getItem(STORAGE_KEY));
}

// A "Smoothing" slider with its value beside it; a change is stored for the tab and handed on.
export function smoothingControl(onChange) {
  const weight = storedWeight();
  const shown = document.createElement("output");
  shown.textContent = weight.toFixed(2);
  const slider = Object.assign(document.createElement("input"), {type: "range", min: "0",
    max: String(MAX_WEIGHT), step: "0.01", value: String(weight),
    title: "Exponential moving average of each series (TensorBoard's, debiased); the raw line stays faint behind"});
  slider.dataset.smoothing = "weight";
  slider.addEventListener("input", () => {
    const chosen = validWeight(slider.value);
    shown.textContent = chosen.toFixed(2);
    sessionStorage.setItem(STORAGE_KEY, String(chosen));
    onChange(chosen);
  });
  const label = document.createElement("label");
  label.append("Smoothing ", slider, " ", shown);
  return label;
}
