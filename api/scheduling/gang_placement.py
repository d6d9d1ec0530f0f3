"""Where a job spanning hosts (a gang) goes: which workers and how many devices on each, as pure
arithmetic on device counts, for :mod:`api.scheduling.policy` (which owns the rules and the
order; its docstring states them). Apart from the policy so that each stays one readable file.

A gang is formed only when it can start at once on every host (all or nothing), so what is
decided here is (1) the shares of a gang that can start now and (2) the hosts a gang that cannot
start yet has reserved for it, so that jobs behind it do not keep those hosts busy forever.
"""

from __future__ import annotations

from collections.abc import Iterable

from api.cluster_state import HoldingJob


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
