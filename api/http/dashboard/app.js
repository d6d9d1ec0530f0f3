// The dashboard's shell: hash routes (#/jobs, #/jobs/42, #/compare?ids=1,2, #/cluster, #/login), the header with
// the signed-in team and a logout, and mounting one page at a time. A page is
// `mount(container, params) -> cleanup`; its container is dropped when the route changes, so a
// late answer meant for an old page lands in a detached node, never on the new one.

import {apiKey, onUnauthorized, setApiKey} from "./api.js";
import {loadCodes} from "./codes.js";
import {loadLifecycle} from "./lifecycle.js";
import {el, fill} from "./dom.js";
import * as cluster from "./cluster.js";
import * as compare from "./compare.js";
import * as job from "./job.js";
import * as jobs from "./jobs.js";
import * as login from "./login.js";
import {currentUser, loadMe, resetSession} from "./session.js";

const ROUTES = [
  [/^#\/login$/, login],
  [/^#\/jobs$/, jobs],
  [/^#\/jobs\/(\d+)$/, job, (match) => ({id: Number(match[1])})],
  [/^#\/compare\?ids=(\d+(?:,\d+)*)$/, compare, (match) => ({ids: match[1].split(",").map(Number)})],
  [/^#\/cluster$/, cluster],
];
const main = document.querySelector("main");
const who = document.querySelector("#who");
let cleanup = null;
let returnTo = "#/jobs";

function route() {
  for (const [pattern, page, params] of ROUTES) {
    const match = location.hash.match(pattern);
    if (match) return {page, params: params ? params(match) : {}};
  }
  return null;
}

function unmount() {
  if (cleanup) cleanup();
  cleanup = null;
  fill(main);
}

let renders = 0;
async function render() {
  const found = route();
  if (!found) {
    location.replace("#/jobs");
    return;
  }
  const ticket = ++renders; // a newer route wins over one still waiting for /v1/me
  unmount();
  if (found.page !== login && !currentUser()) {
    try {
      await loadMe();
    } catch (error) {
      if (error.status !== 401 && ticket === renders) showBootError(error);
      return; // a 401 has already sent us to the login page
    }
    if (ticket !== renders) return;
  }
  if (found.page !== login) {
    try {
      // Fetched once each; without the codes a code is shown alone, but the pages need the lifecycle.
      await Promise.all([loadCodes().catch(() => {}), loadLifecycle()]);
    } catch (error) {
      if (error.status !== 401 && ticket === renders) showBootError(error);
      return;
    }
    if (ticket !== renders) return;
  }
  showWho();
  markNav();
  const container = main.appendChild(el("div", {className: "page"}));
  cleanup = found.page.mount(container, found.params, {signIn, message: takeLoginMessage()}) || null;
}

function showBootError(error) {
  main.append(el("p", {className: "notice error"}, `The service did not answer: ${error.message}`));
}

function showWho() {
  const me = currentUser();
  fill(who);
  if (!me) return;
  const role = me.is_admin ? "admin" : "member";
  who.append(el("span", {className: "team", dataset: {team: me.team}}, `${me.team} (${role})`));
  if (apiKey()) who.append(el("button", {type: "button", className: "link", onclick: logout}, "Log out"));
  else who.append(el("span", {className: "muted"}, " · no login needed"));
}

function markNav() {
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", location.hash.startsWith(link.getAttribute("href")));
  }
}

let loginMessage = "";
function takeLoginMessage() {
  const text = loginMessage;
  loginMessage = "";
  return text;
}

function forget() {
  setApiKey(null);
  resetSession();
  showWho();
}

function toLogin(message) {
  unmount();
  forget();
  loginMessage = message;
  if (location.hash === "#/login") render();
  else location.hash = "#/login";
}

function logout() {
  returnTo = "#/jobs";
  toLogin("Logged out.");
}

// The login page hands over a key: everything the previous key was shown is dropped first.
async function signIn(key) {
  forget();
  setApiKey(key);
  await loadMe(); // a 401 comes back through onUnauthorized with the service's message
  location.hash = returnTo === "#/login" ? "#/jobs" : returnTo;
}

onUnauthorized((message) => {
  if (location.hash !== "#/login") returnTo = location.hash || "#/jobs";
  toLogin(apiKey() ? message : ""); // no key yet is no error: just the login page
});
window.addEventListener("hashchange", render);
render();
