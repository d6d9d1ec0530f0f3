"""The worker's part in the service's tests, played by the worker's own code: ``ScriptedWorker``
(the ``worker`` fixture of ``tests/api/conftest.py`` yields one)."""

from __future__ import annotations


class ScriptedWorker:
    """Plays the worker's part with the worker's own code (the Celery worker is tested on its
    own): the scheduler's dispatch and the real claim and finish transitions, and
    ``worker.reporting.JobReporter`` for steps, samples and events. Each writes SQL, then its
    transaction's staged messages reach the job's stream, as in the real worker."""

    def __init__(self, settings, redis_url: str, maxlen: int = 100_000) -> None:
        import redis

        from api.store import bus

        self.database_url, self.keys = settings.database_url, settings.redis_keys
        self.redis = redis.Redis.from_url(redis_url)
        self.maxlen = maxlen
        self.publish_staged = bus.publisher(self.redis, self.keys, maxlen)

    def publish(self, job_id: int, kind: str, data: dict) -> None:
        """A raw XADD, for a test of what readers do with a message no store function wrote."""
        from api.store import bus

        bus.publish(self.redis, self.keys, job_id, kind, data, self.maxlen)

    def reporter(self, job_id: int, seen: list | None = None):
        """The worker's reporter for ``job_id``; what it publishes is also appended to ``seen``."""
        from worker.reporting import JobReporter

        def publish(messages: list) -> None:
            if seen is not None:
                seen.extend(messages)
            self.publish_staged(messages)

        return JobReporter(self.database_url, job_id, publish)

    def start(self, job_id: int, worker_id: str = "scripted") -> None:
        from api.store import attempts
        from api.store.db import session_scope
        from api.store.dispatching import dispatch_job

        with session_scope(self.database_url, publish=self.publish_staged) as session:
            assert dispatch_job(session, job_id, worker_id)
            assert attempts.claim(session, job_id, worker_id) is not None

    def step(self, job_id: int, step: int, padding: int = 0) -> dict:
        """One optimizer step's record (TRL metric names), in SQL, then on the stream."""
        record = {"step": step, "reward": 0.01 * step, "reward_std": 0.5, "kl": 0.001 * step,
                  "loss": 0.0, "clip_ratio/region_mean": 0.02, "rewards/exact_match/mean": 0.01 * step}
        if padding:
            record["note"] = "x" * padding
        self.reporter(job_id).on_step(record)
        return record

    def burst(self, job_id: int, steps: range, padding: int = 0) -> list[dict]:
        """Many steps fast: the reporter's writes for each, in one transaction (the reporter
        commits one per step), then one pipelined publish."""
        from api.store import attempts, telemetry
        from api.store.db import session_scope

        records = [{"step": step, "reward": 0.01 * step, "note": "x" * padding} for step in steps]
        with session_scope(self.database_url, publish=self.publish_staged) as session:
            for record in records:
                telemetry.record_metrics(session, job_id, record)
            attempts.set_progress(session, job_id, steps[-1])
        return records

    def samples(self, job_id: int, step: int, rows: list[dict]) -> None:
        self.reporter(job_id).on_samples(step, rows)

    def event(self, job_id: int, type_: str, message: str = "", data: dict | None = None) -> dict:
        """The event as the stream carries it (with its row id)."""
        seen: list = []
        self.reporter(job_id, seen).on_event(type_, message, data or {})
        [event] = [message.data for message in seen if message.kind == "event"]
        return event

    def finish(self, job_id: int, status: str = "succeeded", worker_id: str = "scripted",
               publish: bool = True) -> None:
        """``publish=False``: the outcome reaches SQL only, as when the worker's publish fails."""
        from api.domain.lifecycle import JobStatus
        from api.store import attempts
        from api.store.db import session_scope

        with session_scope(self.database_url, publish=self.publish_staged if publish else None) as session:
            assert attempts.finish(session, job_id, worker_id=worker_id, outcome=JobStatus(status),
                                   message=f"{status} (scripted)")

    def close(self) -> None:
        self.redis.close()
