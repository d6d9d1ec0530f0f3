"""Checkpoints of ranks that span hosts sharing no disk: two "hosts" (this process and a child,
multi_host's harness) with separate output folders, node 0's being the checkpoint record, as the
service keeps it. Rank 0 writes the whole checkpoint there, the other host writes nothing at all
(it runs with node 0's folder hidden), and the checkpoint resumes on one process and across hosts
again (node 1's folder holding only the copy a worker would fetch), equal to the uninterrupted run.

Both checkpoint formats resume under fsdp: the one written whole across hosts, and the sharded
one (``distributed/``) ranks of one host write. The fsdp runs (1 + 1 ranks; two passes over each
batch, so odd steps end inside a generation round): hosts 0 -> 2, then one process 2 -> 4; and two
ranks of one host 0 -> 2, hosts 2 -> 3, then hosts 3 -> 4 from inside the round.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from multi_host import host_groups, other_host, train_on_hosts
from run_records import assert_same_run, records
from test_distributed import COMPARABLE_ADAM, HANG
from test_sharding import job, train

from grpo_core.run.launch import RankFailed, run_data_parallel
from grpo_core.spec.run_spec import RunSpec

pytestmark = pytest.mark.slow
HOSTS = (1, 1)
SHARES = ["experience-rank0.pt", "experience-rank1.pt"]  # a pending round split over the 2 ranks


def with_max_steps(spec: RunSpec, steps: int) -> RunSpec:
    data = spec.model_dump()
    data["grpo"]["max_steps"] = steps
    return RunSpec.model_validate(data)


def hidden(folder: Path) -> list[str]:
    """A sandbox in which ``folder`` is an empty, read-only one: another host, where node 0's path
    is not this run's (bubblewrap)."""
    folder.mkdir(parents=True, exist_ok=True)
    return ["bwrap", "--dev-bind", "/", "/", "--tmpfs", str(folder), "--remount-ro", str(folder)]


def fetched(root: Path, node_0: Path, step: int, name: str) -> tuple[Path, Path]:
    """Node 0's folder with ``step-{step}`` as its newest checkpoint (a copy of ``node_0``), and
    node 1's holding only that checkpoint, as a worker's fetch from the store leaves it."""
    out = root / name
    shutil.copytree(node_0, out)
    for folder in (out / "checkpoints").iterdir():
        if folder.name != f"step-{step}":
            shutil.rmtree(folder)
    node_1 = root / f"{name}-node-1-out"
    shutil.copytree(out / "checkpoints" / f"step-{step}", node_1 / "checkpoints" / f"step-{step}")
    return out, node_1


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("multi-host-checkpoints")


@pytest.fixture(scope="module")
def spec(tiny_model_dir: Path) -> RunSpec:
    return job(tiny_model_dir, "fsdp", prompts_per_step=4, max_steps=4, **COMPARABLE_ADAM)


@pytest.fixture(scope="module")
def one(spec: RunSpec, root: Path) -> Path:
    """The uninterrupted run, in one process."""
    return train(spec, root, "one", 1)


@pytest.fixture(scope="module")
def to_step_2(spec: RunSpec, root: Path) -> Path:
    """Hosts 0 -> 2, node 1 in a sandbox where node 0's folder is empty and read-only."""
    out = train_on_hosts(with_max_steps(spec, 2), root, "hosts-to-2", HOSTS, node_1_out=root / "node-1-out",
                         wrapper=hidden(root / "hosts-to-2"))
    return out


def test_across_hosts_rank_0_writes_the_whole_checkpoint_and_the_other_host_nothing(to_step_2, root):
    # Node 1 trained, although node 0's folder was never there for it; its own stayed unmade.
    assert not (root / "node-1-out").exists()
    step_1, step_2 = (to_step_2 / "checkpoints" / f"step-{n}" for n in (1, 2))
    # Step 1 ended inside its generation round: each rank's share, both written by rank 0.
    assert sorted(p.name for p in step_1.glob("experience*")) == SHARES
    # The non-distributed format: the gathered weights and optimizer state, no shards.
    assert (step_2 / "model.safetensors").is_file() and (step_2 / "optimizer.pt").is_file()
    assert not any((to_step_2 / "checkpoints").glob("*/distributed"))


def test_a_checkpoint_across_hosts_resumes_in_one_process(spec, one, to_step_2, root):
    resumed = root / "resumed-in-one"
    shutil.copytree(to_step_2, resumed)
    train(spec, root, resumed.name, 1, resume=True)
    assert_same_run(one, resumed, step=4)
    assert [e["type"] for e in records(resumed, "events")].count("resumed") == 1


@pytest.fixture(scope="module")
def hosts_to_step_3(spec: RunSpec, root: Path) -> Path:
    """Hosts 2 -> 3 from a sharded checkpoint two ranks of one host wrote (each its shards, in
    ``distributed/``); step 3 ends inside its generation round."""
    on_one_host = train(with_max_steps(spec, 2), root, "one-host-to-2", 2)
    assert (on_one_host / "checkpoints" / "step-2" / "distributed").is_dir()
    out, node_1 = fetched(root, on_one_host, 2, "hosts-2-to-3")
    return train_on_hosts(with_max_steps(spec, 3), root, out.name, HOSTS, node_1_out=node_1, resume=True)


def test_a_sharded_checkpoint_of_one_host_resumes_across_hosts(one, hosts_to_step_3):
    assert_same_run(one, hosts_to_step_3, step=3)
    step_3 = hosts_to_step_3 / "checkpoints" / "step-3"
    assert sorted(p.name for p in step_3.glob("experience*")) == SHARES


def test_a_checkpoint_inside_a_generation_round_resumes_across_hosts(spec, one, hosts_to_step_3, root):
    # 3 -> 4 across hosts: each rank resumes its own share of the pending round, from its copy.
    resumed, node_1 = fetched(root, hosts_to_step_3, 3, "hosts-3-to-4")
    train_on_hosts(spec, root, resumed.name, HOSTS, node_1_out=node_1, resume=True)
    assert_same_run(one, resumed, step=4)


def test_hosts_that_found_different_newest_checkpoints_refuse_to_resume(spec, to_step_2, root):
    # Node 1's folder never got node 0's checkpoint (no store between them): were it to start at
    # step 0 while node 0 resumes at 2, their collectives would part ways. Both refuse instead.
    resumed = root / "resumed-unfetched"
    shutil.copytree(to_step_2, resumed)
    node_0, node_1 = host_groups(HOSTS)
    common = dict(resume=True, device="cpu", progress=False, hang_timeout=HANG)
    with other_host(root / "unfetched-node-1", run_data_parallel, spec, root, root / "unfetched-node-1-out",
                    HOSTS[1], hosts=node_1, **common) as node:
        with pytest.raises(RankFailed) as refused:
            run_data_parallel(spec, root, resumed, HOSTS[0], hosts=node_0, **common)
        kind, (error, code, _) = node.outcome()
    assert refused.value.code == code == "resume_unsupported" and (kind, error) == ("error", "RankFailed")
    message = refused.value.message
    assert "rank 0: step-2, rank 1: none" in message and "GRPO_STORAGE_URL" in message
