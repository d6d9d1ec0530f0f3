"""The scheduling policy's jobs that span hosts (gangs), on hand-built states with every expected
plan worked out by hand: placement on the fewest hosts, all or none, the reservation that keeps a
waiting gang from starving and its stability from pass to pass, holders' devices on every host,
quotas and preemption. The rules are the docstring of ``api.scheduling.policy``; the arithmetic is
``api.scheduling.gang_placement``. Pure: no database, no clock."""

from __future__ import annotations

from api.domain.cluster_state import ClusterState, HoldingJob, Share, Team, WaitingJob, Worker
from api.scheduling.gang_placement import gang_shares, reserved_shares
from api.scheduling.policy import Dispatch, Plan, Preemption, plan

SANDBOX = frozenset({"code_sandbox"})


def workers(*sizes: tuple[str, int], capabilities: frozenset[str] = frozenset()) -> list[Worker]:
    return [Worker(name, "a", gpus, capabilities=capabilities) for name, gpus in sizes]


def waiting(job_id: int, gpus: int, team: int = 1, priority: str = "normal",
            requires: frozenset[str] = frozenset()) -> WaitingJob:
    return WaitingJob(job_id, team, "a", gpus, priority, requires=requires)


def holding(job_id: int, hosts: dict[str | None, tuple[int, ...]], team: int = 2, priority: str = "normal",
            preempt: bool = False) -> HoldingJob:
    """A holder on ``hosts`` (worker -> devices), node 0 first, in a running state."""
    (node0, devices), *others = hosts.items()
    return HoldingJob(job_id, team, "a", sum(len(d) for d in hosts.values()), priority, node0, "running", 0.0,
                      preempt, devices, tuple(Share(worker, d) for worker, d in others))


def state(pool: list[Worker], jobs: list[WaitingJob], holders: list[HoldingJob] = (),
          teams: list[Team] = ()) -> ClusterState:
    return ClusterState(tuple(pool), tuple(jobs), tuple(holders), {t.id: t for t in teams})


def waits(result: Plan) -> tuple[dict[int, str], dict[int, int]]:
    return result.pending, result.position


# ---- placement ----

def test_a_gang_over_two_workers_takes_one_whole_and_the_rest_on_the_other():
    result = plan(state(workers(("a", 4), ("b", 4)), [waiting(1, 6)]))
    assert result.dispatch == [Dispatch(1, "a", (0, 1, 2, 3), (Share("b", (0, 1)),))]
    assert waits(result) == ({}, {})


def test_a_gang_over_three_workers_in_node_rank_order():
    result = plan(state(workers(("c", 2), ("b", 2), ("a", 2)), [waiting(1, 5)]))
    assert result.dispatch == [Dispatch(1, "a", (0, 1), (Share("b", (0, 1)), Share("c", (0,))))]


def test_fewest_hosts_and_the_last_share_is_the_best_fit():
    pool = workers(("big", 4), ("s1", 1), ("s2", 1), ("mid", 2))
    result = plan(state(pool, [waiting(1, 5)]))
    # 4 + 1 on two hosts, not 4 + ... on more; of the hosts that hold the last GPU, the smallest.
    assert result.dispatch == [Dispatch(1, "big", (0, 1, 2, 3), (Share("s1", (0,)),))]


def test_uneven_shares_keep_a_big_free_block_whole_for_the_next_job():
    result = plan(state(workers(("a", 2), ("b", 2), ("c", 1)), [waiting(1, 3), waiting(2, 2)]))
    assert result.dispatch == [Dispatch(1, "a", (0, 1), (Share("c", (0,)),)), Dispatch(2, "b", (0, 1))]


def test_node_zero_is_the_biggest_share_and_shares_take_the_lowest_free_indices():
    holders = [holding(50, {"a": (0, 1, 2)})]
    result = plan(state(workers(("a", 4), ("z", 4)), [waiting(1, 5)], holders))
    assert result.dispatch == [Dispatch(1, "z", (0, 1, 2, 3), (Share("a", (3,)),))]


def test_a_job_that_fits_one_worker_is_never_split_across_free_devices_elsewhere():
    holders = [holding(50, {"big": (0, 1)})]
    result = plan(state(workers(("big", 4), ("s1", 2), ("s2", 2)), [waiting(1, 4)], holders))
    assert result.dispatch == []
    assert waits(result) == ({1: "no_capacity"}, {1: 1})


def test_all_or_nothing_no_partial_dispatch_when_too_few_devices_are_free():
    holders = [holding(50, {"a": (0,)})]
    result = plan(state(workers(("a", 2), ("b", 2)), [waiting(1, 4)], holders))
    assert result.dispatch == []
    assert waits(result) == ({1: "gang_forming"}, {1: 1})


def test_a_gang_uses_only_workers_with_the_capabilities_it_requires():
    pool = [*workers(("a", 2), ("c", 2), capabilities=SANDBOX), *workers(("b", 2))]
    jobs = [waiting(1, 4, requires=SANDBOX), waiting(2, 6, requires=SANDBOX), waiting(3, 2)]
    result = plan(state(pool, jobs))
    assert result.dispatch == [Dispatch(1, "a", (0, 1), (Share("c", (0, 1)),)), Dispatch(3, "b", (0, 1))]
    # Six GPUs in the pool, but only four on the workers with the sandbox.
    assert waits(result) == ({2: "too_large"}, {2: 1})


def test_too_large_is_more_than_all_capable_workers_together_gang_forming_is_not_free_yet():
    holders = [holding(50, {"a": (0,)})]
    result = plan(state(workers(("a", 2), ("b", 2)), [waiting(1, 5), waiting(2, 4)], holders))
    assert result.dispatch == []
    assert waits(result) == ({1: "too_large", 2: "gang_forming"}, {1: 1, 2: 2})


# ---- reservation ----

def test_the_reservation_holds_devices_against_a_later_job_which_is_backfilled_elsewhere():
    holders = [holding(50, {"a": (0, 1, 2)}), holding(51, {"b": (0,)})]
    jobs = [waiting(1, 6), waiting(2, 1), waiting(3, 1)]
    result = plan(state(workers(("a", 4), ("b", 4), ("c", 1)), jobs, holders))
    # The gang waits for a and b (4 + 4; b has the most free now): their 4 free devices are its.
    assert result.dispatch == [Dispatch(2, "c", (0,))]
    assert waits(result) == ({1: "gang_forming", 3: "reserved"}, {1: 1, 3: 2})


def test_devices_beyond_the_reserved_share_still_go_to_later_jobs():
    holders = [holding(50, {"a": (0, 1)}), holding(51, {"b": (0, 1)})]
    result = plan(state(workers(("a", 4), ("b", 4)), [waiting(1, 5), waiting(2, 1), waiting(3, 1)], holders))
    # Shares 4 on a and 1 on b: a's 2 free and 1 of b's are reserved, b's other free device is not
    # (a reservation is a count: the job takes b's lowest free index, the gang will take the rest).
    assert result.dispatch == [Dispatch(2, "b", (2,))]
    assert waits(result) == ({1: "gang_forming", 3: "reserved"}, {1: 1, 3: 2})


def test_only_the_first_waiting_gang_reserves_a_later_gang_that_would_fit_is_reserved():
    holders = [holding(50, {"a": (0,)}), holding(51, {"b": (0,)})]
    result = plan(state(workers(("a", 2), ("b", 2), ("c", 2)), [waiting(1, 5), waiting(2, 3)], holders))
    assert result.dispatch == []
    assert waits(result) == ({1: "gang_forming", 2: "reserved"}, {1: 1, 2: 2})


def test_the_reservation_is_stable_while_its_hosts_free_and_the_gang_then_starts():
    pool = workers(("a", 4), ("b", 4), ("c", 1))
    jobs = [waiting(1, 6), waiting(2, 1), waiting(3, 1)]
    first = plan(state(pool, jobs, [holding(50, {"a": (0, 1)}), holding(51, {"b": (0,)}),
                                    holding(52, {"b": (1,)})]))
    assert first.dispatch == [Dispatch(2, "c", (0,))]
    assert waits(first) == ({1: "gang_forming", 3: "reserved"}, {1: 1, 3: 2})
    # Job 52 ends; job 2 runs on c. b gains a device: the same hosts stay reserved.
    second = plan(state(pool, [jobs[0], jobs[2]], [holding(50, {"a": (0, 1)}), holding(51, {"b": (0,)}),
                                                   holding(2, {"c": (0,)}, team=1)]))
    assert second.dispatch == []
    assert waits(second) == ({1: "gang_forming", 3: "reserved"}, {1: 1, 3: 2})
    # Job 50 ends too: the gang starts on a (whole) and b, and job 3 gets what b has left.
    third = plan(state(pool, [jobs[0], jobs[2]], [holding(51, {"b": (0,)}), holding(2, {"c": (0,)}, team=1)]))
    assert third.dispatch == [Dispatch(1, "a", (0, 1, 2, 3), (Share("b", (1, 2)),)), Dispatch(3, "b", (3,))]
    assert waits(third) == ({}, {})


def test_reserved_shares_prefer_the_hosts_with_most_free_among_the_fewest():
    hosts = [("a", 4, 1), ("b", 4, 2), ("c", 1, 1), ("d", 2, 2)]
    # Two hosts whatever the job; d has more free than a, so d when b + d hold the job.
    assert reserved_shares(6, hosts) == [("b", 4), ("d", 2)]
    assert reserved_shares(7, hosts) == [("b", 4), ("a", 3)]
    assert reserved_shares(12, hosts) == []  # too large for all of them together


def test_gang_shares_none_when_too_few_are_free_together():
    assert gang_shares(5, [(2, "a"), (2, "b")]) is None
    assert gang_shares(4, [(2, "b"), (2, "a"), (0, "c")]) == [("a", 2), ("b", 2)]


# ---- holders, quotas, preemption ----

def test_a_holding_gangs_devices_on_every_host_are_not_free():
    holders = [holding(50, {"a": (0,), "b": (1,)})]
    result = plan(state(workers(("a", 2), ("b", 2)), [waiting(1, 1), waiting(2, 1), waiting(3, 1)], holders))
    assert result.dispatch == [Dispatch(1, "a", (1,)), Dispatch(2, "b", (0,))]
    assert waits(result) == ({3: "fair_share"}, {3: 1})  # the free devices went to jobs ahead


def test_a_gang_with_a_dead_host_still_holds_its_devices_on_the_live_ones():
    holders = [holding(50, {"gone": (0, 1), "b": (0, 1)})]
    result = plan(state(workers(("a", 2), ("b", 2)), [waiting(1, 2), waiting(2, 2)], holders))
    assert result.dispatch == [Dispatch(1, "a", (0, 1))]
    assert waits(result) == ({2: "fair_share"}, {2: 1})


def test_quota_counts_all_of_a_gangs_gpus_held_and_dispatched():
    teams = [Team(1, 1.0, {"a": 5}), Team(2, 1.0, {"a": 2})]
    pool = workers(("a", 2), ("b", 2), ("c", 2), ("d", 2))
    jobs = [waiting(1, 4), waiting(2, 1), waiting(3, 1), waiting(4, 1, team=2)]
    result = plan(state(pool, jobs, [holding(50, {"d": (0,), "c": (0,)}, team=2)], teams))
    # Team 1's gang is charged its 4 GPUs, so only one more of its jobs fits its quota of 5; team 2
    # holds its gang's 2 GPUs (on two hosts), its whole quota. Order: 1, 4 (team 2 held 2 < 4), 2, 3.
    assert result.dispatch == [Dispatch(1, "a", (0, 1), (Share("b", (0, 1)),)), Dispatch(2, "c", (1,))]
    assert waits(result) == ({4: "quota_exceeded", 3: "quota_exceeded"}, {4: 1, 3: 2})


def test_a_high_job_preempts_a_gang_counting_its_devices_on_the_host_it_would_use():
    holders = [holding(50, {"a": (0, 1), "b": (0, 1)}, priority="low")]
    result = plan(state(workers(("a", 4), ("b", 2)), [waiting(1, 4, priority="high")], holders))
    # a has 2 free and the gang's 2: room for 4. The gang is over its fair share (4 of 6 / 2 teams).
    assert result.dispatch == []
    assert result.preempt == [Preemption(50, 1)]
    assert waits(result) == ({1: "preempting"}, {1: 1})


def test_a_gang_with_a_dead_host_is_no_victim():
    holders = [holding(50, {"a": (0, 1), "gone": (0, 1)}, priority="low")]
    result = plan(state(workers(("a", 4), ("b", 2)), [waiting(1, 4, priority="high")], holders))
    assert result.preempt == []
    assert waits(result) == ({1: "no_capacity"}, {1: 1})


def test_a_gang_asked_to_yield_is_claimed_once_on_the_host_with_most_room():
    holders = [holding(50, {"a": (0, 1), "b": (0, 1)}, priority="low", preempt=True)]
    jobs = [waiting(1, 2, priority="high"), waiting(2, 2, priority="high")]
    result = plan(state(workers(("a", 2), ("b", 2)), jobs, holders))
    # Both hosts free with the gang; job 1 claims it, job 2 must wait (no other victim).
    assert result.preempt == []
    assert waits(result) == ({1: "preempting", 2: "no_capacity"}, {1: 1, 2: 2})


def test_a_gang_never_preempts():
    holders = [holding(50, {"a": (0, 1)}, priority="low")]
    result = plan(state(workers(("a", 2), ("b", 2)), [waiting(1, 4, priority="high")], holders))
    assert result.preempt == []
    assert waits(result) == ({1: "gang_forming"}, {1: 1})


def test_reserved_devices_count_for_preemption_only_ahead_of_the_gang():
    holders = [holding(50, {"a": (0,)}, priority="low"), holding(51, {"b": (0,)}, priority="low")]
    pool = workers(("a", 2), ("b", 2))
    # A high job ahead of a normal gang: b's free device, reserved for the gang, is still its.
    ahead = plan(state(pool, [waiting(1, 2, priority="high"), waiting(2, 4, team=3)], holders))
    assert ahead.preempt == [Preemption(51, 1)]
    assert waits(ahead) == ({1: "preempting", 2: "gang_forming"}, {1: 1, 2: 2})
    # Behind a high gang (older, same class): the reserved devices are not its to count.
    jobs = [waiting(1, 4, team=3, priority="high"), waiting(2, 2, priority="high")]
    behind = plan(state(pool, jobs, holders))
    assert behind.preempt == []
    assert waits(behind) == ({1: "gang_forming", 2: "no_capacity"}, {1: 1, 2: 2})


def test_positions_number_the_waiting_gangs_and_skip_the_started_ones():
    holders = [holding(50, {"c": (0, 1)})]
    jobs = [waiting(1, 4), waiting(2, 6), waiting(3, 2), waiting(4, 1)]
    result = plan(state(workers(("a", 2), ("b", 2), ("c", 2)), jobs, holders))
    # Gang 1 starts on a and b; gang 2 waits and reserves c (nothing free there yet).
    assert result.dispatch == [Dispatch(1, "a", (0, 1), (Share("b", (0, 1)),))]
    assert waits(result) == ({2: "gang_forming", 3: "fair_share", 4: "fair_share"}, {2: 1, 3: 2, 4: 3})
