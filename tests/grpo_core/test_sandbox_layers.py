"""The code sandbox's layers on their own: the seccomp filter's table and program
(``grpo_core.rewards.seccomp_filter``), the minimal mounts (``sandbox_mounts``), the per-run cgroup's
decision and its gate (``sandbox_cgroup``; this host has no delegated cgroup v2, so the decision
is checked on a folder made to look like one), and the probe's verdict on which protections hold."""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_guard import needs_sandbox

from grpo_core.rewards.sandbox import (
    MANDATORY,
    Limits,
    check_sandbox,
    interpreter,
    mandatory_problem,
    protections_seen,
    run_python,
)
from grpo_core.rewards.sandbox_cgroup import (
    CGROUP_VARIABLE,
    RunCgroup,
    delegated_cgroup,
    delegation_problem,
    filesystem_type,
)
from grpo_core.rewards.sandbox_mounts import interpreter_mounts, ldd_paths
from grpo_core.rewards.seccomp_filter import DENIED, FAMILY_CHECKED, SeccompUnsupported, seccomp_program

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # libseccomp's arch tokens are these


def _libseccomp():
    name = ctypes.util.find_library("seccomp")
    return ctypes.CDLL(name) if name else None


@pytest.mark.skipif(_libseccomp() is None, reason="libseccomp is not installed to check the table against")
def test_the_denied_calls_numbers_are_the_kernels_for_both_architectures() -> None:
    resolve = _libseccomp().seccomp_syscall_resolve_name_arch
    resolve.argtypes, resolve.restype = [ctypes.c_uint32, ctypes.c_char_p], ctypes.c_int
    checked = {name: (x86_64, aarch64) for name, (x86_64, aarch64, _) in DENIED.items()}
    for name, (x86_64, aarch64) in {**checked, **FAMILY_CHECKED}.items():
        for arch, number in (("x86_64", x86_64), ("aarch64", aarch64)):
            known = resolve(AUDIT_ARCH[arch], name.encode())
            if number is None:
                assert known < 0, f"{name} exists on {arch} as {known}"  # libseccomp's pseudo-numbers
            else:
                assert known == number, f"{name} on {arch}: {number}, the kernel's {known}"


def test_the_filter_is_whole_bpf_instructions_and_refuses_unknown_architectures() -> None:
    for machine in ("x86_64", "aarch64"):
        program = seccomp_program(machine)
        assert len(program) % 8 == 0 and len(program) // 8 < 4096  # BPF_MAXINSNS
    assert seccomp_program("x86_64") != seccomp_program("aarch64")
    with pytest.raises(SeccompUnsupported, match="riscv64"):
        seccomp_program("riscv64")


def test_ldd_output_gives_the_libraries_and_the_loader() -> None:
    output = ("/usr/bin/python3.11:\n"
              "\tlinux-vdso.so.1 (0x00007ffd)\n"
              "\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f86)\n"
              "\tlibgone.so.1 => not found\n"
              "\t/lib64/ld-linux-x86-64.so.2 (0x00007f86)\n")
    assert ldd_paths(output) == ["/lib/x86_64-linux-gnu/libm.so.6", "/lib64/ld-linux-x86-64.so.2"]


@needs_sandbox
def test_only_the_interpreters_files_are_mounted_and_the_standard_library_works() -> None:
    mounts = interpreter_mounts(interpreter())
    sources = mounts[1::3]
    assert "/usr" not in sources and interpreter() in sources
    outcome = run_python(
        "import collections, itertools, json, math, re, os\n"
        "print(json.dumps({'sum': math.fsum([0.1] * 10), 'words': re.findall(r'\\w+', 'a b'),\n"
        "                  'pairs': list(itertools.pairwise('abc')),\n"
        "                  'n': collections.Counter('aab')['a']}))\n"
        "print(sorted(os.listdir('/usr/bin')))\n"
        "print(os.path.exists('/usr/share'), os.path.exists('/usr/bin/env'), os.path.exists('/bin/sh'))\n")
    assert outcome.ok, outcome.stderr
    result, programs, others = outcome.stdout.splitlines()
    assert result == '{"sum": 1.0, "words": ["a", "b"], "pairs": [["a", "b"], ["b", "c"]], "n": 2}'
    assert programs in ("[]", repr([Path(interpreter()).name]))
    assert others == "False False False"


MOUNTINFO = (
    "25 1 0:21 / / rw,relatime - overlay overlay rw\n"
    "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    "31 30 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
)


def test_the_file_system_of_a_path_is_that_of_its_deepest_mount() -> None:
    assert filesystem_type(MOUNTINFO, "/sys/fs/cgroup/grpo.slice") == "cgroup2"
    assert filesystem_type(MOUNTINFO, "/sys/fs/cgroup/memory/x") == "cgroup"
    assert filesystem_type(MOUNTINFO, "/sys/fs/cgroupish") == "overlay"


def test_a_cgroup_folder_is_used_only_when_cgroup_v2_delegates_memory_and_pids(tmp_path: Path) -> None:
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory\n")
    assert "not in a cgroup v2" in delegation_problem(tmp_path, "cgroup")
    assert delegation_problem(tmp_path, "cgroup2").endswith("does not enable pids")
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert delegation_problem(tmp_path, "cgroup2") is None
    assert "cannot read" in delegation_problem(tmp_path / "missing", "cgroup2") or \
        "not a cgroup folder" in delegation_problem(tmp_path / "missing", "cgroup2")


def test_without_a_named_folder_there_is_no_cgroup_and_the_reason_names_the_variable(monkeypatch) -> None:
    monkeypatch.delenv(CGROUP_VARIABLE, raising=False)
    assert delegated_cgroup() == (None, f"no delegated cgroup v2 folder is named in {CGROUP_VARIABLE}")
    monkeypatch.setenv(CGROUP_VARIABLE, "/tmp")
    base, why = delegated_cgroup()
    assert base is None and "not in a cgroup v2 hierarchy" in why


def test_the_gate_holds_the_command_until_its_process_was_moved(tmp_path: Path) -> None:
    cgroup = RunCgroup(tmp_path, memory_bytes=2**30, tasks=17)
    assert (cgroup.path / "memory.max").read_text() == f"{2**30}\n"
    assert (cgroup.path / "pids.max").read_text() == "17\n"
    process = subprocess.Popen(cgroup.gated(["echo", "started"], sys.executable), stdout=subprocess.PIPE,
                               text=True, pass_fds=(cgroup.gate_read,))
    time.sleep(0.3)
    assert process.poll() is None  # waiting at the gate: nothing of the command ran
    cgroup.admit(process.pid)
    assert process.communicate(timeout=10)[0] == "started\n"
    assert (cgroup.path / "cgroup.procs").read_text() == f"{process.pid}\n"


def test_a_gate_whose_opener_is_gone_never_runs_the_command(tmp_path: Path) -> None:
    cgroup = RunCgroup(tmp_path, memory_bytes=2**30, tasks=17)
    process = subprocess.Popen(cgroup.gated(["echo", "started"], sys.executable), stdout=subprocess.PIPE,
                               text=True, pass_fds=(cgroup.gate_read,))
    cgroup.close_gate()
    assert process.communicate(timeout=10)[0] == "" and process.returncode != 0


@needs_sandbox
def test_the_probe_finds_every_mandatory_protection_active_here() -> None:
    check = check_sandbox()
    assert check.problem is None, check
    assert all(check.protections[name] is None for name in MANDATORY)
    assert set(check.protections) == {*MANDATORY, "cgroup"}
    assert "active: seccomp, no_userns, limits_on_init, minimal_mounts" in check.describe()


def test_a_report_like_the_old_sandboxs_is_refused() -> None:
    # What the probe's program printed under the old launcher: no filter, bwrap's own reaper as
    # init with no limits, all of /usr visible.
    limits = Limits()
    unlimited = "Max address space         unlimited            unlimited            bytes\n" \
                "Max processes             unlimited            unlimited            processes\n"
    report = {"echo": "ko", "ppid": 1, "seccomp": ["0"], "init_seccomp": ["0"], "init_limits": unlimited,
              "programs": ["bash", "python3", "sh"]}
    protections = protections_seen(report)
    assert protections["seccomp"] and protections["limits_on_init"] and protections["minimal_mounts"]
    problem = mandatory_problem(protections)
    assert problem.startswith("mandatory sandbox protections are not active: seccomp")
    held = dict(report, seccomp=["2"], init_seccomp=["2"], programs=[], init_limits=(
        f"Max address space {limits.memory_bytes} {limits.memory_bytes} bytes\n"
        f"Max processes {limits.processes} {limits.processes} processes\n"))
    assert mandatory_problem(protections_seen(held)) is None
