"""Two "hosts" on this machine for the tests of ranks that span hosts: this test's process is one
node, a child Python process the other, joined through one rendezvous at node 0, as the
service's workers of a gang are."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from test_distributed import HANG

from grpo_core.errors import GRPOError
from grpo_core.run.host_group import HostGroup, free_port
from grpo_core.run.launch import run_data_parallel
from grpo_core.spec.run_spec import RunSpec

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
def other_host(folder: Path, function: Callable[..., Any], *args: Any, wrapper: Sequence[str] = (),
               **kwargs: Any) -> Iterator[OtherHost]:
    """``function(*args, **kwargs)`` in a new Python process (it must be importable: a module-level
    function of the core or of a test module), its command prefixed by ``wrapper`` (a sandbox);
    killed if the test leaves before it ends."""
    folder.mkdir(parents=True)
    (folder / "call.pkl").write_bytes(pickle.dumps((function, args, kwargs)))
    script = "import sys; from multi_host import run_node; run_node(sys.argv[1])"
    path = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    process = subprocess.Popen([*wrapper, sys.executable, "-c", script, str(folder)], env=env, cwd=REPO)
    try:
        yield OtherHost(process, folder)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def train_on_hosts(spec: RunSpec, root: Path, name: str, node_sizes: tuple[int, ...], *,
                   node_1_out: Path | None = None, resume: bool = False,
                   wrapper: Sequence[str] = ()) -> Path:
    """The run on two hosts: node 1 in a child process (behind ``wrapper``), node 0 here. Node 0's
    output folder is ``root/name`` (returned); node 1's is ``node_1_out``, by default the same."""
    node_0, node_1 = host_groups(node_sizes)
    out = root / name
    common = dict(resume=resume, device="cpu", progress=False, hang_timeout=HANG)
    with other_host(root / f"{name}-node-1", run_data_parallel, spec, root, node_1_out or out, node_sizes[1],
                    hosts=node_1, wrapper=wrapper, **common) as node:
        run_data_parallel(spec, root, out, node_sizes[0], hosts=node_0, **common)
        assert node.value().step == spec.grpo.max_steps
    return out
