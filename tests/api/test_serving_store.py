"""The team's serving job of a model (``api.store.serving``): found while live, started when none
is, one only however many first requests race (on Postgres and on SQLite), admitted like any job;
and what the API and a serving job say to each other over Redis (``api.domain.serve_messages``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import service_db
from sqlalchemy import select, update

from api.domain.errors import QueueFull
from api.domain.serve_messages import (
    Delta,
    Done,
    Failed,
    RelayedRequest,
    Started,
    event_message,
    generation_body,
    read_event,
    read_request,
    request_message,
)
from api.domain.serve_spec import ServeSpec, canonical_model, serving_name
from api.schemas.admin import TeamLimits
from api.settings import Settings
from api.store import serving
from api.store.db import session_scope
from api.store.tables import Job, JobEvent
from api.store.teams import create_team, set_limits

RACERS = 8


@pytest.fixture(params=["postgres", "sqlite"])
def database_url(request: pytest.FixtureRequest) -> Iterator[str]:
    url = request.getfixturevalue(f"fresh_{request.param}_url")
    with service_db.migrated(url):
        yield url


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, team_serve_idle_seconds=90, serve_max_batch=4)


def _team(database_url: str, name: str, **limits) -> int:
    with session_scope(database_url) as session:
        team = create_team(session, name)
        if limits:
            set_limits(session, name, TeamLimits(**limits))
    return team.id


def _start(settings: Settings, team_id: int, model: str) -> tuple[int, bool]:
    with session_scope(settings.database_url) as session:
        job, created = serving.find_or_start(session, team_id, model, settings, member=True, pool="default")
    return job.id, created


def _serving_rows(database_url: str) -> list[Job]:
    with session_scope(database_url) as session:
        return list(session.scalars(select(Job).where(Job.kind == "serve").order_by(Job.id)))


def test_one_live_serving_job_per_team_and_model(settings: Settings) -> None:
    alpha = _team(settings.database_url, "alpha", serve_idle_seconds=7)
    beta = _team(settings.database_url, "beta")
    first, created = _start(settings, alpha, "job:3")
    assert created and _start(settings, alpha, "job:3") == (first, False)
    assert _start(settings, alpha, "job:3@20")[0] != first  # a checkpoint is another model
    assert _start(settings, beta, "job:3")[0] != first  # another team's own serving job

    [row, *_] = _serving_rows(settings.database_url)
    spec = ServeSpec.model_validate(row.spec)
    assert (row.kind, row.serve_model, row.name, row.status, row.priority, row.gpus) == (
        "serve", "job:3", "serve-job-3", "queued", "low", 1)
    # The team's idle limit, the deployment's batch.
    assert (spec.serve.idle_seconds, spec.serve.max_batch) == (7, 4)
    with session_scope(settings.database_url) as session:
        assert session.scalar(select(JobEvent.type).where(JobEvent.job_id == row.id)) == "queued"
        # Once it ended (idle), the next request starts another.
        session.execute(update(Job).where(Job.id == row.id).values(status="succeeded"))
    second, created = _start(settings, alpha, "job:3")
    assert created and second != first
    # The defaults, for a team without a limit of its own.
    assert ServeSpec.model_validate(_serving_rows(settings.database_url)[2].spec).serve.idle_seconds == 90


def test_racing_first_requests_start_one_serving_job(settings: Settings) -> None:
    team = _team(settings.database_url, "racers")
    barrier, results, errors = threading.Barrier(RACERS), [], []

    def race() -> None:
        barrier.wait()
        try:
            results.append(_start(settings, team, "job:5"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=race) for _ in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert len({job_id for job_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len(_serving_rows(settings.database_url)) == 1


def test_a_full_queue_refuses_a_new_serving_job_and_leaves_nothing(settings: Settings) -> None:
    team = _team(settings.database_url, "full", max_queued_jobs=0)
    with pytest.raises(QueueFull):
        _start(settings, team, "job:9")
    assert _serving_rows(settings.database_url) == []


def test_model_names_are_canonical() -> None:
    assert canonical_model("job: 07@040") == "job:7@40" and serving_name("job:7@40") == "serve-job-7-step-40"
    for bad in ("path:tiny", "hf:gpt2", "job:x", "job:7@", "tiny"):
        with pytest.raises(ValueError, match="job:ID"):
            canonical_model(bad)


def test_the_request_and_its_events_read_back_as_written() -> None:
    body = generation_body({"model": "job:1", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                            "max_completion_tokens": 9, "temperature": 0.5, "seed": None, "user": "u"}, 9)
    assert body == {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, "max_tokens": 9}
    request = RelayedRequest(id="r1", body=body, reply="reply-key", cancel="cancel-key", deadline=100.0)
    assert read_request(request_message(request)) == request
    assert request.expired(now=100.5) and not request.expired(now=99.0)
    events = [Started(), Delta(text="hé\u2028"),
              Done(finish_reason="length", prompt_tokens=3, completion_tokens=9),
              Failed(status=422, code="invalid_request", message="messages: no", param="messages")]
    assert [read_event(event_message(event)) for event in events] == events
    for garbage in (b"{", b'{"type": "delta"}', b'{"type": "nope"}', b"[]"):
        with pytest.raises(ValueError, match="not a chat reply event"):
            read_event(garbage)
    with pytest.raises(ValueError, match="not a chat request"):
        read_request(b'{"id": "x"}')


def test_a_job_whose_model_a_serving_job_serves_is_not_deleted_meanwhile(settings: Settings) -> None:
    from specs import tiny_spec

    from api.domain.errors import Conflict
    from api.domain.job_spec import JobSpec
    from api.store.job_deletion import deletion_target
    from api.store.jobs import create_job

    team = _team(settings.database_url, "keepers")
    with session_scope(settings.database_url) as session:
        trained, _ = create_job(session, team, JobSpec.model_validate(tiny_spec("trained")))
        session.execute(update(Job).where(Job.id == trained.id).values(status="succeeded"))
    serving_id, _ = _start(settings, team, f"job:{trained.id}@2")
    with session_scope(settings.database_url) as session, pytest.raises(Conflict) as refused:
        deletion_target(session, trained.id, team)
    assert f"job {serving_id} (queued) serves job {trained.id}'s model (serve.model" in refused.value.message
    with session_scope(settings.database_url) as session:
        session.execute(update(Job).where(Job.id == serving_id).values(status="succeeded"))
    with session_scope(settings.database_url) as session:
        assert deletion_target(session, trained.id, team)
