// The dashboard's smoothing (api/http/dashboard/smoothing.js) against values worked out by hand
// from TensorBoard's debiased EMA: last = w·last + (1 − w)·x, smoothed = last / (1 − w^n).
// Run by `node --test tests/dashboard_js/` (tests/test_dashboard_js.py does, under pytest).

import assert from "node:assert/strict";
import {test} from "node:test";

import {DEFAULT_WEIGHT, Ema, smooth, validWeight} from "../../api/http/dashboard/smoothing.js";

const close = (actual, expected) => {
  assert.equal(actual.length, expected.length);
  actual.forEach((value, i) => {
    if (expected[i] === null) assert.equal(value, null, `point ${i}`);
    else assert.ok(Math.abs(value - expected[i]) < 1e-12, `point ${i}: ${value} != ${expected[i]}`);
  });
};

test("w = 0.5 over 1, 2, 3: 0.5/0.5, 1.25/0.75, 2.125/0.875", () => {
  close(smooth([1, 2, 3], 0.5), [1, 5 / 3, 17 / 7]);
});

test("the first point is the first value, whatever the weight (the debiasing)", () => {
  for (const weight of [0.1, 0.6, 0.99]) assert.ok(Math.abs(smooth([4, 0], weight)[0] - 4) < 1e-12);
});

test("a missing value stays missing and leaves the average as it was", () => {
  // 1 -> 1; null skipped; 3: last = 0.5·0.5 + 0.5·3 = 1.75, n = 2, 1.75 / 0.75 = 7/3
  close(smooth([1, null, 3], 0.5), [1, null, 7 / 3]);
  close(smooth([NaN, 2], 0.5), [null, 2]);
});

test("weight 0 is the raw series; a constant series stays constant", () => {
  assert.deepEqual(smooth([3, -1, 7], 0), [3, -1, 7]);
  close(smooth([2, 2, 2, 2], 0.9), [2, 2, 2, 2]);
});

test("fed a value at a time it continues a series where it stopped", () => {
  const ema = new Ema(0.5);
  const parts = [...[1, 2].map((x) => ema.next(x)), ...[3].map((x) => ema.next(x))];
  close(parts, smooth([1, 2, 3], 0.5));
});

test("a stored or typed weight outside [0, 0.99] is the default", () => {
  assert.equal(validWeight("0"), 0);
  assert.equal(validWeight("0.8"), 0.8);
  for (const bad of [null, "", "1", "-0.1", "abc"]) assert.equal(validWeight(bad), DEFAULT_WEIGHT, String(bad));
});
