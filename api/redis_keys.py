"""Every name this service gives a Redis key or a Celery queue, under one deployment namespace.

Two stacks may share one Redis (two teams' deployments, a ``grpo dev`` next to a staging stack):
each one's job streams, heartbeats, queue snapshot, scheduler lock and worker queues live under
its own namespace, so neither sees nor holds the other's. The namespace defaults to a short hash
of the database URL (:func:`namespace_for`): the processes of one stack share a database, so
they agree on it without setup, and stacks on different databases never collide.

Pure (no I/O): nothing else spells a key, so a key can only be named through :class:`RedisKeys`.
Outside the store, since it names keys and stores nothing: the settings build it and must not
import the store.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from sqlalchemy.engine import make_url

# No glob characters (``*?[]``), so a key pattern built from it matches only this namespace,
# and no ``:`` or ``.``, the separators of keys and queue names.
NAMESPACE_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
_NAMESPACE = re.compile(NAMESPACE_PATTERN)


def namespace_for(database_url: str) -> str:
    """A stable 10-character name for the deployment that uses ``database_url``. The password is
    left out: rotating it must not move every key, nor should the name depend on a secret."""
    try:
        url = make_url(database_url).render_as_string(hide_password=True)  # the password as ***
    except Exception:  # noqa: BLE001 - an unparsable URL fails where it is used; any text hashes
        url = database_url
    return "d" + hashlib.sha256(url.encode()).hexdigest()[:9]


@dataclass(frozen=True)
class RedisKeys:
    namespace: str

    def __post_init__(self) -> None:
        if not _NAMESPACE.match(self.namespace):
            raise ValueError(f"namespace '{self.namespace}' must match {NAMESPACE_PATTERN}")

    @property
    def _prefix(self) -> str:
        return f"grpo:{self.namespace}:"

    @property
    def everything_pattern(self) -> str:
        """SCAN pattern of every key of this namespace but its Celery queues (Redis lists whose
        names Celery also uses as routing keys, so they follow Celery's dotted style)."""
        return f"{self._prefix}*"

    def job_stream(self, job_id: int) -> str:
        """The job's live messages (``api.store.bus``)."""
        return f"{self._prefix}job:{job_id}"

    def worker(self, worker_id: str) -> str:
        """A live worker's heartbeat (expires with it)."""
        return f"{self._prefix}worker:{worker_id}"

    @property
    def workers_pattern(self) -> str:
        """SCAN pattern of every heartbeat of this namespace."""
        return f"{self._prefix}worker:*"

    def busy(self, worker_id: str) -> str:
        """The jobs a worker's processes mark as running (``worker.heartbeat``); not matched by
        :attr:`workers_pattern`, so it is no heartbeat."""
        return f"{self._prefix}busy:{worker_id}"

    @property
    def queue(self) -> str:
        """The scheduler's last published order of waiting jobs."""
        return f"{self._prefix}queue"

    @property
    def queue_positions(self) -> str:
        return f"{self._prefix}queue:positions"

    @property
    def scheduler_pass(self) -> str:
        """When the leading scheduler last finished a pass."""
        return f"{self._prefix}scheduler:pass"

    @property
    def scheduler_leader(self) -> str:
        return f"{self._prefix}scheduler:leader"

    def stream_ticket(self, ticket_hash: str) -> str:
        """A WebSocket stream ticket's record, by the ticket's hash (``api.http.stream_auth``):
        a ticket one stack issued is not even looked for by another."""
        return f"{self._prefix}stream-ticket:{ticket_hash}"

    def rate_bucket(self, team_id: int, kind: str) -> str:
        """A team's token bucket of one kind (``api.limits.rate_limits``), shared by all API processes."""
        return f"{self._prefix}rate:{team_id}:{kind}"

    def upload_slots(self, team_id: int) -> str:
        """A team's uploads in flight, a sorted set of tokens by when each was taken
        (``api.store.upload_slots``), shared by all API processes."""
        return f"{self._prefix}uploads:{team_id}"

    def reward_trial_slots(self, team_id: int) -> str:
        """A team's rewards dry runs in progress, as ``upload_slots`` (``api.store.trial_slots``)."""
        return f"{self._prefix}reward-trial-slots:{team_id}"

    def stat(self, name: str) -> str:
        """A service-wide counter (``api.store.bus.COUNTERS``)."""
        return f"{self._prefix}stats:{name}"

    def reward_trials(self, pool: str) -> str:
        """The rewards dry runs waiting for a sandbox-capable worker of ``pool`` (a list the API
        pushes onto and those workers pop, ``api.reward_trial_relay``)."""
        return f"{self._prefix}reward-trials:{pool}"

    def reward_trial_reply(self, request_id: str) -> str:
        """Where a worker answers one dry run; the API waits on it, and it expires soon after."""
        return f"{self._prefix}reward-trial-reply:{request_id}"

    def serve_requests(self, job_id: int) -> str:
        """The chat requests waiting for serving job ``job_id`` (a list the API pushes onto and the
        job's process pops, ``api.http.serve_relay``, ``worker.serving``); it expires when no
        request came for a while."""
        return f"{self._prefix}serve-requests:{job_id}"

    def serve_reply(self, request_id: str) -> str:
        """Where a serving job pushes one chat request's events, in order; the API reads them."""
        return f"{self._prefix}serve-reply:{request_id}"

    def serve_cancel(self, request_id: str) -> str:
        """Set when a chat request's client went away: the serving job stops generating it."""
        return f"{self._prefix}serve-cancel:{request_id}"

    def worker_queue(self, worker_id: str) -> str:
        """The Celery queue (a Redis list of that name) only this worker consumes: the scheduler
        places a job on one worker, so the broker must not hand it to another of the pool."""
        return f"grpo.{self.namespace}.worker.{worker_id}"
