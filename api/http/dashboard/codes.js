// What each code a job shows means, in words: the service's one table (GET /v1/codes), fetched
// once per page load. Until it arrives, or if it cannot, a code is shown alone.

import {fetchOnce} from "./api.js";
import {el} from "./dom.js";

let codes = {pending_reasons: {}, error_codes: {}};

export async function loadCodes() {
  codes = await fetchOnce("/v1/codes");
}

export const reasonText = (code) => (code && codes.pending_reasons[code]) || "";
export const errorText = (code) => (code && codes.error_codes[code]) || "";

// A code as a term whose meaning shows on hover: for cells too narrow for the sentence.
export function codeTerm(code, meaning) {
  return el("abbr", {className: "code", title: meaning || null, dataset: {code}}, code);
}
