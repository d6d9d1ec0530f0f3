"""Ranks spanning hosts: each "host" is a process of its own on this machine (this test's process is
one node, a child Python process the other), joined through one rendezvous at node 0, as the
service's workers of a gang are. The run equals the 1-process one under ddp and fsdp, on even
and uneven hosts; global rank 0 is node 0's whatever order torch's rendezvous gives the nodes;
and a host whose peer died raises PeerLost, not the job's failure.

Both nodes write into one output folder, as the hosts of a gang share the run's folder: under
fsdp every rank writes its shards of a checkpoint into the folder rank 0 made.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from run_records import assert_same_run, assert_same_samples, records
from test_distributed import COMPARABLE_ADAM, HANG
from test_launch import fail_on
from test_sharding import job, train
from waiting import wait_until

from grpo_core.errors import GRPOError
from grpo_core.parallel.distributed import Ranks
from grpo_core.run.host_group import HostGroup, free_port
from grpo_core.run.launch import PeerLost, RankFailed, launch_ranks, run_data_parallel
from grpo_core.spec.run_spec import RunSpec

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def host_groups(node_sizes: tuple[int, ...]) -> list[HostGroup]:
    """Every node's HostGroup for one launch on this machine (all at 127.0.0.1)."""
    port = free_port("127.0.0.1")
    run_id = f"test-{uuid.uuid4().hex[:12]}"
    return [HostGroup(node, node_sizes, f"127.0.0.1:{port}", run_id, "127.0.0.1")
            for node in range(len(node_sizes))]


def run_node(folder: str) -> None:
    """In the other host's process: the call in ``folder``, its outcome written back."""
    function, args, kwargs = pickle.loads((Path(folder) / "call.pkl").read_bytes())
    try:
        outcome: tuple[str, Any] = ("value", function(*args, **kwargs))
    except GRPOError as exc:
        outcome = ("error", (type(exc).__name__, exc.code, exc.message))
    (Path(folder) / "outcome.pkl").write_bytes(pickle.dumps(outcome))


@dataclass
class OtherHost:
    process: subprocess.Popen
    folder: Path

    def outcome(self) -> tuple[str, Any]:
        assert self.process.wait(timeout=HANG.total_seconds()) == 0, "the other host's process failed"
        return pickle.loads((self.folder / "outcome.pkl").read_bytes())

    def value(self) -> Any:
        kind, value = self.outcome()
        assert kind == "value", value
        return value


@contextmanager
def other_host(folder: Path, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[OtherHost]:
    """``function(*args, **kwargs)`` in a new Python process (it must be importable: a module-level
    function of the core or of this module); killed if the test leaves before it ends."""
    folder.mkdir(parents=True)
    (folder / "call.pkl").write_bytes(pickle.dumps((function, args, kwargs)))
    script = "import sys; from test_multi_host_launch import run_node; run_node(sys.argv[1])"
    path = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    process = subprocess.Popen([sys.executable, "-c", script, str(folder)], env=env, cwd=REPO)
    try:
        yield OtherHost(process, folder)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def train_on_hosts(spec: RunSpec, root: Path, name: str, node_sizes: tuple[int, ...]) -> Path:
    """The run on two hosts: node 1 in a child process, node 0 here; one output folder."""
    node_0, node_1 = host_groups(node_sizes)
    out = root / name
    common = dict(device="cpu", progress=False, hang_timeout=HANG)
    with other_host(root / f"{name}-node-1", run_data_parallel, spec, root, out, node_sizes[1],
                    hosts=node_1, **common) as node:
        run_data_parallel(spec, root, out, node_sizes[0], hosts=node_0, **common)
        assert node.value().step == spec.grpo.max_steps
    return out


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
        four_prompts_single, runs_root):
    # Heaviest here: 4 ranks. Equal hosts: each parameter sharded within a host, replicated across.
    spec, one = four_prompts_single
    four = train_on_hosts(with_sharding(spec, "fsdp"), runs_root, "hsdp-2+2", (2, 2))
    assert_same_samples(one, four)
    assert_same_run(one, four)
    assert shards_of_a_layer_weight(four) == 2  # a host's 2 ranks; the other host holds copies


def test_fsdp_on_uneven_hosts_trains_exactly_like_one_process(tiny_model_dir, runs_root):
    # 2 + 1 ranks: no grid, one shard dimension over all three ranks. Six prompts a step.
    spec = job(tiny_model_dir, "fsdp", **COMPARABLE_ADAM)
    one = train(spec, runs_root, "six-prompts-one", 1)
    three = train_on_hosts(spec, runs_root, "fsdp-2+1", (2, 1))
    assert_same_samples(one, three)
    assert_same_run(one, three)
    assert shards_of_a_layer_weight(three) == 3


def shards_of_a_layer_weight(run: Path) -> int:
    """Into how many shards the sharded checkpoint of step 3 split a decoder layer's weight."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(run / "checkpoints" / "step-3" / "distributed")).read_metadata()
    return len(metadata.state_dict_metadata["model.model.layers.0.mlp.up_proj.weight"].chunks)


def where_am_i(ranks: Ranks, node: int) -> tuple[int, int, int, tuple[int, ...], float]:
    """This rank's node, global rank, the rank torch's rendezvous gave its node, the layout, and
    the ranks' count summed over the group. The sum also keeps a rank from leaving while gloo
    still connects the others: a rank that ends right after joining closes its connections
    under a peer still making its own ("Connection closed by peer" in connectFullMesh)."""
    return node, ranks.rank, int(os.environ["GROUP_RANK"]), ranks.node_sizes, ranks.sum([1.0])[0]


def test_global_rank_0_is_on_node_0_whatever_order_the_rendezvous_gives_the_nodes(tmp_path):
    # Node 0 is the child: its agent has the higher pid, and torch's rendezvous numbers the
    # nodes by (address, pid), so it makes node 1 (this process) its group 0.
    node_0, node_1 = host_groups((1, 2))
    with other_host(tmp_path / "node-0", launch_ranks, where_am_i, (0,), 1, device="cpu",
                    hang_timeout=HANG, hosts=node_0) as node:
        here = launch_ranks(where_am_i, (1,), 2, device="cpu", hang_timeout=HANG, hosts=node_1)
        there = node.value()
    assert there == [(0, 0, 1, (1, 2), 3.0)]
    assert here == [(1, 1, 0, (1, 2), 3.0), (1, 2, 0, (1, 2), 3.0)]


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
