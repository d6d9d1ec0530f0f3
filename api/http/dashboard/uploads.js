// The submit form's uploads: send a dataset (JSONL, JSON, CSV, Parquet) or a model (a tar or
// tar.gz of a Hugging Face folder) to POST /v1/files with its progress shown, then put the
// answer's `file:ID` into the spec as model.source or dataset.source (spec_source.js). Below, the
// team's files (GET /v1/files, newest first) with the same button and Delete. The service checks
// an upload whole before it answers: a bad row or archive member is a 422 naming it, a file over
// its purpose's limit a 413; both are shown as the service words them.

import {api, upload} from "./api.js";
import {el, fill, statusBadge, table} from "./dom.js";
import {bytes, time} from "./format.js";
import {withSource} from "./spec_source.js";

const LISTED = 50;  // one page: the newest files, enough to pick from while writing a spec

// Where each purpose goes in a spec (a model also fits a reward_model or eval; those are typed by hand).
const SECTION = {dataset: "dataset", model: "model"};

// A tar (gzipped or not) is a model; anything else is taken for a dataset until the user says.
export function guessPurpose(filename) {
  return /\.(tar|tar\.gz|tgz)$/i.test(filename) ? "model" : "dataset";
}

export function mountUploads(container, specField) {
  const picker = el("input", {type: "file", name: "upload-file"});
  const purpose = el("select", {name: "purpose"},
    el("option", {value: "dataset"}, "dataset"), el("option", {value: "model"}, "model (.tar, .tar.gz)"));
  const send = el("button", {type: "button", dataset: {action: "upload"}, onclick: () => start()}, "Upload");
  const bar = el("progress", {className: "upload-progress", max: 1, value: 0, hidden: true});
  const sent = el("span", {className: "muted upload-sent"});
  const result = el("div", {className: "upload-result", role: "status"});
  const listed = el("div", {className: "file-list"});
  picker.addEventListener("change", () => {
    if (picker.files.length) purpose.value = guessPurpose(picker.files[0].name);
  });
  container.append(el("details", {className: "uploads", dataset: {part: "uploads"}},
    el("summary", {}, "Upload a dataset or a model (used in the spec as file:ID)"),
    el("div", {className: "toolbar"}, picker, el("label", {}, "Purpose ", purpose), send, bar, sent),
    result, listed));
  refresh();

  async function start() {
    fill(result);
    const file = picker.files[0];
    if (!file) {
      result.append(el("p", {className: "notice error"}, "Pick a file first."));
      return;
    }
    const form = new FormData();
    // The purpose goes first: the service holds the file to that purpose's limit as it streams in.
    form.append("purpose", purpose.value);
    form.append("file", file, file.name);
    send.disabled = true;
    bar.hidden = false;
    const progress = (done, total) => {
      bar.value = total ? done / total : 0;
      fill(sent, total ? `${bytes(done)} of ${bytes(total)}` : bytes(done));
    };
    progress(0, file.size);
    try {
      const stored = await upload("/v1/files", form, progress);
      fill(sent, "checked and stored");
      result.append(el("p", {className: "notice info", dataset: {fileId: stored.id}}, "Uploaded ",
        el("code", {}, stored.filename), " as ", el("code", {className: "file-id"}, stored.id),
        ` (${bytes(stored.bytes)}). `, useButton(stored)));
      picker.value = "";
      refresh();
    } catch (error) {
      bar.hidden = true;
      fill(sent);
      result.append(refusal(error));
    } finally {
      send.disabled = false;
    }
  }

  // Puts `file:ID` into the spec where the file's purpose belongs, saying what it did.
  function useButton(file) {
    const section = SECTION[file.purpose];
    const use = () => {
      fill(result);
      const changed = withSource(specField.value, section, `file:${file.id}`);
      if (changed.problem) {
        result.append(el("p", {className: "notice error"}, changed.problem));
        return;
      }
      specField.value = changed.text;
      result.append(el("p", {className: "notice info"}, "The spec's ", el("code", {}, `${section}.source`),
        " is now ", el("code", {}, `file:${file.id}`), "."));
    };
    return el("button", {type: "button", dataset: {action: "use", fileId: file.id},
      disabled: file.status !== "ready", onclick: use}, `Use as ${section}.source`);
  }

  function deleteButton(file) {
    const remove = async (event) => {
      if (!window.confirm(`Delete ${file.filename} (${file.id})? Jobs can no longer use it.`)) return;
      event.target.disabled = true;
      fill(result);
      try {
        await api(`/v1/files/${file.id}`, {method: "DELETE"});
        refresh();
      } catch (error) {  // 409: a job that has not finished names it
        result.append(refusal(error));
        event.target.disabled = false;
      }
    };
    return el("button", {type: "button", className: "danger", dataset: {action: "delete", fileId: file.id},
      onclick: remove}, "Delete");
  }

  async function refresh() {
    let page;
    try {
      page = await api("/v1/files", {query: {limit: LISTED}});
    } catch (error) {
      fill(listed, el("p", {className: "notice error"},
        `The team's files could not be read: ${error.message}`));
      return;
    }
    fill(listed, table([
      {title: "id", cell: (file) => el("code", {}, file.id)},
      {title: "file", className: "text", cell: (file) => file.filename},
      {title: "purpose", cell: (file) => file.purpose},
      {title: "size", className: "num", cell: (file) => bytes(file.bytes)},
      {title: "status", cell: (file) => statusBadge(file.status)},
      {title: "uploaded", cell: (file) => time(file.created_at)},
      {title: "", cell: (file) => el("span", {className: "toolbar"}, useButton(file), deleteButton(file))},
    ], page.items, {empty: "no files yet", rowProps: (file) => ({dataset: {fileId: file.id}})}),
    page.next_after ? el("p", {className: "muted"}, `The newest ${LISTED} are shown.`) : null);
  }
}

// The service's refusal, plainly: what it said, and which field or row (its `param`).
function refusal(error) {
  const what = {413: "The file is too large", 422: "The service refused the file", 409: "The service refused",
    0: "The upload failed"}[error.status] || `The request failed (${error.status})`;
  return el("div", {className: "notice error", dataset: {status: error.status}},
    el("p", {}, `${what} (${error.code}):`),
    el("ul", {className: "field-errors"}, (error.fields.length ? error.fields : [{message: error.message}])
      .map((field) => el("li", {dataset: {param: field.param || ""}},
        field.param ? [el("code", {}, field.param), " "] : null, field.message))));
}
