// #/login: paste a team API key. It is kept in sessionStorage for this tab only and sent as a
// bearer token; the service says whether it is valid (GET /v1/me).

import {el, notice} from "./dom.js";

export function mount(container, _params, {signIn, message}) {
  const status = notice(message === "Logged out." ? "info" : "error");
  status.set(message);
  const input = el("input", {type: "password", name: "key", autocomplete: "off", required: true,
    placeholder: "grpo_…", size: 48});
  const button = el("button", {type: "submit"}, "Log in");
  const form = el("form", {className: "login", onsubmit: async (event) => {
    event.preventDefault();
    button.disabled = true;
    try {
      await signIn(input.value.trim());
    } catch (error) {
      if (error.status !== 401) status.set(error.message);
    } finally {
      button.disabled = false;
    }
  }}, el("label", {}, "API key ", input), button);
  container.append(el("section", {className: "panel narrow"}, el("h2", {}, "Log in"),
    el("p", {className: "muted"}, "Paste an API key of your team (from `grpo admin create-key TEAM`)."),
    status.node, form));
  input.focus();
}
