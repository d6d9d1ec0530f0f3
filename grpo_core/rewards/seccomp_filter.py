"""The seccomp filter the code sandbox (:mod:`grpo_core.rewards.sandbox`) runs programs under, as the
compiled classic-BPF program that bubblewrap's ``--seccomp FD`` installs before it starts the
sandbox's init. Emitted here rather than through libseccomp: the program is a few dozen fixed
instructions, and writing them out needs no library that may be missing on a worker.

What it does, for the machine's own architecture (x86_64 or aarch64; elsewhere
:func:`seccomp_program` raises :class:`SeccompUnsupported` and the sandbox is unavailable, since
the filter is a mandatory protection):

* a system call made through any other ABI (i386's ``int 0x80`` on x86_64, or the x32 ABI whose
  numbers carry bit 30) is refused: the table below would not name its calls, so a denied call
  could be reached under another number;
* the calls in :data:`DENIED` fail with ``EPERM``. Each is named there with its reason; together:
  debugging another process (ptrace and its relatives: the attack that took over bwrap's reaper
  through ``/proc/1/mem`` went this way), SysV IPC (shared memory outside ``RLIMIT_AS``: 768 MiB
  held under a 256 MiB limit), memory the address-space limit does not count (memfd), new
  namespaces and mounts (a private tmpfs past the ``/tmp`` cap), the kernel's keyring, BPF,
  perf, modules, kexec, userfaultfd and io_uring (kernel attack surface a test program never needs),
  ``modify_ldt`` (x86's per-process descriptor tables: a long line of kernel exploits, and nothing a
  64-bit program uses);
* ``socket`` and ``socketpair`` for any address family but ``AF_UNIX`` fail with ``EAFNOSUPPORT``,
  as on a kernel built without that family (so a program that probes for one takes its usual
  fallback). The network namespace has no route out, but it does not isolate every family:
  ``AF_VSOCK`` reaches the hypervisor's host and other VMs' services whatever the namespace, and
  netlink, packet and the rest are kernel surface a test program never needs. ``AF_UNIX`` stays:
  Python's ``multiprocessing`` and ``socket.socketpair`` use it, and it reaches nothing outside the
  sandbox's own mount view;
* ``clone`` with any ``CLONE_NEW*`` flag fails with ``EPERM`` (a plain fork or thread is fine);
* ``clone3`` fails with ``ENOSYS``: its flags live in a struct that seccomp cannot read, so it
  cannot be filtered like ``clone``; ``ENOSYS`` makes libc fall back to ``clone``;
* everything else is allowed.
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["AF_UNIX", "DENIED", "FAMILY_CHECKED", "SeccompUnsupported", "seccomp_program"]

# name: (number on x86_64, number on aarch64, why). None: the call does not exist there.
DENIED: dict[str, tuple[int | None, int | None, str]] = {
    "ptrace": (101, 117, "attach to init or a sibling and rewrite it"),
    "process_vm_readv": (310, 270, "read another process's memory"),
    "process_vm_writev": (311, 271, "write another process's memory"),
    "pidfd_getfd": (438, 438, "steal another process's file descriptors"),
    "kcmp": (312, 272, "inspect another process's kernel objects"),
    "process_madvise": (440, 440, "act on another process's memory"),
    "shmget": (29, 194, "SysV shared memory is not counted by RLIMIT_AS"),
    "shmat": (30, 196, "SysV shared memory"),
    "shmdt": (67, 197, "SysV shared memory"),
    "shmctl": (31, 195, "SysV shared memory"),
    "msgget": (68, 186, "SysV message queues hold kernel memory"),
    "msgsnd": (69, 189, "SysV message queues"),
    "msgrcv": (70, 188, "SysV message queues"),
    "msgctl": (71, 187, "SysV message queues"),
    "semget": (64, 190, "SysV semaphores"),
    "semop": (65, 193, "SysV semaphores"),
    "semtimedop": (220, 192, "SysV semaphores"),
    "semctl": (66, 191, "SysV semaphores"),
    "memfd_create": (319, 279, "file memory outside RLIMIT_AS"),
    "memfd_secret": (447, 447, "memory outside RLIMIT_AS"),
    "unshare": (272, 97, "new namespaces: a private tmpfs past the /tmp cap"),
    "setns": (308, 268, "enter other namespaces"),
    "mount": (165, 40, "mounts (a tmpfs past the /tmp cap)"),
    "umount2": (166, 39, "unmount the read-only view"),
    "pivot_root": (155, 41, "rearrange the root"),
    "chroot": (161, 51, "rearrange the root"),
    "open_tree": (428, 428, "new-style mounts"),
    "move_mount": (429, 429, "new-style mounts"),
    "fsopen": (430, 430, "new-style mounts"),
    "fsconfig": (431, 431, "new-style mounts"),
    "fsmount": (432, 432, "new-style mounts"),
    "fspick": (433, 433, "new-style mounts"),
    "mount_setattr": (442, 442, "new-style mounts"),
    "open_by_handle_at": (304, 265, "open files by handle, past the mount view"),
    "name_to_handle_at": (303, 264, "file handles"),
    "keyctl": (250, 219, "the kernel keyring is shared beyond the sandbox"),
    "add_key": (248, 217, "the kernel keyring"),
    "request_key": (249, 218, "the kernel keyring"),
    "bpf": (321, 280, "kernel attack surface"),
    "perf_event_open": (298, 241, "kernel attack surface, side channels"),
    "userfaultfd": (323, 282, "stalls the kernel at will: exploit primitive"),
    "io_uring_setup": (425, 425, "kernel attack surface, bypasses this filter's view"),
    "io_uring_enter": (426, 426, "io_uring"),
    "io_uring_register": (427, 427, "io_uring"),
    "kexec_load": (246, 104, "replace the kernel"),
    "kexec_file_load": (320, 294, "replace the kernel"),
    "init_module": (175, 105, "kernel modules"),
    "finit_module": (313, 273, "kernel modules"),
    "delete_module": (176, 106, "kernel modules"),
    "fanotify_init": (300, 262, "watch the filesystem"),
    "syslog": (103, 116, "the kernel's log"),
    "acct": (163, 89, "process accounting"),
    "quotactl": (179, 60, "quotas"),
    "swapon": (167, 224, "swap"),
    "swapoff": (168, 225, "swap"),
    "reboot": (169, 142, "reboot"),
    "lookup_dcookie": (212, 18, "profiling"),
    "iopl": (172, None, "port I/O"),
    "ioperm": (173, None, "port I/O"),
    "uselib": (134, None, "obsolete loader call"),
    "nfsservctl": (180, 42, "obsolete"),
    "modify_ldt": (154, None, "x86 descriptor tables: kernel attack surface"),
}
# Calls whose first argument is an address family: allowed for AF_UNIX only. name -> (x86_64, aarch64)
FAMILY_CHECKED: dict[str, tuple[int, int]] = {"socket": (41, 198), "socketpair": (53, 199)}
AF_UNIX = 1
_CLONE = {"x86_64": 56, "aarch64": 220}
_CLONE3 = 435  # the same number on both
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME: all in clone's low 32 bits.
_CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
    | 0x40000000 | 0x00000080

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000

# Classic BPF opcodes (linux/filter.h) and seccomp's return values (linux/seccomp.h).
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # args[0]'s low half is at 16 on these little-endian machines


class SeccompUnsupported(RuntimeError):
    """No filter is known for this machine's architecture."""


def _instruction(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)  # struct sock_filter, in the kernel's byte order


def _deny(number: int, error: int) -> bytes:
    """If the call is ``number``, fail it with ``error``; else go on to the next test."""
    return _instruction(_JEQ_K, number, 0, 1) + _instruction(_RET_K, _RET_ERRNO | error)


def _unix_only(number: int) -> bytes:
    """If the call is ``number``, allow it for ``AF_UNIX`` and fail it with ``EAFNOSUPPORT`` for
    every other family; both end the program, so the accumulator is the call's number again for
    the next test. Only the argument's low 32 bits are read: the kernel's ``int family`` is those."""
    return (_instruction(_JEQ_K, number, 0, 4) + _instruction(_LD_W_ABS, _ARG0_LOW)
            + _instruction(_JEQ_K, AF_UNIX, 0, 1) + _instruction(_RET_K, _RET_ALLOW)
            + _instruction(_RET_K, _RET_ERRNO | errno.EAFNOSUPPORT))


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (``platform.machine()`` by default), ready to hand to bwrap."""
    machine = machine or platform.machine()
    if machine == "arm64":
        machine = "aarch64"
    if machine not in _AUDIT_ARCH:
        raise SeccompUnsupported(f"no seccomp filter for the {machine} architecture")
    column = 0 if machine == "x86_64" else 1
    program = _instruction(_LD_W_ABS, _ARCH)
    program += _instruction(_JEQ_K, _AUDIT_ARCH[machine], 1, 0) + _instruction(_RET_K, _RET_KILL_PROCESS)
    program += _instruction(_LD_W_ABS, _NR)
    if machine == "x86_64":
        program += _instruction(_JGE_K, _X32_SYSCALL_BIT, 0, 1)
        program += _instruction(_RET_K, _RET_ERRNO | errno.EPERM)
    for numbers in DENIED.values():
        if numbers[column] is not None:
            program += _deny(numbers[column], errno.EPERM)
    program += _deny(_CLONE3, errno.ENOSYS)
    for numbers in FAMILY_CHECKED.values():
        program += _unix_only(numbers[column])
    # Last, so that both its outcomes fall through to the final allow.
    program += _instruction(_JEQ_K, _CLONE[machine], 0, 3)
    program += _instruction(_LD_W_ABS, _ARG0_LOW)
    program += _instruction(_JSET_K, _CLONE_NEW_FLAGS, 0, 1) + _instruction(_RET_K, _RET_ERRNO | errno.EPERM)
    return program + _instruction(_RET_K, _RET_ALLOW)
