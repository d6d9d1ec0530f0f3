"""One host's place in a launch whose ranks span several hosts (a gang), and the free port node 0
offers the others for the rendezvous. The standard library only: the worker builds a
:class:`HostGroup` from a dispatch before any torch is loaded.

Global ranks follow node order: node 0 holds ranks ``0 .. node_sizes[0]-1``, node 1 the next
``node_sizes[1]``, and so on, so rank 0 (the rank that reports and writes checkpoints) is always
on node 0. Torch's rendezvous numbers the nodes by its own order (it sorts the agents'
descriptors), which is why each rank takes its rank from here and not from the launcher.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class HostGroup:
    """This host's share of a launch across ``len(node_sizes)`` hosts. Every host gets the same
    ``node_sizes``, ``endpoint`` and ``run_id``; they differ in ``node_rank`` and ``local_addr``."""

    node_rank: int
    node_sizes: tuple[int, ...]  # ranks on each node, in node-rank order; may be uneven, e.g. (2, 1)
    endpoint: str  # "host:port" of the rendezvous node 0 hosts
    run_id: str  # the same on every host, new for every attempt: a stale agent cannot join
    local_addr: str  # this host's address as the other hosts reach it

    def __post_init__(self) -> None:
        if not self.node_sizes or any(size < 1 for size in self.node_sizes):
            raise ValueError(f"every node needs at least one rank: {self.node_sizes}")
        if not 0 <= self.node_rank < len(self.node_sizes):
            raise ValueError(f"node_rank {self.node_rank} is not one of {len(self.node_sizes)} nodes")

    @property
    def nnodes(self) -> int:
        return len(self.node_sizes)

    @property
    def world_size(self) -> int:
        return sum(self.node_sizes)

    @property
    def local_size(self) -> int:
        """How many ranks this host starts."""
        return self.node_sizes[self.node_rank]

    @property
    def rank_offset(self) -> int:
        """The global rank of this host's local rank 0."""
        return sum(self.node_sizes[: self.node_rank])

    @property
    def is_host(self) -> bool:
        """Node 0 hosts the rendezvous store the others connect to."""
        return self.node_rank == 0


def free_port(address: str) -> int:
    """A TCP port free on ``address`` now (bound to port 0, read, closed), for node 0 to publish
    as the rendezvous endpoint before its agent binds it. Another process may take it in between;
    the rendezvous then fails to start and the attempt is retried like any other start-up fault."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])
