"""A host's place in a launch across hosts: global ranks follow node order, so rank 0 is node 0's
first rank whatever the node sizes; and node 0 can offer a port the others reach it at."""

from __future__ import annotations

import socket

import pytest

from grpo_core.run.host_group import HostGroup, free_port


def node(rank: int, sizes: tuple[int, ...]) -> HostGroup:
    return HostGroup(rank, sizes, "10.0.0.1:29500", "job-7-attempt-2", f"10.0.0.{rank + 1}")


def test_uneven_hosts_number_their_ranks_in_node_order():
    nodes = [node(rank, (2, 1, 3)) for rank in range(3)]
    assert [(n.rank_offset, n.local_size) for n in nodes] == [(0, 2), (2, 1), (3, 3)]
    assert {(n.nnodes, n.world_size) for n in nodes} == {(3, 6)}
    assert [n.is_host for n in nodes] == [True, False, False]


@pytest.mark.parametrize(("rank", "sizes"), [(2, (1, 1)), (-1, (1, 1)), (0, ()), (0, (2, 0))])
def test_a_host_outside_the_layout_or_a_node_without_ranks_is_refused(rank, sizes):
    with pytest.raises(ValueError):
        node(rank, sizes)


def test_the_free_port_can_be_bound_on_the_address():
    port = free_port("127.0.0.1")
    assert 0 < port < 2**16
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))  # what node 0's rendezvous store does next
