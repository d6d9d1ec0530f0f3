"""The training loop: generate a round → score → advantages → ``round_steps · num_iterations``
optimizer steps on it (one, by default); at each eval point, an evaluation on the eval prompts.

It reports only through callbacks and writes nothing but checkpoints, so the same loop serves
``grpo train`` (JSONL files) and the service's worker (SQL + Redis).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_core.algorithm.evaluation import EvalInputs, EvalResult, evaluate
from grpo_core.algorithm.experience import Experience, make_experience
from grpo_core.algorithm.metrics import experience_metrics, peak_memory_mb, sample_rows, tokens_in
from grpo_core.algorithm.rollout import GenerationStopped
from grpo_core.algorithm.update import optimizer_step
from grpo_core.errors import GRPOError, RewardTimeout, RewardUnavailable
from grpo_core.parallel.stop_flag import StopFlag, stop_flag
from grpo_core.run.best_model import BestModel
from grpo_core.run.callbacks import ALERT_EVENT, BEST_CHECKPOINT_EVENT, TrainerCallback
from grpo_core.run.checkpoint import (
    TrainerState,
    estimate_checkpoint_bytes,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    sweep_stale_tmp_folders,
)
from grpo_core.run.components import RunComponents
from grpo_core.run.health import UNSCORED, Alert, HealthWatch, strongest
from grpo_core.run.publishing import Publisher
from grpo_core.run.reward_failures import report_unscored_rows
from grpo_core.spec.grpo_config import GRPOConfig
from grpo_core.spec.run_spec import REWARD_TIMEOUT_STEPS
from grpo_core.spec.size_checks import prompts_over_rows

# Phases that happen once per generation round: its later optimizer steps report 0.
_GENERATION_TIMINGS = ("timing/generation", "timing/reward", "timing/ref")
# Seconds between two asks of the callbacks' should_stop from inside a generation: the service's
# ask reads a file and the job's row, which every few decoded tokens would be far too often.
STOP_POLL_SECONDS = 1.0


@dataclass
class TrainResult:
    step: int
    stopped: bool  # True when should_stop, or a health rule that pauses or stops, ended the run early
    checkpoint: Path | None
    # The health alert whose action (pause or stop) ended the run; None: it was not one.
    alert: Alert | None = None
    # The best eval point's checkpoint (grpo.metric_for_best_model) and its summary; None: none.
    best: Path | None = None
    best_summary: dict | None = None
    early_stopped: bool = False  # grpo.early_stopping_patience ended it (as finished)


class GRPOTrainer:
    """Runs ``components`` for ``spec.grpo.max_steps`` steps. The one reader of the spec: each
    function it calls gets the model, config section and state it uses as arguments."""

    def __init__(
        self,
        components: RunComponents,
        checkpoint_dir: Path,
        callbacks: TrainerCallback | None = None,
        publisher: Publisher | None = None,
    ) -> None:
        self.components = components
        self.publisher = publisher or Publisher()
        self.config: GRPOConfig = components.spec.grpo
        self.checkpoint_dir = Path(checkpoint_dir)
        self.callbacks = callbacks or TrainerCallback()
        self.reward_names = [r.name for r in components.rewards]
        self.state = TrainerState(step=0, num_tokens=0, sampler={}, iteration=0, has_experience=False)
        self.pending: Experience | None = None
        self.last_checkpoint: Path | None = None
        self.ranks = components.placement.ranks
        # How a stop reaches every rank inside a generation (None: one process, or no launch store).
        self.stop_flag: StopFlag | None = stop_flag(self.ranks)
        self.reward_timeout_streak = 0  # consecutive steps with a reward call over its budget
        self.reward_unavailable_streak = 0  # consecutive steps with a reward service unreachable
        self.unscored_ratio = 0.0  # the current round's rows a reward left unscored, as a fraction
        self.health = HealthWatch(components.spec.alerts)
        self.best = BestModel(self.config) if self.config.best_model_metric is not None else None
        # A health rule that pauses or stops tripped at this step (on some rank: ``halted``; this
        # rank's alert, ``halted_by``, which rank 0's result carries).
        self.halted, self.halted_by = False, None
        self.early_stop = False
        # Optimizer steps between evaluations; None: the run does not evaluate.
        evaluates = components.eval_prompts is not None
        self.eval_interval = self.config.eval_interval_for(self.max_steps) if evaluates else None

    @property
    def max_steps(self) -> int:
        return self.config.max_steps

    def make_experience(self) -> Experience:
        """Sample and score a fresh generation round with the current policy. A stop asked for
        inside its generation raises :class:`GenerationStopped` with the sampler put back: none of
        the round's prompts was trained on, so a resumed run draws them again, as an uninterrupted
        run does."""
        c = self.components
        drawn_from = c.sampler.state_dict()
        try:
            return make_experience(
                models=c.models,
                tokenizer=c.tokenizer,
                prompts=c.prompts,
                sampler=c.sampler,
                rewards=c.rewards,
                eos_ids=c.eos_ids,
                config=self.config,
                reasoning=c.spec.reasoning,
                placement=c.placement,
                should_stop=self._stop_inside_generation(),
                agent=c.agent,
            )
        except GenerationStopped:
            c.sampler.load_state_dict(drawn_from)
            raise

    def _stop_inside_generation(self) -> Callable[[], bool] | None:
        """The callbacks' should_stop for the decode loop, asked at most every STOP_POLL_SECONDS
        (the first time that long after the step's own ask). With several ranks a yes raises the
        launch's stop flag, which every rank's ask reads (:mod:`grpo_core.parallel.stop_flag`);
        None where ranks have no flag: they stop at the next step's ask instead."""
        flag = self.stop_flag
        if self.ranks.world_size > 1 and flag is None:
            return None
        last = time.monotonic()

        def ask() -> bool:
            nonlocal last
            now = time.monotonic()
            if now - last < STOP_POLL_SECONDS:
                return False
            last = now
            if self.callbacks.should_stop():
                if flag is not None:
                    flag.raise_flag()
                return True
            return flag is not None and flag.is_raised()

        return ask

    def optimizer_step(self, experience: Experience) -> dict[str, float]:
        """One optimizer step on ``experience``; returns the update's metrics."""
        c = self.components
        return optimizer_step(
            policy=c.models.policy,
            optimizer=c.optimizer,
            scheduler=c.scheduler,
            experience=experience,
            config=self.config,
            placement=c.placement,
        )

    def is_eval_step(self, step: int) -> bool:
        """Whether ``step`` is an eval point: step 0 with eval_on_start, every eval_interval-th step,
        and the final step."""
        if self.eval_interval is None:
            return False
        if step == 0:
            return self.config.eval_on_start
        return step % self.eval_interval == 0 or step == self.max_steps

    def evaluate(self, step: int) -> EvalResult:
        """Evaluate the current policy as eval point ``step``; its metrics include timing/eval
        (the slowest rank's)."""
        c = self.components
        if c.eval_prompts is None:
            raise ValueError("this run has no eval prompts: its spec sets no eval_dataset")
        started = time.perf_counter()
        result = evaluate(EvalInputs(c.models.policy, c.tokenizer, c.eval_prompts, c.rewards, c.eos_ids,
                                     self.config, c.spec.reasoning, c.placement, c.agent), step)
        result.metrics["timing/eval"] = self.ranks.max([time.perf_counter() - started])[0]
        return result

    def resume(self, path: Path | None = None) -> bool:
        """Continue from ``path`` or the newest checkpoint; False when there is none. Temporary
        folders left by a writer that was killed mid-checkpoint are removed first."""
        if self.ranks.is_main:
            sweep_stale_tmp_folders(self.publisher.staging or self.checkpoint_dir)
        path = path or latest_checkpoint(self.checkpoint_dir)
        self._same_checkpoint_everywhere(path)
        if path is None:
            return False
        c = self.components
        self.state, self.pending = load_checkpoint(
            path,
            models=c.models,
            optimizer=c.optimizer,
            scheduler=c.scheduler,
            sampler=c.sampler,
            ranks=self.ranks,
        )
        self.last_checkpoint = path
        self.health = HealthWatch(c.spec.alerts, self.state.health)
        if self.best is not None:
            self.best = BestModel(self.config, self.state.best)
        self.callbacks.on_event(
            "resumed",
            f"resumed from step {self.state.step}",
            {"step": self.state.step, "checkpoint": str(path)},
        )
        return True

    def _same_checkpoint_everywhere(self, path: Path | None) -> None:
        """Every rank reads its own checkpoint folder, which on ranks spanning hosts is its host's:
        they must all have found the same newest checkpoint (or none), else their states and
        collectives would part ways (one rank resuming at step N while another starts at 0)."""
        found = self.ranks.gather_objects(None if path is None else path.name)
        if len(set(found)) > 1:
            seen = ", ".join(f"rank {rank}: {name or 'none'}" for rank, name in enumerate(found))
            raise GRPOError(f"the ranks found different newest checkpoints ({seen}): hosts that share no "
                            "folder need the object store (GRPO_STORAGE_URL) to resume from one",
                            code="resume_unsupported")

    def train(self) -> TrainResult:
        if self.state.step == 0:
            # The counts a service checks against its limits once the data is loaded (the eval
            # prompts of a file or hub eval set are known only now).
            counts = {"max_steps": self.max_steps}
            if self.components.eval_prompts is not None:
                counts["eval_prompts"] = len(self.components.eval_prompts.rows)
            self.callbacks.on_event("started", "training started", counts)
            self._warn_of_prompts_over_rows()
            if self.is_eval_step(0):
                # Step 0 is never checkpointed: a run stopped before step 1 evaluates it again.
                result = self.evaluate(0)
                self.callbacks.on_step({"step": 0, **result.metrics})
                self.callbacks.on_samples(0, result.samples)
        while self.state.step < self.max_steps and not self.early_stop:
            if self.ranks.any(self.callbacks.should_stop()):
                return self._stopped()
            try:
                self._one_step()
            except GenerationStopped as inside:
                return self._stopped(inside)
            if self.halted:
                return self._halted(self.halted_by)
        path = self._checkpoint()
        self.callbacks.on_event("finished", f"finished at step {self.state.step}", {"step": self.state.step})
        return self._result(False, path, early_stopped=self.early_stop)

    def _result(self, stopped: bool, path: Path | None, **ending: Any) -> TrainResult:
        """How the run ended, with its best eval point's checkpoint when it keeps one."""
        return TrainResult(self.state.step, stopped, path, best=self._best_checkpoint(),
                           best_summary=self.best.summary() if self.best else None, **ending)

    def _best_checkpoint(self) -> Path | None:
        """The best eval point's checkpoint folder (it was saved when it became the best)."""
        if self.best is None or self.best.step is None:
            return None
        return self.checkpoint_dir / f"step-{self.best.step}"

    def _halted(self, alert: Alert | None) -> TrainResult:
        """End the run for a health rule whose action pauses or stops it: checkpoint the step the
        rule tripped at (so a person can resume or clone from it) and say so."""
        path = self._checkpoint()
        if alert is not None:
            self.callbacks.on_event("stopped", f"stopped at step {self.state.step} by the {alert.rule} rule "
                                    f"({alert.action})", {"step": self.state.step, "alert": alert.rule})
        return self._result(True, path, alert=alert)

    def _warn_of_prompts_over_rows(self) -> None:
        """A round drawing more prompts than a loaded dataset's rows, told once when training
        starts (inline rows are counted at submit: :meth:`RunSpec.warnings`)."""
        rows = len(self.components.prompts.rows)
        over = prompts_over_rows(self.config, rows) if self.components.spec.dataset.prompts is None else None
        if over is not None:
            self.callbacks.on_event(over.event, str(over), {"field": over.field, "rows": rows})

    def _stopped(self, inside: GenerationStopped | None = None) -> TrainResult:
        """End the run on a stop request: checkpoint the last trained step (a step whose generation
        was stopped trained nothing) and say where it stopped."""
        path = self._checkpoint()
        message, data = f"stopped at step {self.state.step}", {"step": self.state.step}
        if inside is not None:
            message += (f", inside step {self.state.step + 1}'s generation ({inside}); "
                        "that step was not trained")
            data["generation_tokens"] = inside.tokens
        self.callbacks.on_event("stopped", message, data)
        return TrainResult(self.state.step, True, path)

    def _one_step(self) -> None:
        """One optimizer step: on a fresh round, or on the pending one (restored from a checkpoint
        after a resume, so a step inside a round trains on exactly the rows it would have).
        A round of k steps feeds its parts 0..k-1 in order, then again for each further iteration,
        as TRL replays its generation batch."""
        started = time.perf_counter()
        fresh = self.pending is None
        generation_round = self.make_experience() if fresh else self.pending
        if fresh:
            self._count_reward_timeouts(generation_round)
            self.unscored_ratio = self._count_service_failures(generation_round)
        k = self.config.round_steps
        first_pass = self.state.iteration < k  # this part's tokens are counted once
        exp = generation_round.step_part(self.state.iteration % k, k)
        step_tokens = self.ranks.sum([tokens_in(exp)])[0] if first_pass else 0.0
        self.state.num_tokens += int(step_tokens)
        update = self.optimizer_step(exp)
        self.state.iteration += 1
        self.pending = generation_round if self.state.iteration < k * self.config.num_iterations else None
        if self.pending is None:
            self.state.iteration = 0
        self.state.step += 1
        step_time = time.perf_counter() - started
        record = {"step": self.state.step, **experience_metrics(exp, self.reward_names, self.ranks), **update}
        if not fresh:
            record.update(dict.fromkeys(_GENERATION_TIMINGS, 0.0))
        record[UNSCORED] = self.unscored_ratio  # the round's: every step of it trains on those rows
        record["peak_memory_mb"] = peak_memory_mb(self.components.device)
        # Wall-clock figures and memory are the slowest (largest) rank's.
        slowest = [k for k in record if k.startswith("timing/") or k == "peak_memory_mb"]
        record.update(zip(slowest, self.ranks.max([record[k] for k in slowest]), strict=True))
        record.update(
            {
                "num_tokens": self.state.num_tokens,
                "step_time": step_time,
                "tokens_per_second": (step_tokens / step_time) if first_pass else 0.0,
            }
        )
        # The step's evaluation runs after its update and before its checkpoint, so a run resumed
        # from that checkpoint neither repeats it nor skips it.
        samples = []
        if self.is_eval_step(self.state.step):
            evaluation = self.evaluate(self.state.step)
            record.update(evaluation.metrics)
            samples = evaluation.samples
        self.callbacks.on_step(record)
        if self.state.step % self.components.spec.log_completions_every == 0 or self.state.step == 1:
            samples = sample_rows(exp, self.reward_names, self.state.step, self.ranks) + samples
        if samples:
            # One call per step: a step's samples are stored once (training's first, then eval's).
            self.callbacks.on_samples(self.state.step, samples)
        self._watch_health(record)
        new_best = self._judge_eval_point(record)
        if self.state.step % self.components.spec.checkpoint_every == 0 or new_best:
            self._checkpoint()
        if new_best:  # told once its checkpoint exists, so the job's best always names one
            summary = self.best.summary()
            message = f"new best {summary['metric']} {summary['value']:.4g} at step {summary['step']}"
            self.callbacks.on_event(BEST_CHECKPOINT_EVENT, message, summary)

    def _watch_health(self, record: dict) -> None:
        """The health rules on this step's record: an ``alert`` event for each that tripped, and
        the run ends (after this step's checkpoint) when one pauses or stops it. Every rank judges
        the same record; they agree on ending through one collective all the same."""
        alerts = self.health.observe(record)
        for alert in alerts:
            self.callbacks.on_event(ALERT_EVENT, alert.message, alert.data())
        self.halted_by = strongest(alerts)
        self.halted = self.ranks.any(self.halted_by is not None)

    def _judge_eval_point(self, record: dict) -> bool:
        """At an eval point: whether it is the best so far (then it is checkpointed), and whether
        early stopping's patience ran out (the run then ends as finished, after this step)."""
        if self.best is None:
            return False
        verdict = self.best.observe(self.state.step, record)
        if verdict is None:
            return False
        if self.ranks.any(verdict.stop):
            self.early_stop = True
            best = self.best.summary()
            where = f"; the best was step {best['step']} ({best['value']:.4g})" if best else ""
            self.callbacks.on_event(
                "early_stopped",
                f"early stopping at step {self.state.step}: {self.best.metric} did not improve by more than "
                f"{self.best.threshold:g} in {self.best.patience} evaluation(s){where}",
                {"step": self.state.step, "metric": self.best.metric, "patience": self.best.patience,
                 "best": best})
        return verdict.new_best

    def _count_reward_timeouts(self, exp: Experience) -> None:
        """A warning event for each step whose reward calls went over budget (their rows trained
        with advantage 0); :data:`REWARD_TIMEOUT_STEPS` such steps in a row fail the job before
        the last one's update. Counted over every rank, so all ranks stop together."""
        calls = int(self.ranks.sum([float(len(exp.reward_timeouts))])[0])
        self.reward_timeout_streak = self.reward_timeout_streak + 1 if calls else 0
        if not calls:
            return
        step, budget = self.state.step + 1, self.components.spec.reward_timeout_seconds
        names = sorted(set(exp.reward_timeouts))
        self.callbacks.on_event(
            "reward_timeout",
            f"step {step}: {calls} reward call(s) took over {budget:g} s ({', '.join(names)}); "
            "their rows were left unscorable",
            {"step": step, "calls": calls, "rewards": names, "steps_in_a_row": self.reward_timeout_streak},
        )
        if self.reward_timeout_streak >= REWARD_TIMEOUT_STEPS:
            raise RewardTimeout(
                f"rewards took over reward_timeout_seconds ({budget:g} s) in {self.reward_timeout_streak} "
                f"steps in a row (last: step {step}, {', '.join(names)})"
            )

    def _count_service_failures(self, exp: Experience) -> float:
        """Warning events for rows a reward left unscored (:mod:`grpo_core.run.reward_failures`,
        which ends the run when a reward failed on every row) and for calls whose service could
        not be reached (those rows trained with advantage 0); unreachable in
        :data:`REWARD_TIMEOUT_STEPS` steps in a row fails the job ``reward_unavailable``, as
        timeouts fail it ``reward_timeout``. Counted over every rank, so all ranks stop together."""
        step = self.state.step + 1
        unscored_ratio = report_unscored_rows(exp, self.reward_names, step, self.ranks, self.callbacks)
        calls = int(self.ranks.sum([float(len(exp.reward_unavailable))])[0])
        self.reward_unavailable_streak = self.reward_unavailable_streak + 1 if calls else 0
        if not calls:
            return unscored_ratio
        names = sorted(exp.reward_unavailable)
        why = "; ".join(exp.reward_unavailable[name] for name in names)  # this rank's; others may differ
        self.callbacks.on_event(
            "reward_unavailable",
            f"step {step}: {calls} reward call(s) could not reach their service ({why}); "
            "their rows were left unscorable",
            {"step": step, "calls": calls, "rewards": names,
             "steps_in_a_row": self.reward_unavailable_streak},
        )
        if self.reward_unavailable_streak >= REWARD_TIMEOUT_STEPS:
            raise RewardUnavailable(
                f"reward services could not be reached in {self.reward_unavailable_streak} steps in a row "
                f"(last: step {step}: {why})"
            )
        return unscored_ratio

    def _checkpoint(self) -> Path | None:
        """Save the current step unless it is already saved (or nothing was trained). Every rank
        takes part (each writes its share); rank 0 alone reports it."""
        if self.state.step == 0:
            return None
        if self.last_checkpoint is not None and self.last_checkpoint.name == f"step-{self.state.step}":
            return self.last_checkpoint
        c = self.components
        # Every rank asks (only rank 0's callbacks do anything): a refusal raised here ends the
        # run before any rank has written a byte.
        estimate = estimate_checkpoint_bytes(c.models, c.optimizer, self.last_checkpoint)
        self.callbacks.before_checkpoint(self.state.step, estimate)
        self.state.sampler = c.sampler.state_dict()
        self.state.has_experience = self.pending is not None
        self.state.world_size = self.ranks.world_size
        self.state.health = self.health.state_dict()
        self.state.best = self.best.state_dict() if self.best is not None else None
        path = save_checkpoint(
            self.checkpoint_dir,
            self.state,
            models=c.models,
            tokenizer=c.tokenizer,
            optimizer=c.optimizer,
            scheduler=c.scheduler,
            experience=self.pending,
            ranks=self.ranks,
            distributed=c.spec.resources.sharding == "fsdp",
            publisher=self.publisher,
        )
        self.last_checkpoint = path
        if self.ranks.is_main:
            # Reported (its row written) before retention prunes the older ones: a process killed
            # between the two then leaves the newest reported checkpoint whole. Pruned first, the
            # last reported one could have lost its optimizer state while the new one had no row.
            self.callbacks.on_checkpoint(self.state.step, path)
            removed = self.publisher.remove("older checkpoints", lambda: prune_checkpoints(
                self.checkpoint_dir, c.spec.checkpoint_keep_last, path, self._best_checkpoint()))
            if removed:
                self.callbacks.on_checkpoints_removed(removed)
            self.callbacks.on_event(
                "checkpoint",
                f"checkpoint at step {self.state.step}",
                {"step": self.state.step, "path": str(path)},
            )
        return path
