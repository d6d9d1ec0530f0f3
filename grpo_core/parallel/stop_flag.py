"""A stop every rank sees inside its generation, without a collective.

One process stops inside a long generation by asking ``should_stop`` every few tokens
(:func:`grpo_core.algorithm.rollout.sample_completions`). Ranks cannot agree on a stop the same
way: each decodes its own rows, so their loops run different numbers of tokens and a collective
per ask would deadlock. Instead the rank that learns of the stop (rank 0, which reads the job's
stop request) raises a flag in the launch's key-value store (the c10d store every rank already
reached at the rendezvous), and every rank's ask reads it there. The ranks then agree once, after
their loops (:meth:`grpo_core.parallel.distributed.Ranks.any`), so a rank whose loop had already
ended stops with the others.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch.distributed as dist

from grpo_core.parallel.distributed import Ranks

log = logging.getLogger(__name__)
_KEY = "grpo-stop"
_CONNECT_TIMEOUT = timedelta(seconds=10)


class StopFlag:
    """The flag of one launch (its run id names it in the store)."""

    def __init__(self, store: dist.Store) -> None:
        self.store = store

    def raise_flag(self) -> None:
        self.store.set(_KEY, "1")

    def is_raised(self) -> bool:
        return self.store.check([_KEY])


def stop_flag(ranks: Ranks) -> StopFlag | None:
    """The launch's flag for ranks started by :func:`grpo_core.run.launch.launch_ranks` (its
    store's address and run id are in the environment, as torchrun sets them); None for one
    process, or ranks started some other way (they stop at the next step's ask instead). A store
    that cannot be reached costs only the stop inside a generation, never the run."""
    run_id, address, port = (os.environ.get(name) for name in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR",
                                                                  "MASTER_PORT"))
    if ranks.world_size == 1 or not (run_id and address and port):
        return None
    try:
        store = dist.TCPStore(address, int(port), is_master=False, timeout=_CONNECT_TIMEOUT)
    except (RuntimeError, OSError, ValueError) as error:  # DistStoreError is a RuntimeError
        log.warning("rank %s: no stop flag (the launch's store at %s:%s: %s); a stop reaches this rank "
                    "at the next step", ranks.rank, address, port, error)
        return None
    return StopFlag(dist.PrefixStore(f"{run_id}/", store))
