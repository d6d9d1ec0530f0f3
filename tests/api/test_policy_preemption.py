"""Preemption in the scheduling policy (``api.scheduling.preemption``, the last step of
``api.scheduling.policy.plan``) on hand-built states, every expectation worked out by hand: which
victim, only from a team over its fair share, never doubled, within the requester's quota, on a
worker the high job can use and whose devices are enough. Pure: no database, no clock. A gang as
victim or requester is in ``test_policy_gangs.py``."""

from __future__ import annotations

from policy_states import SANDBOX, cluster, hold, job, worker

from api.domain.cluster_state import ClusterState, Team
from api.scheduling.policy import Dispatch, Preemption, plan


def _preemption_state(holding, waiting=None, teams=(), workers=None) -> ClusterState:
    workers = workers or [worker(f"w{i}") for i in range(1, 4)]
    return cluster(workers, waiting or [job(1, 1, priority="high")], holding, teams)


def test_preemption_frees_the_victims_device_only():
    # Team 2 holds both devices of w1 with two 1-GPU jobs (over its fair share of 1). The high
    # 1-GPU job preempts the newest; its neighbour keeps running.
    holding = [hold(10, 2, "w1", priority="low", since=1.0, devices=(0,)),
               hold(11, 2, "w1", priority="low", since=5.0, devices=(1,))]
    result = plan(_preemption_state(holding, workers=[worker("w1", 2)]))
    assert result.preempt == [Preemption(11, 1)]
    # A 2-GPU high job needs more than one victim's device: nothing on w1 frees enough alone.
    result = plan(_preemption_state(holding, [job(1, 1, 2, "high")], workers=[worker("w1", 2)]))
    assert result.preempt == [] and result.pending == {1: "no_capacity"}


def test_preemption_counts_the_victims_devices_plus_what_is_free_beside_them():
    # w1 (4 devices): device 3 free, a low job of team 2 on 0-1, its high job on 2. A 3-GPU high
    # job of team 1 preempts the low one: its 2 devices plus the free one make 3.
    holding = [hold(10, 2, "w1", 2, priority="low", devices=(0, 1)),
               hold(11, 2, "w1", 1, priority="high", devices=(2,))]
    result = plan(_preemption_state(holding, [job(1, 1, 3, "high")], workers=[worker("w1", 4)]))
    assert result.preempt == [Preemption(10, 1)] and result.pending == {1: "preempting"}


def test_preemption_frees_only_a_worker_the_high_job_can_use():
    workers = [worker("plain"), worker("sandboxed", capabilities=SANDBOX)]
    # Team 2 is over its share on both workers; the newer, lower victim sits on the plain worker.
    holding = [hold(50, 2, "plain", priority="low", since=9.0), hold(51, 2, "sandboxed", since=1.0)]
    state = cluster(workers, [job(1, 1, priority="high", requires=SANDBOX)], holding)
    result = plan(state)
    assert result.preempt == [Preemption(51, 1)]
    assert result.pending == {1: "preempting"}
    # A yield already under way on the plain worker does not serve it either.
    asked = [hold(50, 2, "plain", priority="low", since=9.0, preempt=True), hold(51, 2, "sandboxed")]
    assert plan(cluster(workers, [job(1, 1, priority="high", requires=SANDBOX)], asked)).preempt == \
        [Preemption(51, 1)]


def test_victim_is_lowest_priority_then_newest():
    # Teams 1 and 2 share 3 GPUs (fair 1.5 each); team 2 holds 3.
    holding = [hold(10, 2, "w1", since=9.0), hold(11, 2, "w2", priority="low", since=1.0),
               hold(12, 2, "w3", priority="low", since=3.0)]
    result = plan(_preemption_state(holding))
    assert result.preempt == [Preemption(12, 1)]
    assert result.pending == {1: "preempting"} and result.position == {1: 1}
    assert result.fair_share == {(1, "a"): 1.5, (2, "a"): 1.5}


def test_equal_ages_the_larger_id_is_preempted():
    holding = [hold(11, 2, "w1", priority="low", since=3.0), hold(12, 2, "w2", priority="low", since=3.0)]
    result = plan(_preemption_state(holding, workers=[worker("w1"), worker("w2")]))
    assert result.preempt == [Preemption(12, 1)]


def test_victim_only_from_a_team_over_its_fair_share():
    # Weights 1:2:1 over 2 GPUs: fair shares 0.5, 1.0, 0.5. Team 2 holds 1 (not over), team 3 holds 1.
    teams = [Team(1, 1.0), Team(2, 2.0), Team(3, 1.0)]
    holding = [hold(10, 2, "w1", priority="low", since=9.0), hold(11, 3, "w2", since=1.0)]
    result = plan(_preemption_state(holding, teams=teams, workers=[worker("w1"), worker("w2")]))
    assert result.preempt == [Preemption(11, 1)]
    assert result.fair_share == {(1, "a"): 0.5, (2, "a"): 1.0, (3, "a"): 0.5}


def test_never_preempts_own_team_or_a_high_job():
    own = [hold(10, 1, "w1", priority="low"), hold(11, 1, "w2", priority="low"),
           hold(12, 2, "w3", priority="high")]
    result = plan(_preemption_state(own, waiting=[job(1, 1, priority="high"), job(2, 2)]))
    assert result.preempt == []
    assert result.pending == {1: "no_capacity", 2: "no_capacity"}


def test_no_preemption_when_the_requester_would_exceed_its_quota():
    # Quota 2: the normal 1-GPU job behind is backfilled, so the 2-GPU high job would make 3.
    teams = [Team(1, 1.0, {"a": 2})]
    state = _preemption_state([hold(10, 2, "big", 2, priority="low")], [job(1, 1, 2, "high"), job(2, 1)],
                              teams, [worker("big", 2), worker("small")])
    result = plan(state)
    assert result.dispatch == [Dispatch(2, "small", (0,))]
    assert result.preempt == [] and result.pending == {1: "no_capacity"}


def test_quota_counts_the_preemptions_of_this_pass():
    teams = [Team(1, 1.0, {"a": 1})]
    holding = [hold(10, 2, "w1", priority="low"), hold(11, 2, "w2", priority="low"), hold(12, 2, "w3")]
    result = plan(_preemption_state(holding, [job(1, 1, priority="high"), job(2, 1, priority="high")], teams))
    assert result.preempt == [Preemption(11, 1)]
    assert result.pending == {1: "preempting", 2: "no_capacity"}


def test_preemption_in_flight_is_not_doubled():
    # w1's job was already asked to yield: the first high job waits for it, the second preempts.
    holding = [hold(10, 2, "w1", priority="low", preempt=True), hold(11, 2, "w2", priority="low", since=1.0),
               hold(12, 2, "w3", priority="low", since=2.0)]
    result = plan(_preemption_state(holding, [job(1, 1, priority="high"), job(2, 1, priority="high")]))
    assert result.preempt == [Preemption(12, 2)]
    assert result.pending == {1: "preempting", 2: "preempting"}


def test_victims_already_chosen_leave_the_team_within_its_share():
    # 4 GPUs, fair 2 each: team 2 holds 3, so after one victim it is at its share.
    holding = [hold(10 + i, 2, f"w{i}", priority="low", since=i) for i in (1, 2, 3)]
    waiting = [job(1, 1, priority="high"), job(2, 1, priority="high")]
    result = plan(_preemption_state(holding, waiting, workers=[worker(f"w{i}") for i in range(1, 5)]))
    assert result.dispatch == [Dispatch(1, "w4", (0,))]
    assert result.preempt == [Preemption(13, 2)]

    result = plan(_preemption_state(holding, waiting + [job(3, 1, priority="high")],
                                    workers=[worker(f"w{i}") for i in range(1, 5)]))
    assert result.preempt == [Preemption(13, 2)] and result.pending[3] == "fair_share"


def test_victims_worker_must_fit_the_high_job():
    # The newest, lowest-priority job runs on a 1-GPU worker: the 2-GPU job takes the older one's.
    holding = [hold(10, 2, "w1", priority="low", since=9.0), hold(11, 2, "big", 2, since=1.0),
               hold(12, 2, "w2", priority="low", since=5.0)]
    workers = [worker("w1"), worker("w2"), worker("big", 2)]
    result = plan(_preemption_state(holding, [job(1, 1, 2, "high")], workers=workers))
    assert result.preempt == [Preemption(11, 1)]

    # With a high job on the big worker, no victim fits.
    holding[1] = hold(11, 2, "big", 2, priority="high", since=1.0)
    result = plan(_preemption_state(holding, [job(1, 1, 2, "high")], workers=workers))
    assert result.preempt == [] and result.pending == {1: "no_capacity"}


def test_only_running_jobs_on_live_workers_are_victims():
    holding = [hold(10, 2, "w1", priority="low", status="dispatched"),
               hold(11, 2, "w2", priority="low", status="cancelling"),
               hold(12, 2, "w3", priority="low", preempt=True), hold(13, 2, "gone", 1, "low")]
    result = plan(_preemption_state(holding, [job(1, 1, priority="high"), job(2, 1, priority="high")]))
    assert result.preempt == []
    assert result.pending == {1: "preempting", 2: "no_capacity"}
