"""What the codes a job shows mean, in words for the person reading them: a waiting job's
``pending_reason``, a failed job's ``error.code`` and the health rules of its alerts. The one table
of them: the API serves it
(``GET /v1/codes``, which the dashboard reads) and the CLI reads it here, so every client says
the same thing. Pure data; a test checks that every code the service can write is here.
"""

from __future__ import annotations

# The health rules (grpo_core.spec.alerts, whose defaults these name): what each watches, in words for the
# person reading an alert (GET /v1/codes, grpo alerts). A rule whose action is stop ends its job
# cancelled with the rule's name as its error.code, so each is an error code too.
ALERT_RULES: dict[str, str] = {
    "entropy_collapse": "the policy's entropy stayed below `threshold` (a fraction, default 0.1) of its "
                        "early value (the mean of the run's first `window` steps) for `window` steps in a "
                        "row: the model has stopped exploring and repeats itself",
    "kl_blowup": "the KL to the reference went above `threshold` (default 1.0), or above "
                 "10x its median over the previous `window` steps: the policy is running "
                 "away from the reference (lower the learning rate, raise beta)",
    "no_signal": "in `window` steps in a row, at least `threshold` (default 0.95) of the groups had "
                 "rewards all equal (frac_reward_zero_std): their advantages are 0 and nothing is learned "
                 "(the task is too hard or too easy for the model, or the reward is constant)",
    "length_runaway": "in `window` steps in a row, more than `threshold` (default 0.5) of the completions "
                      "hit max_completion_length (completions/clipped_ratio): completions grow without end",
    "reward_hacking": "over the last `window` evaluations the training reward trended up while the eval "
                      "reward trended down, by more than `threshold` from the first to the last: the policy "
                      "is learning the reward's blind spots, not the task",
    "grader_failures": "in `window` steps in a row, more than `threshold` (default 0.1) of the rows were "
                       "left unscored by a reward (an exception, a timeout, a service away): those rows "
                       "teach nothing",
    "grad_explosion": "the gradient norm (before clipping) was not finite, or went above `threshold` (when "
                      "set), or above 10x its median over the previous `window` steps",
}

# The scheduler's reasons (api.scheduling.policy.PENDING_REASONS) and the API's no_scheduler.
PENDING_REASONS: dict[str, str] = {
    "pool_held": "an admin has held dispatch into this pool: running jobs go on, nothing new starts "
                 "until it is resumed (grpo admin resume POOL)",
    "no_workers": "no live worker serves this pool: start one (grpo worker --pool POOL)",
    "no_capable_worker": "no live worker of this pool offers everything the job's rewards need "
                         "(code_tests needs a worker with a working code sandbox)",
    "too_large": "the live workers of this pool (those offering what its rewards need) have fewer GPUs "
                 "together than the job asks for",
    "backoff": "it went back to the queue after a fault and waits out its backoff before the next attempt",
    "quota_exceeded": "its team already holds its GPU quota in this pool: it starts when the team's "
                      "other jobs free GPUs",
    "preempting": "a lower-priority job is saving a checkpoint to make room for it",
    "reserved": "the free GPUs that fit are reserved for a job spanning hosts ahead of it in the queue",
    "gang_forming": "it needs more GPUs than any one worker has: it starts on several workers at once when "
                    "enough GPUs are free across the pool's workers (the first such job in the queue has "
                    "them reserved for it as they free)",
    "lower_priority": "the free GPUs went to jobs of a higher priority class",
    "fair_share": "the free GPUs went to a job ahead of it in the same priority class (another team's "
                  "turn by fair share, or an older job)",
    "no_capacity": "every worker large enough for it is busy: it starts when one has that many GPUs free",
    "no_scheduler": "no scheduler has passed lately, so nothing is dispatched: is grpo scheduler running?",
}

# Every error.code a job can fail with: the training core's (grpo_core), the worker's and the
# store's; and those a requeue records in its event's data (a fault of the machine, not the job's).
ERROR_CODES: dict[str, str] = {
    "invalid_spec": "the spec passed the checks at submit, but the worker found it unusable (a dataset "
                    "without the prompt column, a bad reward argument): fix the spec and submit again",
    "source_unavailable": "the model, tokenizer or dataset could not be read when the job loaded it "
                          "(the hub unreachable, a file gone since submit)",
    "non_finite_loss": "the loss became NaN or infinite and the step was not applied: lower the "
                       "learning rate, or check the rewards for extreme values",
    "reward_error": "a reward function raised an error or returned the wrong number of scores, or failed "
                    "on every row of a step (the message has its first exception, the grader's line and "
                    "a failing row)",
    "tool_error": "the spec's tools did not load in the sandbox (an exception when their source ran): "
                  "the message has it",
    "environment_error": "the spec's environment failed in an episode's sandbox: it did not load, reset or "
                         "step raised, answered something that is not what it must return, or went over its "
                         "time, memory or output limits (the message says which; try it with POST "
                         "/v1/environments/run)",
    "environment_unavailable": "the registered environment server could not be reached, refused a "
                               "session, or did not answer in time; the job goes back to the queue and "
                               "resumes from its checkpoint (an admin checks the server and "
                               "GRPO_ENVIRONMENT_ALLOWED_NETWORKS)",
    "reward_timeout": "rewards went over reward_timeout_seconds on 3 steps in a row",
    "reward_unavailable": "an http_verifier reward's service could not be reached on 3 steps in a row",
    "sandbox_unavailable": "the code sandbox that the code_tests reward runs in does not work on the worker",
    "out_of_memory": "the job ran out of memory: lower prompts_per_step, num_generations or the prompt "
                     "and completion lengths (the message names what to change)",
    "disk_full": "no space was left on the worker's disk to write a checkpoint",
    "artifact_quota_exceeded": "its team's checkpoints and models would go over the team's artifact "
                               "byte quota",
    "resume_unsupported": "its newest checkpoint cannot be resumed in this set-up (the message says why)",
    "stalled": "no step finished within the stall limit (GRPO_STALL_SECONDS, or the spec's "
               "stall_seconds), so its process was ended",
    "rank_failed": "one of the job's processes (ranks) raised an error: the message says which",
    "rank_died": "one of the job's processes (ranks) was killed or exited without saying why",
    "database_unavailable": "the worker could not reach the database for longer than its retry budget",
    "storage_unavailable": "the worker could not reach the object store (GRPO_STORAGE_URL) for longer "
                           "than its retry budget, at a resume or at the job's end",
    "capability_missing": "the worker no longer offers something the job's rewards need",
    "serving_unavailable": "a serving job lost Redis, where its chat requests come from: it went back "
                           "to the queue, and its requests were answered 503",
    "peer_lost": "a job spanning hosts lost one of them (its worker gone, or a rank on another host "
                 "killed): it went back to the queue to resume on a new set of hosts",
    "too_many_attempts": "it went back to the queue after a fault (a worker lost, a process killed) "
                         "GRPO_MAX_ATTEMPTS times: the message names the last cause; grpo retry gives "
                         "it a fresh budget",
    "grpo_error": "training stopped with an error: the message says why",
    "internal_error": "a bug in the service, not in the job: the message (and, for admins, the "
                      "traceback) says where",
    **{rule: f"stopped by its health rule (alerts: action stop): {text}"
       for rule, text in ALERT_RULES.items()},
}


def pending_reason_text(code: str | None) -> str | None:
    return PENDING_REASONS.get(code) if code else None


def error_code_text(code: str | None) -> str | None:
    return ERROR_CODES.get(code) if code else None
