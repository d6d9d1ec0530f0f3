"""A small HTTP/WebSocket client of the service, used by ``grpo``'s service commands (``submit``,
``list``, ``watch``, ``metrics``, ``cluster``, ...: ``api.cli.monitor``).

It speaks only the public API (``/v1/jobs...``, ``/v1/files``, ``/v1/cluster``, ``/v1/queue``,
``/v1/usage`` and the WebSocket ``/v1/jobs/{id}/stream?after=N``), so it works against a remote
deployment exactly as against ``grpo dev``. Listings that the API pages (``next_after``) are read
to the end here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect

from api.domain.lifecycle import TERMINAL_STATUSES
from api.vocabulary import BEFORE_FIRST_STEP

__all__ = ["ApiClient", "ApiError"]
JOBS_PAGE = 100  # the API's largest page of jobs
TELEMETRY_PAGE = 1000  # ... and of events and metrics


class ApiError(Exception):
    """The API refused a call (``status`` >= 400; 0: the stream could not be followed). The
    message is the API's ``error.message`` (with its ``param`` when that adds one) on one line, or,
    when the API listed several invalid fields (``error.errors``), one line for each of them."""

    def __init__(self, status: int, body: Any) -> None:
        lines = _error_lines(body)
        if status:
            lines[0] = f"HTTP {status}: {lines[0]}"
        super().__init__("\n".join(lines))
        self.status, self.body = status, body


def _error_lines(body: Any) -> list[str]:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return [" ".join(str(body).split())[:500]]
    listed = error.get("errors")
    if isinstance(listed, list) and listed and all(isinstance(item, dict) for item in listed):
        # Each as the API words a field's error in its message: "param: what is wrong".
        return [_one_line(f"{item.get('param')}: {item.get('message', '')}") for item in listed]
    message, param = str(error.get("message", "")), error.get("param")
    if param and not message.startswith(f"{param}:"):
        message = f"{message} (param: {param})"
    return [_one_line(message)]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _total_length(response: httpx.Response) -> int | None:
    """The whole file's size: ``Content-Range``'s total on a 206, else ``Content-Length``."""
    ranged = response.headers.get("Content-Range", "")
    value = ranged.rpartition("/")[2] if ranged else response.headers.get("Content-Length")
    return int(value) if value and value.isdigit() else None


class ApiClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _json(self, response: httpx.Response) -> Any:
        try:
            body = response.json()
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            raise ApiError(response.status_code, body)
        return body

    def _get(self, path: str, params: Any = None) -> Any:
        return self._json(self.http.get(path, params=params))

    def _pages(self, path: str, params: dict[str, Any], cursor: str, page: int, limit: int | None = None,
               start: int = 0) -> dict[str, Any]:
        """Every item of a paged listing (at most ``limit``) after cursor ``start``, as one page:
        ``{"items": [...], "next_after": cursor of what is left, None when nothing is}``."""
        items: list[Any] = []
        after: int | None = start
        while after is not None and (limit is None or len(items) < limit):
            size = page if limit is None else min(page, limit - len(items))
            body = self._get(path, {**params, cursor: after, "limit": size})
            items += body["items"]
            after = body["next_after"]
        return {"items": items, "next_after": after}

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._json(self.http.post("/v1/jobs", json=spec, headers=headers))

    def estimate(self, spec: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/jobs?dry_run=true``: every check of a submit, nothing queued; the spec as it
        would be stored and its GPU-hours estimated."""
        return self._json(self.http.post("/v1/jobs", params={"dry_run": "true"}, json=spec))

    def update(self, job_id: int, changes: dict[str, Any]) -> dict[str, Any]:
        """``PATCH /v1/jobs/{id}``: priority, tags, description or max_gpu_hours."""
        return self._json(self.http.patch(f"/v1/jobs/{job_id}", json=changes))

    def run_rewards(self, body: dict[str, Any]) -> dict[str, Any]:
        """A dry run of rewards on samples: each reward has up to 30 s, so more than the default."""
        return self._json(self.http.post("/v1/rewards/run", json=body, timeout=120.0))

    def samples(self, job_id: int, step: int | None = None, limit: int = 5) -> dict[str, Any]:
        """The job's kept samples, newest step first: ``step``'s only, or the newest ``limit`` steps'."""
        params: dict[str, Any] = {"limit": limit, **({"step": step} if step is not None else {})}
        return self._get(f"/v1/jobs/{job_id}/samples", params)

    def run_environment(self, body: dict[str, Any]) -> dict[str, Any]:
        """A dry run of an environment: each of its calls has up to 10 s, so more than the default."""
        return self._json(self.http.post("/v1/environments/run", json=body, timeout=300.0))

    def reward_catalog(self) -> dict[str, Any]:
        return self._get("/v1/rewards")

    def job(self, job_id: int) -> dict[str, Any]:
        return self._get(f"/v1/jobs/{job_id}")

    def list_jobs(self, statuses: Iterable[str] = (), limit: int | None = None,
                  newest_first: bool = True, tags: Iterable[str] = (),
                  search: str | None = None) -> dict[str, Any]:
        """The key's jobs (an admin's: everyone's), newest first unless told otherwise, only
        those in ``statuses`` if any, with every one of ``tags``, and holding ``search`` in their
        name or description (ignoring case), at most ``limit`` (None: all)."""
        params = {"status": list(statuses), "order": "desc" if newest_first else "asc", "tag": list(tags),
                  **({"q": search} if search else {})}
        return self._pages("/v1/jobs", params, "after", JOBS_PAGE, limit)

    def me(self) -> dict[str, Any]:
        """``GET /v1/me``: the key, its team, and the team's artifact bytes and quota."""
        return self._get("/v1/me")

    def team_name(self, team_id: int) -> str | None:
        """A team's name: the key's own, or (an admin's key) any team's; None if not found."""
        me = self.me()
        if me["team_id"] == team_id:
            return me["team"]
        if me["is_admin"]:
            teams = self._get("/v1/admin/teams")["items"]  # one page: every team
            return next((team["name"] for team in teams if team["id"] == team_id), None)
        return None

    def clone(self, job_id: int, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._json(self.http.post(f"/v1/jobs/{job_id}/clone", json=changes))

    def act(self, job_id: int, action: str) -> dict[str, Any]:
        """``POST /v1/jobs/{id}/{action}``: pause, resume or retry."""
        return self._json(self.http.post(f"/v1/jobs/{job_id}/{action}"))

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._json(self.http.post(f"/v1/jobs/{job_id}/cancel"))

    def delete(self, job_id: int) -> None:
        """``DELETE /v1/jobs/{id}``: a finished job, its rows and its artifacts (204, no body)."""
        response = self.http.delete(f"/v1/jobs/{job_id}")
        if response.status_code != 204:
            self._json(response)  # raises the API's error

    def events(self, job_id: int) -> dict[str, Any]:
        """Every lifecycle event of the job, in order."""
        return self._pages(f"/v1/jobs/{job_id}/events", {}, "after", TELEMETRY_PAGE)

    def metrics(self, job_id: int, names: Iterable[str] = ()) -> dict[str, Any]:
        """Every step's metrics record (step 0's evaluation too), in step order; only ``names``
        (and ``step``) if given."""
        params = {"names": ",".join(names)} if names else {}
        return self._pages(f"/v1/jobs/{job_id}/metrics", params, "after_step", TELEMETRY_PAGE,
                           start=BEFORE_FIRST_STEP)

    def download(self, path: str, target: Path, attempts: int = 5) -> int:
        """Stream the file at ``path`` into ``target`` (its size in bytes). What ``target`` already
        holds, from a download that broke off, is kept and the rest asked for with ``Range``."""
        for attempt in range(attempts):
            have = target.stat().st_size if target.exists() else 0
            rest = {"Range": f"bytes={have}-"} if have else {}
            try:
                with self.http.stream("GET", path, headers=rest) as response:
                    if response.status_code == 416 and have:  # nothing left to fetch
                        return have
                    if response.status_code >= 400:
                        response.read()
                        self._json(response)
                    total = _total_length(response)
                    # 200 to a range: the server sends everything again.
                    with target.open("ab" if response.status_code == 206 else "wb") as out:
                        for chunk in response.iter_bytes():
                            out.write(chunk)
                size = target.stat().st_size
                if total is None or size == total:
                    return size
            except httpx.TransportError:
                if attempt == attempts - 1:
                    raise
            time.sleep(min(2**attempt, 10) * 0.5)
        raise ApiError(0, f"{path}: the download broke off {attempts} times")

    def compare(self, job_ids: Iterable[int], metrics: Iterable[str] = ()) -> dict[str, Any]:
        """``GET /v1/jobs/compare``: the jobs' metric series (the API's default: reward) and where
        their specs differ."""
        params = {"ids": ",".join(map(str, job_ids))}
        if metrics:
            params["metrics"] = ",".join(metrics)
        return self._get("/v1/jobs/compare", params)

    def cluster(self) -> dict[str, Any]:
        return self._get("/v1/cluster")

    def usage(self, since: str | None = None, until: str | None = None, days: int | None = None,
              ) -> dict[str, Any]:
        """``GET /v1/usage``: GPU-seconds per team and pool; the API picks the default window."""
        params = {"since": since, "until": until, "days": days}
        return self._get("/v1/usage", {name: value for name, value in params.items() if value is not None})

    def upload_file(self, path: Path, purpose: str, filename: str,
                    prompt_field: str | None = None) -> dict[str, Any]:
        """``POST /v1/files``: the file at ``path`` streamed as the multipart ``file`` part (httpx
        reads it in chunks), ``purpose`` sent first so the API applies its limit from the start."""
        fields = {"purpose": purpose, **({"prompt_field": prompt_field} if prompt_field else {})}
        with path.open("rb") as handle:
            return self._json(self.http.post("/v1/files", data=fields,
                                             files={"file": (filename, handle, "application/octet-stream")},
                                             timeout=httpx.Timeout(self.http.timeout.read, write=600.0)))

    def list_files(self) -> list[dict[str, Any]]:
        """``GET /v1/files``, every page."""
        items: list[dict[str, Any]] = []
        after = None
        while True:
            page = self._get("/v1/files", {"after": after} if after else None)
            items += page["items"]
            after = page["next_after"]
            if after is None:
                return items

    def file(self, file_id: str) -> dict[str, Any]:
        return self._get(f"/v1/files/{file_id}")

    def delete_file(self, file_id: str) -> dict[str, Any]:
        return self._json(self.http.delete(f"/v1/files/{file_id}"))

    def queue(self, pool: str | None = None) -> dict[str, Any]:
        return self._get("/v1/queue", {"pool": pool} if pool else None)

    def stream_url(self, job_id: int, after: int = BEFORE_FIRST_STEP, after_event: int = 0) -> str:
        parts = urlsplit(self.base_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        path = f"{parts.path}/v1/jobs/{job_id}/stream"
        return urlunsplit((scheme, parts.netloc, path, f"after={after}&after_event={after_event}", ""))

    def watch(self, job_id: int, on_message: Callable[[dict[str, Any]], None], retries: int = 5) -> str:
        """Follow the stream until a terminal status; a reconnect resumes after the last step seen
        (the server sends each step once per connection, from SQL first, then live)."""
        last_step, last_event = BEFORE_FIRST_STEP, 0
        for _ in range(retries + 1):
            try:
                with connect(self.stream_url(job_id, last_step, last_event), additional_headers=self.headers,
                             open_timeout=30) as ws:
                    for raw in ws:
                        message = json.loads(raw)
                        if message.get("type") == "metrics":
                            last_step = max(last_step, message["step"])
                        elif message.get("type") == "event":
                            last_event = max(last_event, message["event"].get("id") or 0)
                        on_message(message)
                        if message.get("type") == "status" and message.get("status") in TERMINAL_STATUSES:
                            return message["status"]
            except (ConnectionClosed, InvalidHandshake, OSError):
                pass
            status = self.job(job_id)["status"]  # the stream ended early: SQL knows the truth
            if status in TERMINAL_STATUSES:
                return status
            time.sleep(1.0)
        raise ApiError(0, f"lost the stream of job {job_id} {retries + 1} times")
