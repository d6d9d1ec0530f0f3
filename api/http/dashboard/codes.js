// What each code a job shows means, in words: the service's one table (GET /v1/codes), fetched
// once per page load. Until it arrives, or if it cannot, a code is shown alone.

import {fetchOnce} from "./api.js";
import {el} from "./dom.js";

let codes = {pending_reasons: {}, error_codes: {}, alert_rules: {}};

export async function loadCodes() {
  codes = await fetchOnce("/v1/codes");
}

export const reasonText = (code) => (code && codes.pending_reasons[code]) || "";
export const errorText = (code) => (code && codes.error_codes[code]) || "";
export const alertText = (rule) => (rule && (codes.alert_rules || {})[rule]) || "";

// A code as a term whose meaning shows on hover: for cells too narrow for the sentence.
export function codeTerm(code, meaning) {
  return el("abbr", {className: "code", title: meaning || null, dataset: {code}}, code);
}

// The health rules that tripped (a job's `alerts`, the latest trip of each): a badge each, what the
// rule watches on hover.
export function alertBadges(job) {
  return (job.alerts || []).map((alert) => el("span", {className: `badge alert alert-${alert.action}`,
    dataset: {alert: alert.rule}, title: `${alert.rule} (${alert.action}) at step ${alert.step}: ` +
      alertText(alert.rule)}, `⚠ ${alert.rule}`));
}
