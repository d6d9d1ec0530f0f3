"""What SQL holds beyond a cursor, sent to subscribers: a connection's backlog, and the hub's
safety-net re-checks (one read per job for all its subscribers) and re-reads of the job's row
when a status entry arrives. Reads in pages, so a long backlog never sits in memory whole."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool

from api.domain.lifecycle import TERMINAL_STATUSES
from api.schemas.jobs import JobRead
from api.store import jobs as job_store
from api.store import telemetry
from api.store.db import session_scope
from api.streaming.cursor import Cursor
from api.streaming.messages import encode, to_client
from api.streaming.subscriber import Subscriber

BACKLOG_PAGE = 500
SAMPLES_BACKLOG = 20  # a backlog sends at most this many of the newest samples

News = list[tuple[str, dict[str, Any]]]  # (kind, data) in ``api.store.bus`` shapes


async def catch_up(
    database_url: str, job_id: int, subscribers: list[Subscriber], floor: Cursor, *, wait: bool,
    steps: bool = True,
) -> bool:
    """Send what SQL has beyond ``floor`` (the lowest of the subscribers' cursors; it moves past
    each page): events, and metrics and samples too with ``steps`` or once the job is terminal,
    to each subscriber past its own cursor; then the job's status to each it is news to. True
    when the job is terminal: its final status and the end marker are queued. Only with
    ``wait`` (a connection's backlog) does a put wait for room in a queue."""
    more = True
    while more:
        job, news, more = await run_in_threadpool(read_news, database_url, job_id, floor, steps)
        subscribers = [s for s in subscribers if not s.ended.is_set()]
        if not subscribers:
            return False
        for kind, data in news:
            floor.admit(kind, data)
            text = None
            for subscriber in subscribers:
                if subscriber.cursor.admit(kind, data):
                    text = text or encode(to_client(kind, data))
                    await subscriber.put(text, wait)
    status, text = {"status": job.status}, encode(to_client("status", {"status": job.status}, job))
    for subscriber in subscribers:
        if subscriber.cursor.admit("status", status):
            await subscriber.put(text, wait)
    if job.status not in TERMINAL_STATUSES:
        return False
    for subscriber in subscribers:
        await subscriber.end(wait)
    return True


def read_news(database_url: str, job_id: int, cursor: Cursor, steps: bool) -> tuple[JobRead, News, bool]:
    """The job, then one page of what it has past ``cursor``, and whether more pages follow.
    The job is read first: the worker writes telemetry before it ends a job, so a terminal
    status read here means the telemetry read after it is complete. Any team's job: the route
    checked the caller's team before it accepted the connection."""
    metrics, samples = [], []
    with session_scope(database_url) as session:
        job = job_store.get_job(session, job_id)
        events = telemetry.list_events(session, job_id, after=cursor.event_id, limit=BACKLOG_PAGE)
        if steps or job.status in TERMINAL_STATUSES:
            metrics = telemetry.list_metrics(session, job_id, after_step=cursor.step, limit=BACKLOG_PAGE)
            samples = telemetry.list_samples(session, job_id, limit=SAMPLES_BACKLOG)
    news: News = [("event", event.model_dump(mode="json")) for event in events]
    news += [("metrics", metric.values) for metric in metrics]
    news += [
        ("samples", {"step": row.step, "rows": row.rows})
        for row in reversed(samples)
        if row.step > cursor.sample_step
    ]
    return job, news, BACKLOG_PAGE in (len(events), len(metrics))
