"""Ranks spanning hosts: each "host" is a process of its own on this machine (this test's process is
one node, a child Python process the other), joined through one rendezvous at node 0, as the
service's workers of a gang are. The run equals the 1-process one under ddp and fsdp, on even
and uneven hosts; global rank 0 is node 0's whatever order torch's rendezvous gives the nodes;
and a host whose peer died raises PeerLost, not the job's failure.

Both nodes write into one output folder here; what is written where when hosts share no disk is
test_multi_host_checkpoints's.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from multi_host import OtherHost, host_groups, other_host, train_on_hosts
from run_records import assert_same_run, assert_same_samples, records
from test_distributed import COMPARABLE_ADAM, HANG
from test_launch import fail_on
from test_sharding import job, train
from waiting import wait_until

from grpo_core.io.model_loading import PolicyAndReference
from grpo_core.parallel.distributed import Ranks
from grpo_core.parallel.sharding import shard_models
from grpo_core.run.launch import PeerLost, RankFailed, launch_ranks
from grpo_core.spec.run_spec import RunSpec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("multi-host")


@pytest.fixture(scope="module")
def four_prompts_single(tiny_model_dir: Path, runs_root: Path) -> tuple[RunSpec, Path]:
    """A job whose 4 prompts a step divide over 2 and 4 ranks, and its 1-process run. Every
    whole-step statistic crosses ranks (token-mean loss, batch-scaled rewards, two passes per
    batch, two micro-batches)."""
    data = job(tiny_model_dir, "ddp", prompts_per_step=4, **COMPARABLE_ADAM).model_dump()
    spec = RunSpec.model_validate(data)
    return spec, train(spec, runs_root, "four-prompts-one", 1)


def with_sharding(spec: RunSpec, sharding: str) -> RunSpec:
    data = spec.model_dump()
    data["resources"] = {**data["resources"], "gpus": 2, "sharding": sharding}
    return RunSpec.model_validate(data)


def test_ddp_on_two_hosts_of_one_rank_trains_exactly_like_one_process(four_prompts_single, runs_root):
    spec, one = four_prompts_single
    two = train_on_hosts(spec, runs_root, "ddp-1+1", (1, 1))
    assert_same_samples(one, two)
    assert_same_run(one, two)
    # Rank 0 (node 0) alone wrote the records.
    assert [e["type"] for e in records(two, "events")].count("finished") == 1


def test_hybrid_sharded_fsdp_on_two_hosts_of_two_ranks_trains_exactly_like_one_process(
        four_prompts_single, runs_root, tiny_model_dir):
    # Heaviest here: 4 ranks. Equal hosts: each parameter sharded within a host, replicated across.
    spec, one = four_prompts_single
    four = train_on_hosts(with_sharding(spec, "fsdp"), runs_root, "hsdp-2+2", (2, 2))
    assert_same_samples(one, four)
    assert_same_run(one, four)
    # A host's 2 ranks split each weight; the other host holds copies.
    assert shards_of_a_layer_weight(tiny_model_dir, (2, 2), runs_root) == 2


def test_fsdp_on_uneven_hosts_trains_exactly_like_one_process(tiny_model_dir, runs_root):
    # 2 + 1 ranks: no grid, one shard dimension over all three ranks. Six prompts a step.
    spec = job(tiny_model_dir, "fsdp", **COMPARABLE_ADAM)
    one = train(spec, runs_root, "six-prompts-one", 1)
    three = train_on_hosts(spec, runs_root, "fsdp-2+1", (2, 1))
    assert_same_samples(one, three)
    assert_same_run(one, three)
    assert shards_of_a_layer_weight(tiny_model_dir, (2, 1), runs_root) == 3


def shards_of_a_layer_weight(model_dir: Path, node_sizes: tuple[int, ...], root: Path) -> int:
    """Into how many shards the ranks of ``node_sizes`` hosts split a decoder layer's weight, as a
    run shards the model (its checkpoints across hosts are written whole, so they cannot say)."""
    node_0, node_1 = host_groups(node_sizes)
    common = dict(device="cpu", hang_timeout=HANG)
    with other_host(root / f"shards-{node_1.run_id}", launch_ranks, _layer_weight_shards,
                    (model_dir,), node_sizes[1], hosts=node_1, **common) as node:
        shards = launch_ranks(_layer_weight_shards, (model_dir,), node_sizes[0], hosts=node_0, **common)
        shards += node.value()
    assert len(set(shards)) == 1, shards
    return shards[0]


def _layer_weight_shards(ranks: Ranks, model_dir: Path) -> int:
    """On each rank: the model sharded as a run shards it, and over how many ranks the weight is split."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    shard_models(PolicyAndReference(model, None, uses_adapters=False), ranks)
    weight = model.model.layers[0].mlp.up_proj.weight
    return math.prod(weight.device_mesh.size(dim) for dim, placement in enumerate(weight.placements)
                     if placement.is_shard())


def where_am_i(ranks: Ranks, node: int) -> tuple[int, int, int, tuple[int, ...], float]:
    """This rank's node, global rank, the rank torch's rendezvous gave its node, the layout, and
    the ranks' count summed over the group. The sum also keeps a rank from leaving while gloo
    still connects the others: a rank that ends right after joining closes its connections
    under a peer still making its own ("Connection closed by peer" in connectFullMesh)."""
    return node, ranks.rank, int(os.environ["GROUP_RANK"]), ranks.node_sizes, ranks.sum([1.0])[0]


def test_global_rank_0_is_on_node_0_whatever_order_the_rendezvous_gives_the_nodes(tmp_path):
    # Node 0 is the child. torch's rendezvous numbers the nodes by (address, pid), so it usually
    # makes node 1 (this process, the older one) its group 0, the reverse of ours; once the pids
    # wrapped (pid_max is 32,768 in a container, and a suite starts thousands of processes) the
    # child's pid is the lower one and torch's order is ours. Either way global rank 0 is node 0's.
    node_0, node_1 = host_groups((1, 2))
    with other_host(tmp_path / "node-0", launch_ranks, where_am_i, (0,), 1, device="cpu",
                    hang_timeout=HANG, hosts=node_0) as node:
        here = launch_ranks(where_am_i, (1,), 2, device="cpu", hang_timeout=HANG, hosts=node_1)
        there = node.value()
    group_0 = int(node.process.pid > os.getpid())  # the group torch gave node 0 (this process: the other)
    assert there == [(0, 0, group_0, (1, 2), 3.0)]
    assert here == [(1, 1, 1 - group_0, (1, 2), 3.0), (1, 2, 1 - group_0, (1, 2), 3.0)]


def sum_until_stopped(ranks: Ranks, folder: str) -> None:
    """Sum over the ranks forever, after saying so in ``folder``."""
    (Path(folder) / f"rank-{ranks.rank}.pid").write_text(str(os.getpid()))
    while True:
        ranks.sum([1.0])
        time.sleep(0.01)


@pytest.mark.parametrize("victim", ["launcher", "rank"])
def test_a_host_whose_peer_died_raises_peer_lost(tmp_path, victim):
    node_0, node_1 = host_groups((1, 1))
    with other_host(tmp_path / "node-1", launch_ranks, sum_until_stopped, (str(tmp_path),), 1,
                    device="cpu", hang_timeout=HANG, hosts=node_1) as node:
        killer = threading.Thread(target=_kill_node_1, args=(tmp_path, node, victim), daemon=True)
        killer.start()
        with pytest.raises(PeerLost) as lost:
            launch_ranks(sum_until_stopped, (str(tmp_path),), 1, device="cpu", hang_timeout=HANG,
                         hosts=node_0)
        killer.join()
        if victim == "rank":
            # Node 1 itself knows better: its rank died, the machine's fault.
            kind, (name, code, message) = node.outcome()
            assert (kind, name, code) == ("error", "RankDied", "rank_died")
            pid = (tmp_path / "rank-1.pid").read_text()
            assert message == f"rank 1 (process {pid}) was killed by SIGKILL"
    # Node 0's rank saw its collective's connection go; it reports that, as no error of the job.
    assert (lost.value.code, lost.value.local_rank) == ("peer_lost", 0)
    assert lost.value.message.startswith("local rank 0 lost its peers on the other hosts: ")


def _kill_node_1(folder: Path, node: OtherHost, victim: str) -> None:
    """SIGKILL node 1's launcher (its rank dies with it) or its rank, once both ranks sum."""
    pids = [folder / f"rank-{rank}.pid" for rank in (0, 1)]
    wait_until(lambda: all(p.exists() for p in pids), HANG.total_seconds(), "both ranks to sum")
    os.kill(node.process.pid if victim == "launcher" else int(pids[1].read_text()), signal.SIGKILL)


def test_a_jobs_error_fails_its_own_host_and_the_other_loses_a_peer(tmp_path):
    # Global rank 1 (node 1's) raises the job's error; rank 0 waits in a collective that breaks.
    node_0, node_1 = host_groups((1, 1))
    with other_host(tmp_path / "node-1", launch_ranks, fail_on, (1,), 1, device="cpu", hang_timeout=HANG,
                    hosts=node_1) as node:
        with pytest.raises(PeerLost) as lost:
            launch_ranks(fail_on, (1,), 1, device="cpu", hang_timeout=HANG, hosts=node_0)
        failed = ("RankFailed", "reward_error", "rank 1 failed: the reward raised at scoring")
        assert node.outcome() == ("error", failed)
    assert lost.value.local_rank == 0 and not isinstance(lost.value, RankFailed)


@pytest.mark.parametrize("node", [0, 1])
def test_a_host_whose_peers_never_join_raises_peer_lost(node):
    # Node 0 waits for node 1 at its rendezvous; node 1 for node 0's store, which never opens.
    hosts = host_groups((1, 1))[node]
    with pytest.raises(PeerLost) as lost:
        launch_ranks(where_am_i, (node,), 1, device="cpu", hang_timeout=timedelta(seconds=3), hosts=hosts)
    assert lost.value.local_rank is None  # the launcher noticed, before any rank started
    expected = "RendezvousTimeoutError" if node == 0 else "RendezvousConnectionError"
    assert lost.value.exception_type.endswith(expected)
