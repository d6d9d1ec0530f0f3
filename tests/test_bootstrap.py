""".ci/bootstrap's choice of torch build, run as written on a copy of the script: ``nvidia-smi`` is a
script on ``PATH`` that lists a GPU, fails as it does without a driver, or is absent, and the
interpreter is a stand-in that records every command the bootstrap gives it (pip's included) and
installs nothing. What is checked is the install command each machine gets: the CPU build from
PyTorch's CPU index (short timeout, no retries) unless a GPU is there or GRPO_TORCH_BUILD asks."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TOOLS = ("bash", "dirname", "uname", "grep", "mkdir", "cp")  # what the script and the stand-in call
LISTS_A_GPU = "echo 'GPU 0: NVIDIA H200 (UUID: GPU-0c4f7a9e)'"
NO_DRIVER = ("echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; "
             "exit 9")
# The interpreter's stand-in: records its arguments; `-m venv DIR` makes DIR/bin/{python,grpo} (itself);
# torch is never importable, so the bootstrap installs it.
RECORDING_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$BOOTSTRAP_RECORD"
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; cp "$0" "$3/bin/grpo"
fi
if [ "$1" = -c ] && [ "$2" = "import torch" ]; then exit 1; fi
exit 0
"""


def _script(path: Path, body: str) -> Path:
    path.write_text(body if body.startswith("#!") else f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)
    return path


def bootstrap(tmp_path: Path, nvidia_smi: str | None, *args: str,
              **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run a copy of .ci/bootstrap in an empty checkout with only ``TOOLS`` (and ``nvidia_smi``,
    a script body, unless None) on PATH; its output and the commands the interpreter got."""
    checkout, bin_dir = tmp_path / "checkout", tmp_path / "bin"
    (checkout / ".ci").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy(REPO / ".ci" / "bootstrap", checkout / ".ci" / "bootstrap")
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if nvidia_smi is not None:
        _script(bin_dir / "nvidia-smi", nvidia_smi)
    record = tmp_path / "record"
    record.touch()
    environment = {"PATH": str(bin_dir), "HOME": str(tmp_path), "BOOTSTRAP_RECORD": str(record),
                   "PYTHON": str(_script(tmp_path / "python3.11", RECORDING_PYTHON)), **env}
    done = subprocess.run(["bash", str(checkout / ".ci" / "bootstrap"), *args], env=environment,
                          capture_output=True, text=True, timeout=60)
    return done, record.read_text().splitlines()


def torch_install(commands: list[str]) -> str:
    [install] = [command for command in commands
                 if command.startswith("-m pip install") and "torch" in command]
    return install


@pytest.mark.parametrize("nvidia_smi", [None, NO_DRIVER], ids=["no nvidia-smi", "no driver"])
def test_a_machine_without_a_gpu_gets_the_cpu_build_from_pytorchs_cpu_index(tmp_path, nvidia_smi) -> None:
    done, commands = bootstrap(tmp_path, nvidia_smi)
    assert done.returncode == 0, done.stderr
    assert "build: cpu (no GPU found by nvidia-smi" in done.stdout
    assert torch_install(commands) == (f"-m pip install -q torch==2.13.0+cpu --extra-index-url {CPU_INDEX} "
                                       "--timeout 10 --retries 0")
    # The project's own install comes after, and finds torch there (its requirement is plain torch).
    assert commands.index(torch_install(commands)) < commands.index("-m pip install -q -e .[test]")


def test_a_machine_whose_nvidia_smi_lists_a_gpu_gets_pypis_cuda_build(tmp_path) -> None:
    done, commands = bootstrap(tmp_path, LISTS_A_GPU)
    assert done.returncode == 0, done.stderr
    assert "build: cuda (nvidia-smi lists a GPU)" in done.stdout
    assert torch_install(commands) == "-m pip install -q torch==2.13.0"


@pytest.mark.parametrize(("nvidia_smi", "asked", "install"), [
    (None, "cuda", "-m pip install -q torch==2.13.0"),
    (LISTS_A_GPU, "cpu", f"-m pip install -q torch==2.13.0+cpu --extra-index-url {CPU_INDEX} --timeout 10 "
                         "--retries 0"),
])
def test_grpo_torch_build_overrides_what_the_machine_has(tmp_path, nvidia_smi, asked, install) -> None:
    done, commands = bootstrap(tmp_path, nvidia_smi, GRPO_TORCH_BUILD=asked)
    assert done.returncode == 0, done.stderr
    assert f"build: {asked} (GRPO_TORCH_BUILD)" in done.stdout
    assert torch_install(commands) == install


def test_an_unknown_build_is_refused_before_anything_is_installed(tmp_path) -> None:
    done, commands = bootstrap(tmp_path, None, GRPO_TORCH_BUILD="rocm")
    assert done.returncode == 2
    assert "GRPO_TORCH_BUILD must be auto, cpu or cuda, not 'rocm'" in done.stderr
    assert commands == []


def test_dry_run_prints_the_install_and_changes_nothing(tmp_path) -> None:
    done, commands = bootstrap(tmp_path, None, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"pip install torch==2.13.0+cpu --extra-index-url {CPU_INDEX}" in done.stdout
    assert commands == [] and not (tmp_path / "checkout" / ".venv").exists()


def test_the_readme_documents_the_choice() -> None:
    readme = (REPO / "README.md").read_text()
    assert "GRPO_TORCH_BUILD" in readme and CPU_INDEX in readme
