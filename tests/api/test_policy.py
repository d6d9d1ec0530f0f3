"""The scheduling policy (``api.scheduling.policy``) on hand-built states, every expectation
worked out by hand, plus a seeded cross-check against the naive reference in
``benchmarks/reference_policy.py``. Pure: no database, no clock. Preemption has its own file
(``test_policy_preemption.py``), as do gangs (``test_policy_gangs.py``)."""

from __future__ import annotations

import importlib.util
import math
import random
from collections import Counter
from pathlib import Path

import pytest
from policy_states import SANDBOX, cluster, hold, job, placed, worker

from api.domain.cluster_state import ClusterState, Interval, Team, WaitingJob, Worker, decayed_usage
from api.scheduling.policy import PENDING_REASONS, Dispatch, Plan, plan

# benchmarks/ is not a package: load the reference by its path.
_REFERENCE_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "reference_policy.py"
_spec = importlib.util.spec_from_file_location("reference_policy", _REFERENCE_FILE)
assert _spec is not None and _spec.loader is not None
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def teams_placed(state: ClusterState, result: Plan) -> Counter[int]:
    team_of = {j.id: j.team_id for j in state.waiting}
    return Counter(team_of[d.job_id] for d in result.dispatch)


# ---- order ----

def test_priority_beats_age():
    result = plan(cluster([worker("w1")], [job(1, 1, priority="low"), job(2, 1, priority="high")]))
    assert result.dispatch == [Dispatch(2, "w1", (0,))]
    assert result.pending == {1: "lower_priority"}


def test_fifo_within_a_team_whatever_the_input_order():
    result = plan(cluster([worker("w1"), worker("w2")], [job(5, 1), job(3, 1), job(9, 1)]))
    assert result.dispatch == [Dispatch(3, "w1", (0,)), Dispatch(5, "w2", (0,))]
    assert result.pending == {9: "fair_share"} and result.position == {9: 1}


def test_fair_share_across_three_teams_follows_weights():
    # Weights 2:1:1, 4 free workers, 5 jobs each. Keys start at 0 (ties: lower next id): team 1
    # (job 1, key 0.5), team 2 (job 6, key 1), team 3 (job 11, key 1), team 1 again (job 2, key 1).
    teams = [Team(1, 2.0), Team(2, 1.0), Team(3, 1.0)]
    waiting = [job(i, 1 + (i - 1) // 5) for i in range(1, 16)]
    state = cluster([worker(f"w{i}") for i in range(4)], waiting, teams=teams)
    result = plan(state)
    assert [d.job_id for d in result.dispatch] == [1, 6, 11, 2]
    assert teams_placed(state, result) == {1: 2, 2: 1, 3: 1}
    # The order goes on with every key at 1: job 3 (team 1 -> 1.5), 7 (team 2 -> 2), 12, then 4.
    assert [j for j, _ in sorted(result.position.items(), key=lambda kv: kv[1])][:4] == [3, 7, 12, 4]


def test_recent_usage_sends_a_heavy_past_user_last():
    # Team 1 owns the oldest jobs but used 5 GPUs lately: teams 2 and 3 take turns until their
    # keys reach 5 (they have 3 jobs each, so never), then team 1.
    waiting = [job(i, 1 + (i - 1) // 3) for i in range(1, 10)]
    state = cluster([worker("w1"), worker("w2")], waiting, recent_usage={(1, "a"): 5.0})
    result = plan(state)
    assert result.dispatch == [Dispatch(4, "w1", (0,)), Dispatch(7, "w2", (0,))]
    assert result.position == {5: 1, 8: 2, 6: 3, 9: 4, 1: 5, 2: 6, 3: 7}
    assert set(result.pending.values()) == {"fair_share"}


def test_gpus_held_count_in_the_key_and_unknown_team_weighs_one():
    # Team 1 holds a GPU, team 99 is not in state.teams (weight 1): 99's newer job goes first.
    waiting = [job(1, 1), job(2, 99)]
    state = cluster([worker("w1"), worker("w2")], waiting, [hold(50, 1, "w2")], [Team(1, 1.0)])
    assert plan(state).dispatch == [Dispatch(2, "w1", (0,))]


def test_order_carries_team_counts_from_class_to_class():
    # Team 1's high job counts against it in the normal class: team 2's newer normal job goes first.
    state = cluster([worker("w1"), worker("w2")], [job(1, 1, priority="high"), job(2, 1), job(3, 2)])
    assert plan(state).dispatch == [Dispatch(1, "w1", (0,)), Dispatch(3, "w2", (0,))]


# ---- placement ----

def test_quota_never_exceeded_in_one_pass():
    # Quota 3, one GPU already held: of four 1-GPU jobs two run; team 2 (no quota) still runs.
    teams = [Team(1, 1.0, {"a": 3}), Team(2, 1.0)]
    state = cluster([worker(f"w{i}") for i in range(6)], [job(i, 1) for i in (1, 2, 3, 4)] + [job(5, 2)],
                    [hold(50, 1, "w5")], teams)
    result = plan(state)
    assert teams_placed(state, result) == {1: 2, 2: 1}
    assert result.pending == {3: "quota_exceeded", 4: "quota_exceeded"}


def test_quota_zero_and_quota_is_per_pool():
    teams = [Team(1, 1.0, {"a": 0, "b": 8})]
    state = cluster([worker("w1"), worker("w2", pool="b")], [job(1, 1), job(2, 1, pool="b")], teams=teams)
    result = plan(state)
    assert result.dispatch == [Dispatch(2, "w2", (0,))]
    assert result.pending == {1: "quota_exceeded"}


def test_quota_counts_holders_on_dead_workers_and_those_asked_to_yield():
    teams = [Team(1, 1.0, {"a": 3})]
    holding = [hold(50, 1, "gone", gpus=2), hold(51, 1, "w1", preempt=True)]
    result = plan(cluster([worker("w1"), worker("w2")], [job(1, 1)], holding, teams))
    assert result.pending == {1: "quota_exceeded"}


def test_backfill_a_small_job_behind_a_blocked_big_one():
    # The 2-GPU worker is busy: the older 2-GPU job waits, the 1-GPU job behind it runs.
    workers = [worker("big", 2), worker("small", 1)]
    state = cluster(workers, [job(1, 1, gpus=2), job(2, 1)], [hold(50, 2, "big", 2)])
    result = plan(state)
    assert result.dispatch == [Dispatch(2, "small", (0,))]
    assert result.pending == {1: "no_capacity"} and result.position == {1: 1}


def test_best_fit_keeps_the_big_worker_for_the_big_job():
    workers = [worker("big", 4), worker("mid-b", 2), worker("mid-a", 2), worker("small", 1)]
    result = plan(cluster(workers, [job(1, 1), job(2, 1, gpus=4), job(3, 1, gpus=2)]))
    assert placed(result) == {1: "small", 2: "big", 3: "mid-a"}  # equal sizes: lower worker id


def test_a_job_that_fits_one_worker_is_never_split():
    # Two free devices on two workers, but the job fits the busy one: it waits for that one.
    workers = [worker("big", 2), worker("w1"), worker("w2")]
    result = plan(cluster(workers, [job(1, 1, gpus=2)], [hold(50, 2, "big", devices=(0,))]))
    assert result.dispatch == [] and result.pending == {1: "no_capacity"}


def test_free_workers_exclude_busy_ones_and_holders_of_dead_workers_free_nothing():
    holding = [hold(50, 2, "w1"), hold(51, 2, "gone", status="cancelling")]
    result = plan(cluster([worker("w1"), worker("w2")], [job(1, 1), job(2, 1)], holding))
    assert result.dispatch == [Dispatch(1, "w2", (0,))]


# ---- packing: devices within a worker ----

def test_two_one_gpu_jobs_share_a_two_slot_worker():
    result = plan(cluster([worker("w1", 2)], [job(1, 1), job(2, 2)]))
    assert result.dispatch == [Dispatch(1, "w1", (0,)), Dispatch(2, "w1", (1,))]
    assert result.pending == {}


def test_a_one_gpu_job_takes_the_lowest_free_device():
    result = plan(cluster([worker("w1", 4)], [job(1, 1)], [hold(50, 2, "w1", 2, devices=(0, 2))]))
    assert result.dispatch == [Dispatch(1, "w1", (1,))]


def test_a_two_gpu_job_waits_for_both_slots():
    state = cluster([worker("w1", 2)], [job(1, 1, gpus=2)], [hold(50, 2, "w1", devices=(1,))])
    result = plan(state)
    assert result.dispatch == [] and result.pending == {1: "no_capacity"}
    # Once the holder is gone both devices are free, and the job takes them together.
    result = plan(cluster([worker("w1", 2)], [job(1, 1, gpus=2)]))
    assert result.dispatch == [Dispatch(1, "w1", (0, 1))]


def test_best_fit_goes_by_free_devices_not_worker_size():
    # "big" has 4 devices but only 1 free; "mid" has 2 free: the 1-GPU job takes big's last one,
    # the 2-GPU job then still finds mid whole.
    workers = [worker("big", 4), worker("mid", 2)]
    state = cluster(workers, [job(1, 1), job(2, 2, gpus=2)], [hold(50, 3, "big", 3, devices=(0, 1, 3))])
    result = plan(state)
    assert result.dispatch == [Dispatch(1, "big", (2,)), Dispatch(2, "mid", (0, 1))]


def test_holder_without_devices_holds_the_whole_worker_and_busy_devices_are_not_free():
    # A job dispatched before devices were recorded, and a device the worker reports busy.
    workers = [Worker("old", "a", 2), Worker("w2", "a", 2, busy=(0,))]
    result = plan(cluster(workers, [job(1, 1), job(2, 1)], [hold(50, 2, "old")]))
    assert result.dispatch == [Dispatch(1, "w2", (1,))]
    assert result.pending == {2: "fair_share"}


def test_pools_are_independent():
    state = cluster([worker("w1"), worker("w2", pool="b")], [job(1, 1), job(2, 1), job(3, 2, pool="b")],
                    held_pools=frozenset({"a"}))
    result = plan(state)
    assert result.dispatch == [Dispatch(3, "w2", (0,))]
    assert result.pending == {1: "pool_held", 2: "pool_held"}
    assert result.position == {1: 1, 2: 2}


def test_reason_names_a_given_worker_only_if_it_would_have_fitted():
    # The free 1-GPU worker goes to the high job; the 2-GPU normal job could not have used it.
    waiting = [job(1, 1, priority="high"), job(2, 1, gpus=2), job(3, 2)]
    state = cluster([worker("w1"), worker("w2", 2)], waiting, [hold(50, 3, "w2", 2)])
    assert plan(state).pending == {2: "no_capacity", 3: "lower_priority"}
    # The same within one class: fair_share only when the worker another team got would have fitted.
    state = cluster([worker("w1"), worker("w2", 2)], [job(1, 1), job(2, 2, gpus=2), job(3, 3)],
                    [hold(50, 3, "w2", 2)])
    assert plan(state).pending == {2: "no_capacity", 3: "fair_share"}


def test_positions_count_only_jobs_left_waiting_per_pool():
    state = cluster([worker("w1"), worker("v1", pool="b")],
                    [job(1, 1), job(2, 1), job(3, 1), job(4, 1, pool="b"), job(5, 1, pool="b")])
    result = plan(state)
    assert placed(result) == {1: "w1", 4: "v1"}
    assert result.position == {2: 1, 3: 2, 5: 1}
    assert set(result.pending) == set(result.position) == {2, 3, 5}


def _reason_states() -> dict[str, tuple[ClusterState, int]]:
    """For each pending reason, a smallest state in which job 1 gets it."""
    one, two = [worker("w1")], [worker("w1"), worker("w2")]
    return {
        "pool_held": (cluster(one, [job(1, 1)], held_pools=frozenset({"a"})), 1),
        "no_workers": (cluster(one, [job(1, 1, pool="elsewhere")]), 1),
        "no_capable_worker": (cluster(one, [job(1, 1, requires=SANDBOX)]), 1),
        "too_large": (cluster(one, [job(1, 1, gpus=2)]), 1),
        # Two workers of one device, one busy: the gang waits for it, the other is held for the gang.
        "gang_forming": (cluster(two, [job(1, 1, gpus=2)], [hold(50, 2, "w1")]), 1),
        "reserved": (cluster(two, [job(1, 1, gpus=2), job(2, 1)], [hold(50, 2, "w1")]), 2),
        "backoff": (cluster(one, [WaitingJob(1, 1, "a", 1, "normal", backoff=True)]), 1),
        "quota_exceeded": (cluster(one, [job(1, 1)], teams=[Team(1, 1.0, {"a": 0})]), 1),
        "preempting": (cluster(one, [job(1, 1, priority="high")], [hold(50, 2, "w1", priority="low")]), 1),
        "lower_priority": (cluster(one, [job(1, 1), job(2, 1, priority="high")]), 1),
        "fair_share": (cluster(one, [job(1, 1), job(2, 2)], recent_usage={(1, "a"): 1.0}), 1),
        "no_capacity": (cluster(one, [job(1, 1)], [hold(50, 1, "w1")]), 1),
    }


@pytest.mark.parametrize("reason", PENDING_REASONS)
def test_every_pending_reason_is_reachable(reason):
    state, job_id = _reason_states()[reason]
    assert plan(state).pending[job_id] == reason


def test_a_job_in_backoff_keeps_its_place_and_the_worker_goes_to_the_next():
    backing_off = WaitingJob(1, 1, "a", 1, "high", backoff=True)
    result = plan(cluster([worker("w1")], [backing_off, job(2, 1)], [hold(50, 2, "w0", priority="low")]))
    assert placed(result) == {2: "w1"}
    assert (result.pending, result.position, result.preempt) == ({1: "backoff"}, {1: 1}, [])


# ---- capabilities ----

def test_a_job_goes_only_to_a_worker_with_the_capabilities_it_requires():
    # The plain worker is the best fit by size, but it lacks the sandbox; the plain job takes it.
    workers = [worker("plain"), worker("sandboxed", 2, capabilities=SANDBOX | {"extra"})]
    result = plan(cluster(workers, [job(1, 1, requires=SANDBOX), job(2, 1)]))
    assert result.dispatch == [Dispatch(1, "sandboxed", (0,)), Dispatch(2, "plain", (0,))]


def test_a_job_waits_for_a_busy_capable_worker_and_leaves_the_others_to_the_queue():
    workers = [worker("plain"), worker("sandboxed", capabilities=SANDBOX)]
    state = cluster(workers, [job(1, 1, requires=SANDBOX), job(2, 1)], [hold(50, 2, "sandboxed")])
    result = plan(state)
    assert placed(result) == {2: "plain"}
    # A plain job got the plain worker, which this job could not have used: not its turn lost.
    assert result.pending == {1: "no_capacity"}


def test_no_capable_worker_comes_before_too_large_and_too_large_counts_capable_workers_only():
    workers = [worker("big", 4), worker("sandboxed", 1, capabilities=SANDBOX)]
    waiting = [job(1, 1, gpus=2, requires=SANDBOX), job(2, 1, gpus=4, requires=frozenset({"x"}))]
    result = plan(cluster(workers, waiting))
    assert result.pending == {1: "too_large", 2: "no_capable_worker"}
    assert result.dispatch == []


def test_room_taken_by_a_higher_class_counts_only_on_a_worker_the_job_could_use():
    workers = [worker("plain"), worker("sandboxed", capabilities=SANDBOX)]
    waiting = [job(1, 1, priority="high"), job(2, 1, priority="high", requires=SANDBOX),
               job(3, 1, requires=SANDBOX), job(4, 1)]
    result = plan(cluster(workers, waiting))
    assert placed(result) == {1: "plain", 2: "sandboxed"}
    assert result.pending == {3: "lower_priority", 4: "lower_priority"}
    # The sandboxed worker busy: the plain one that went to the high job was of no use to job 3.
    result = plan(cluster(workers, [job(1, 1, priority="high"), job(3, 1, requires=SANDBOX)],
                          [hold(50, 2, "sandboxed", priority="high")]))
    assert (placed(result), result.pending) == ({1: "plain"}, {3: "no_capacity"})


# ---- decayed usage ----

def test_decayed_usage_of_constant_holding_reads_its_gpus():
    usage = decayed_usage([Interval(1, "a", 3, 0.0, None)], now=100 * 60.0, half_life=60.0)
    assert usage == {(1, "a"): pytest.approx(3.0, rel=1e-12)}


def test_decayed_usage_closed_forms():
    h = 60.0
    intervals = [
        Interval(1, "a", 4, 1000.0 - 2 * h, 1000.0 - h),  # one half-life long, ended one ago: 4 (1/2 - 1/4)
        Interval(2, "a", 2, 1000.0 - h, None),  # open, started one half-life ago: 2 (1 - 1/2)
        Interval(2, "a", 2, 1000.0 - 3 * h, 1000.0 - 3 * h),  # empty
        Interval(3, "b", 8, 1000.0 - h, 5000.0),  # ends in the future: counted up to now
    ]
    usage = decayed_usage(intervals, now=1000.0, half_life=h)
    assert usage == {(1, "a"): pytest.approx(1.0), (2, "a"): pytest.approx(1.0), (3, "b"): pytest.approx(4.0)}
    d = 30.0  # an interval of length d that ended one half-life ago: g/2 (1 - 2^(-d/H))
    usage = decayed_usage([Interval(1, "a", 6, 1000.0 - h - d, 1000.0 - h)], now=1000.0, half_life=h)
    assert usage[(1, "a")] == pytest.approx(3.0 * (1 - 2 ** (-d / h)))
    assert usage[(1, "a")] == pytest.approx(3.0 * (1 - 1 / math.sqrt(2)))


# ---- the fast policy against the naive reference ----

def _check_invariants(state: ClusterState, result: Plan) -> None:
    workers = {w.worker_id: w for w in state.workers}
    jobs = {j.id: j for j in state.waiting}
    used = [(host.worker_id, device) for d in result.dispatch for host in reference.hosts_of(d)
            for device in host.devices]
    assert len(used) == len(set(used))  # no device is given twice
    taken = {(w.worker_id, device) for w in state.workers for device in w.busy}
    for h in state.holding:
        for host in reference.hosts_of(h):
            if host.worker_id in workers:
                taken |= {(host.worker_id, device)
                          for device in host.devices or range(workers[host.worker_id].gpus)}
    assert not set(used) & taken  # nor one a holder or the worker itself uses
    for d in result.dispatch:
        hosts = reference.hosts_of(d)
        assert len({host.worker_id for host in hosts}) == len(hosts)  # a gang's hosts are distinct
        assert sum(len(host.devices) for host in hosts) == jobs[d.job_id].gpus
        for host in hosts:
            assert workers[host.worker_id].pool == jobs[d.job_id].pool
            assert host.devices and list(host.devices) == sorted(set(host.devices))
            assert set(host.devices) <= set(range(workers[host.worker_id].gpus))
    assert set(result.pending) | {d.job_id for d in result.dispatch} == set(jobs)
    assert set(result.pending) == set(result.position)
    held = Counter()
    for h in state.holding:
        held[(h.team_id, h.pool)] += h.gpus
    for d in result.dispatch:
        held[(jobs[d.job_id].team_id, jobs[d.job_id].pool)] += jobs[d.job_id].gpus
    for (team, pool), gpus in held.items():
        quota = state.teams[team].quotas.get(pool) if team in state.teams else None
        # A dispatch never takes a team over its quota (holders may already be over it).
        if quota is not None and any(jobs[d.job_id].team_id == team and jobs[d.job_id].pool == pool
                                     for d in result.dispatch):
            assert gpus <= quota


def _random_state(seed: int) -> ClusterState:
    rng = random.Random(seed)
    jobs, teams, workers = rng.randint(0, 30), rng.randint(1, 5), rng.randint(2, 12)
    return reference.random_state(rng, jobs, teams, workers, busy=rng.choice((0.5, 0.9)))


@pytest.mark.parametrize("seed", range(200))
def test_matches_the_naive_reference(seed):
    state = _random_state(seed)
    fast, naive = plan(state), reference.reference_plan(state)
    assert fast.dispatch == naive.dispatch
    assert fast.pending == naive.pending
    assert fast.position == naive.position
    assert fast.preempt == naive.preempt
    assert fast.fair_share == pytest.approx(naive.fair_share)
    _check_invariants(state, fast)


def test_cross_check_reaches_every_reason():
    # Guards the generator: the 200 random states above must exercise every branch.
    seen = Counter()
    for seed in range(200):
        result = plan(_random_state(seed))
        seen.update(result.pending.values())
        seen["(preemption)"] += len(result.preempt)
    assert set(seen) == {*PENDING_REASONS, "(preemption)"}, seen
