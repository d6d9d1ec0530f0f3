"""Rewards dry runs (``POST /v1/rewards/run``): a spec's rewards on a few samples, no job, checked
in the API and scored there or on a worker (:mod:`~api.trials.reward_trials`), and the request and
answer relayed to a sandbox-capable worker over Redis (:mod:`~api.trials.reward_trial_messages`)."""
