"""Where a job's devices come from during one pass of :mod:`api.scheduling.policy` (which owns
the rules and the order; its docstring states them), above all for a job spanning hosts (a
gang): which workers and how many devices on each, as pure arithmetic on device counts. Apart
from the policy so that each stays one readable file.

A gang is formed only when it can start at once on every host (all or nothing), so what is
decided here is (1) the shares of a gang that can start now (:func:`gang_shares`), (2) the hosts
a gang that cannot start yet has reserved for it, so that jobs behind it do not keep those hosts
busy forever (:func:`reserved_shares`), and (3) the free device counts of a pool as a pass takes
them, for one-worker jobs and gangs alike (:class:`Capacity`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Iterable

from api.domain.cluster_state import HoldingJob, Worker


def hosts_held(holder: HoldingJob) -> list[tuple[str | None, tuple[int, ...]]]:
    """Every (worker, device indices) a holder keeps busy: node 0's, then a gang's other hosts'."""
    return [(holder.worker_id, holder.devices), *((share.worker_id, share.devices) for share in holder.gang)]


def node_order(shares: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """Shares in node-rank order: the biggest share first (node 0 is the rendezvous host, and the
    one holding most ranks), equal shares by worker id, so the order never depends on input order."""
    return sorted(shares, key=lambda share: (-share[1], share[0]))


def gang_shares(gpus: int, free: Iterable[tuple[int, str]]) -> list[tuple[str, int]] | None:
    """How a gang of ``gpus`` GPUs starts now on the workers whose free device counts are ``free``
    (pairs of count and worker id): (worker, share) in node-rank order, or None when they hold
    fewer than ``gpus`` devices together. Fewest hosts: the workers with the most devices free are
    taken whole, until what is left fits one worker; of the workers that fit it, the one with the
    fewest free devices takes it (best fit: a big free block elsewhere stays whole)."""
    ranked = sorted(((count, worker) for count, worker in free if count > 0), key=lambda e: (-e[0], e[1]))
    if sum(count for count, _ in ranked) < gpus:
        return None
    shares: list[tuple[str, int]] = []
    left = gpus
    for place, (count, worker) in enumerate(ranked):
        if count >= left:
            last = min((entry for entry in ranked[place:] if entry[0] >= left), key=lambda e: (e[0], e[1]))
            shares.append((last[1], left))
            break
        shares.append((worker, count))
        left -= count
    return node_order(shares)


def reserved_shares(gpus: int, hosts: Iterable[tuple[str, int, int]]) -> list[tuple[str, int]]:
    """The hosts a gang of ``gpus`` GPUs that cannot start now waits for, and its share of each,
    from ``hosts`` (worker id, size, free devices now): as few hosts as their sizes allow,
    preferring the hosts with the most devices free now (then the bigger, then the lower id), each
    taking as much of the job as its size holds in that order. Stable from pass to pass while the
    chosen hosts only gain free devices, since their rank only rises. Empty when even all the
    hosts together are too small (the job is then ``too_large``, never reserved for)."""
    candidates = sorted(hosts, key=lambda h: (-h[2], -h[1], h[0]))
    by_size = sorted(candidates, key=lambda h: (-h[1], h[0]))
    total, fewest = 0, 0
    for _, size, _ in by_size:
        if total >= gpus:
            break
        total, fewest = total + size, fewest + 1
    if total < gpus:
        return []
    chosen: list[tuple[str, int, int]] = []
    covered = 0
    for host in candidates:
        if len(chosen) == fewest:
            break
        # Take the host if the hosts still to choose can complete the job with it: the biggest of
        # the others. A host refused here can never complete a later choice either.
        slots = fewest - len(chosen) - 1
        taken = {h[0] for h in chosen} | {host[0]}
        best_rest = sum([size for worker, size, _ in by_size if worker not in taken][:slots])
        if covered + host[1] + best_rest >= gpus:
            chosen.append(host)
            covered += host[1]
    shares = []
    left = gpus
    for worker, size, _ in chosen:
        shares.append((worker, min(size, left)))
        left -= min(size, left)
    return shares


class Capacity:
    """A pool's free devices during one pass, its workers grouped by the capabilities they
    advertise (a handful of distinct sets, usually one): a job looks only at the groups that cover
    what it requires, and takes the best fit among them. Devices reserved for a gang are not free
    for the jobs after it (``reserved``: worker -> how many)."""

    def __init__(self, workers: list[Worker], devices: dict[str, list[int]], classes: int) -> None:
        self.free: dict[frozenset[str], list[tuple[int, str]]] = {}  # (free devices, worker), ascending
        self.count = {w.worker_id: len(devices[w.worker_id]) for w in workers}
        self.caps_of = {w.worker_id: w.capabilities for w in workers}
        self.members: dict[frozenset[str], list[tuple[str, int]]] = defaultdict(list)  # (worker, size)
        self.reserved: dict[str, int] = {}
        for worker in workers:
            group = self.free.setdefault(worker.capabilities, [])
            self.members[worker.capabilities].append((worker.worker_id, worker.gpus))
            if self.count[worker.worker_id]:
                group.append((self.count[worker.worker_id], worker.worker_id))
        for group in self.free.values():
            group.sort()
        # Most free devices a worker of each group had when it went to a job of each class (of
        # ``classes``, most urgent first) in this
        # pass (``given``), and to a job of any class ahead of each class (``above``): a job that
        # finds nothing free learns whether room it could have used went to a higher class or to
        # its own. Kept as running maxima, since most of a long queue asks.
        self.given = {caps: [0] * classes for caps in self.free}
        self.above = {caps: [0] * classes for caps in self.free}
        self._usable: dict[frozenset[str], tuple[list[frozenset[str]], int, int]] = {}

    def usable(self, requires: frozenset[str]) -> tuple[list[frozenset[str]], int, int]:
        """The groups whose workers advertise everything in ``requires``, the most GPUs one of
        their workers has and the GPUs of all of them (memoised: a queue holds few distinct
        requirements)."""
        found = self._usable.get(requires)
        if found is None:
            groups = [caps for caps in self.free if requires <= caps]
            sizes = [size for caps in groups for _, size in self.members[caps]]
            found = self._usable[requires] = (groups, max(sizes, default=0), sum(sizes))
        return found

    def _set(self, worker_id: str, count: int) -> None:
        """Change a worker's free count, keeping its group sorted."""
        group = self.free[self.caps_of[worker_id]]
        old = self.count[worker_id]
        if old:
            del group[bisect_left(group, (old, worker_id))]
        if count:
            insort(group, (count, worker_id))
        self.count[worker_id] = count

    def _given(self, worker_id: str, count: int, rank: int) -> None:
        """Record that a worker with ``count`` free devices went to a job of class ``rank``."""
        caps = self.caps_of[worker_id]
        given, above = self.given[caps], self.above[caps]
        given[rank] = max(given[rank], count)
        for lower in range(rank + 1, len(above)):
            above[lower] = max(above[lower], count)

    def take(self, gpus: int, groups: list[frozenset[str]], rank: int) -> str | None:
        """The worker of ``groups`` with the fewest free devices, at least ``gpus``, for a job of
        class ``rank``, its devices taken; None when none fits."""
        best: tuple[int, str] | None = None
        for caps in groups:
            group = self.free[caps]
            fit = bisect_left(group, (gpus, ""))
            if fit < len(group) and (best is None or group[fit] < best):
                best = group[fit]
        if best is None:
            return None
        count, worker_id = best
        self._set(worker_id, count - gpus)
        self._given(worker_id, count, rank)
        return worker_id

    def take_gang(self, gpus: int, groups: list[frozenset[str]], rank: int) -> list[tuple[str, int]] | None:
        """A gang's (worker, share) in node-rank order, its devices taken, or None when the workers
        of ``groups`` have too few free devices together (see :func:`gang_shares`)."""
        shares = gang_shares(gpus, (entry for caps in groups for entry in self.free[caps]))
        for worker_id, share in shares or ():
            count = self.count[worker_id]
            self._set(worker_id, count - share)
            self._given(worker_id, count, rank)
        return shares

    def reserve(self, gpus: int, groups: list[frozenset[str]]) -> None:
        """Hold back for a gang that cannot start the devices free now on the hosts it waits for,
        up to its share of each (see :func:`reserved_shares`)."""
        hosts = [(worker_id, size, self.count[worker_id])
                 for caps in groups for worker_id, size in self.members[caps]]
        for worker_id, share in reserved_shares(gpus, hosts):
            held = min(share, self.count[worker_id])
            if held:
                self._set(worker_id, self.count[worker_id] - held)
                self.reserved[worker_id] = held

    def fits_but_for_reservation(self, gpus: int, groups: list[frozenset[str]], gang: bool) -> bool:
        """Whether a job that found no room would have found it with the reserved devices."""
        mine = [worker_id for worker_id in self.reserved if self.caps_of[worker_id] in groups]
        if not mine:
            return False
        if gang:
            free = sum(count for caps in groups for count, _ in self.free[caps])
            return free + sum(self.reserved[worker_id] for worker_id in mine) >= gpus
        return any(self.count[worker_id] + self.reserved[worker_id] >= gpus for worker_id in mine)

    def why_not(self, gpus: int, groups: list[frozenset[str]], rank: int) -> str:
        """Why a job of class ``rank`` found no worker of ``groups`` with ``gpus`` free devices."""
        for caps in groups:
            if self.above[caps][rank] >= gpus:
                return "lower_priority"
        for caps in groups:
            if self.given[caps][rank] >= gpus:
                return "fair_share"
        return "no_capacity"
