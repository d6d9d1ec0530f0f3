// Talking to the service: the API key (kept in sessionStorage, so it leaves with the tab), JSON
// requests with `Authorization: Bearer`, the service's error shape, and opening a job's stream.

const KEY_NAME = "grpo.apiKey";
let unauthorized = () => {};

export class ApiError extends Error {
  constructor(status, body) {
    const error = body && body.error ? body.error : {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || "http_error";
    this.param = error.param || null;
    // One {param, message} per invalid field; the service lists them only when there are several.
    this.fields = error.errors || (error.param ? [{param: error.param, message: error.message}] : []);
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY_NAME);
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_NAME, key);
  else sessionStorage.removeItem(KEY_NAME);
}

// Called with the service's message whenever it answers 401 (the app shows the login page).
export function onUnauthorized(handler) {
  unauthorized = handler;
}

function withQuery(path, query) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query || {})) {
    for (const item of Array.isArray(value) ? value : [value]) {
      if (item !== undefined && item !== null) params.append(name, String(item));
    }
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

// api("/v1/jobs", {query: {status: ["queued"]}}) -> parsed JSON; throws ApiError. `body` goes as
// JSON; `text` with `contentType` goes as it is (a YAML spec).
export async function api(path, {method = "GET", body, text, contentType, query} = {}) {
  const headers = authHeaders();
  let payload;
  if (text !== undefined) {
    headers["Content-Type"] = contentType;
    payload = text;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const response = await fetch(withQuery(path, query), {method, headers, body: payload});
  const parsed = await response.json().catch(() => null);
  if (response.ok) return parsed;
  throw refusal(response.status, parsed);
}

export function authHeaders() {
  const headers = {Accept: "application/json"};
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

// The error for a refused request; a 401 also tells the app (which shows the login page).
export function refusal(status, body) {
  const error = new ApiError(status, body);
  if (status === 401) unauthorized(error.message);
  return error;
}

// POST a multipart form (an upload to /v1/files), reporting progress as onProgress(sent, total):
// fetch cannot tell how much of a request body has gone, XMLHttpRequest can. Resolves to the
// parsed answer; rejects with an ApiError, of status 0 when no answer came (the connection
// failed, or the service closed it, as it may mid-body for a file over its size limit).
export function upload(path, form, onProgress) {
  return new Promise((resolve, reject) => {
    const request = new XMLHttpRequest();
    request.open("POST", path);
    for (const [name, value] of Object.entries(authHeaders())) request.setRequestHeader(name, value);
    request.upload.addEventListener("progress", (event) =>
      onProgress(event.loaded, event.lengthComputable ? event.total : null));
    request.addEventListener("load", () => {
      let parsed = null;
      try {
        parsed = JSON.parse(request.responseText);
      } catch {
        parsed = null;
      }
      if (request.status >= 200 && request.status < 300) resolve(parsed);
      else reject(refusal(request.status, parsed));
    });
    request.addEventListener("error", () => reject(new ApiError(0, {error: {code: "connection_failed",
      message: "The connection closed before the service answered: the service is unreachable, or it " +
        "refused a file over its size limit part-way."}})));
    request.send(form);
  });
}

// A table the page reads once per load (api("/v1/codes"), say): the first call asks, later ones
// share its answer; after a failure the next call asks again.
export function fetchOnce(path) {
  const cached = fetched.get(path);
  if (cached) return cached;
  const asking = api(path).catch((error) => {
    fetched.delete(path);
    throw error;
  });
  fetched.set(path, asking);
  return asking;
}
const fetched = new Map();

// Browsers cannot set headers on a WebSocket, and a key in its URL would land in access logs: the
// socket is opened with a single-use ticket (valid 30 s) offered as a subprotocol instead.
export const KEY_REVOKED_CLOSE = 4401;

export async function openStream(jobId, after, afterEvent) {
  const {ticket} = await api("/v1/stream-tickets", {method: "POST"});
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const query = withQuery(`/v1/jobs/${jobId}/stream`, {after, after_event: afterEvent});
  return new WebSocket(`${scheme}//${location.host}${query}`, ["grpo.v1", `grpo.ticket.${ticket}`]);
}

// The service closed a stream because the key was revoked: as a 401 would.
export function keyRevoked() {
  unauthorized("API key revoked");
}

// Every page of a cursor-paged list (`after` / `next_after`), concatenated.
export async function allPages(path, query, cursor = "after", isLive = () => true) {
  const items = [];
  let after = query[cursor] || 0;
  while (after !== null && isLive()) {
    const page = await api(path, {query: {...query, [cursor]: after}});
    items.push(...page.items);
    after = page.next_after;
  }
  return items;
}

// Save the file at `path` (a model's tar) under `filename`. A link cannot carry the key in a
// header, so the file is fetched with it and handed to the browser as a blob.
export async function download(path, filename) {
  const response = await fetch(path, {headers: authHeaders()});
  if (!response.ok) throw refusal(response.status, await response.json().catch(() => null));
  const url = URL.createObjectURL(await response.blob());
  const link = Object.assign(document.createElement("a"), {href: url, download: filename});
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}
