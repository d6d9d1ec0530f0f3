"""Where a gang's ranks meet: node 0 picks a free port on its own address
(``GRPO_WORKER_ADDRESS``) and publishes ``host:port`` in SQL (:mod:`api.store.gangs`); every
other host waits for it there. The attempt number names the rendezvous, so every host of one
attempt agrees on it and a late host of an earlier attempt can never join a newer one.

SQL, not the heartbeat: the port exists only once node 0's job process has picked it, and SQL is
where every host of the gang already reads its lease and stop requests from. Imported only in the
job's process (it builds the launcher's host group, which loads torch).
"""

from __future__ import annotations

import logging
import time

from sqlalchemy.exc import SQLAlchemyError

from api.schemas.jobs import JobRead
from api.settings import Settings
from api.store.db import session_scope
from api.store.gangs import HostPart, publish_rendezvous, rendezvous
from grpo_core.run.host_group import HostGroup, free_port
from grpo_core.run.launch import PeerLost

log = logging.getLogger(__name__)
_POLL_SECONDS = 0.5


def meet(job: JobRead, settings: Settings, part: HostPart) -> HostGroup:
    """This host's place in the gang's launch: node 0 publishes the rendezvous, the others wait for
    it (up to ``GRPO_RANK_TIMEOUT_SECONDS``, the launcher's own wait for late ranks)."""
    if part.leads:
        endpoint = f"{settings.worker_address}:{free_port(settings.worker_address)}"
        with session_scope(settings.database_url) as session:
            publish_rendezvous(session, job.id, endpoint)
        attempt = job.attempt
        log.info("job %s: gang rendezvous at %s (attempt %s)", job.id, endpoint, attempt)
    else:
        endpoint, attempt = _published(job, settings)
    return HostGroup(node_rank=part.node_rank, node_sizes=part.node_sizes, endpoint=endpoint,
                     run_id=f"grpo-job{job.id}-attempt{attempt}", local_addr=settings.worker_address)


def _published(job: JobRead, settings: Settings) -> tuple[str, int]:
    """The rendezvous node 0 published for the running attempt. A database that is away meanwhile
    is waited out like a node 0 that is slow to start: both end at the same deadline, as a lost
    peer (the job goes back to the queue, no fault of its own)."""
    deadline = time.monotonic() + settings.rank_timeout_seconds
    while True:
        try:
            with session_scope(settings.database_url) as session:
                found = rendezvous(session, job.id)
            if found is not None:
                return found
        except SQLAlchemyError as exc:
            log.warning("job %s: reading the gang's rendezvous failed: %s", job.id, exc)
        if time.monotonic() > deadline:
            raise PeerLost(None, f"the gang's node 0 published no rendezvous within "
                                 f"{settings.rank_timeout_seconds:.0f} s", "worker.rendezvous.NotPublished")
        time.sleep(_POLL_SECONDS)
