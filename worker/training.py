"""What each process of an attempt trains: the job's components (as the only process, or as one
rank of several), resumed from the newest checkpoint, trained to the end or to a stop; and how a
run that returned ended. Which of the two runs, and how a failure ends the attempt, is
:mod:`worker.attempt`'s. Imported only where torch may load: the job's process and its rank
processes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from api.artifacts.paths import checkpoint_dir, model_key, remote_store, staging_dir
from api.domain.job_spec import JobSpec
from api.domain.lifecycle import JobStatus, StopRequest, stronger_stop
from api.schemas.jobs import JobRead
from api.settings import Settings
from api.storage import ObjectStore
from api.store import bus
from api.vocabulary import TRACKER_PROJECT
from grpo_core.egress import EgressPolicy
from grpo_core.errors import GRPOError
from grpo_core.io.model_export import export_model
from grpo_core.io.model_loading import resolve_model_location
from grpo_core.io.paths import folder_bytes
from grpo_core.oom import out_of_memory_error
from grpo_core.parallel.distributed import SINGLE, Ranks
from grpo_core.run.callbacks import CallbackList, TrainerCallback
from grpo_core.run.components import build_components
from grpo_core.run.tracking import trackers
from grpo_core.run.trainer import GRPOTrainer, TrainResult
from worker.artifacts import ArtifactQuota
from worker.attempt_files import AttemptFiles
from worker.checkpoint_uploads import StoredCheckpoints
from worker.counted_steps import CountedSteps
from worker.fencing import AttemptFence, FencedPublisher, StaleAttempt
from worker.job_sources import loadable
from worker.job_storage import store_final_model
from worker.outcome import STATUS_AFTER_STOP, Outcome, outcome_for_stop
from worker.reporting import JobReporter
from worker.retrying import DatabaseUnavailable
from worker.staged_artifacts import StagedFiles, published_of
from worker.verifiers import registered_verifiers

log = logging.getLogger(__name__)


class SupervisorLink(TrainerCallback):
    """The job's side of :mod:`worker.attempt_files`: progress for the supervisor's watchdog
    after every step and every event (training started or resumed, a checkpoint: the model has
    loaded, so the stall limit need only cover one step from there), and its stop request read
    before every step: the supervisor's stop file, or (``asked``) the job's own row, which the
    supervisor would only see at its next poll, several fast steps later."""

    def __init__(self, files: AttemptFiles, step: int = 0,
                 asked: Callable[[], str | None] | None = None) -> None:
        self.files, self.step, self.marks, self.asked = files, step, 0, asked

    def _mark(self) -> None:
        self.marks += 1
        self.files.mark_progress(self.step, self.marks)

    def on_step(self, record: dict[str, Any]) -> None:
        self.step = int(record["step"])
        self._mark()

    def on_event(self, type: str, message: str, data: dict[str, Any]) -> None:  # noqa: A002
        self._mark()

    def should_stop(self) -> bool:
        if self.files.stop_reason() is not None:
            return True
        reason = self.asked() if self.asked else None
        if reason is not None:
            self.files.request_stop(reason)  # so the attempt's ending names why it stopped
        return reason is not None


def train_reporting(job: JobRead, spec: JobSpec, settings: Settings, files: AttemptFiles,
                    ranks: Ranks) -> Outcome:
    """Train as the process that reports (the only one, or rank 0): to SQL and the job's stream,
    and to the supervisor through ``files``. Every artifact is staged and published under the
    attempt's fence (:mod:`worker.fencing`)."""
    client = bus.connect(settings)
    try:
        publish = bus.publisher(client, settings.redis_keys, settings.stream_maxlen)
        fence = attempt_fence(job, settings)
        reporter = JobReporter(settings.database_url, job.id, publish, job.attempt, settings.db_retry_seconds,
                               fence=fence)
        final, link = FinalMetrics(), SupervisorLink(files, job.last_step, reporter.stop_request)
        staged = StagedFiles(fence, settings, job.id, job.attempt)
        # The job's trackers write in the attempt's staging folder; one W&B run per job, resumed by
        # each attempt.
        tracked = trackers(spec, staged.trackers, run_id=f"job-{job.id}", project=TRACKER_PROJECT)
        quota = ArtifactQuota(settings, job.id, job.team_id)
        # First: a job whose counted length is over its pool's limits ends before "started" is recorded.
        counted = CountedSteps(settings, job, spec)
        store = remote_store(settings)
        # With a store apart from this folder, a checkpoint's row waits until the store holds it.
        recorded = reporter if store is None else StoredCheckpoints(
            reporter, store, job.id, job.attempt, settings.storage_retry_seconds,
            published_of(settings, job.id).checkpoints, fenced=fence.hold)
        callbacks = CallbackList([counted, quota, recorded, link, final, *tracked, staged])
        try:
            result = train_job(job, spec, settings, callbacks, ranks)
            if store is not None:
                recorded.flush()
            if not result.stopped and result.checkpoint is not None:
                export_final_model(job, spec, settings, result, final.record, callbacks, staged)
                if store is not None:
                    # Under this attempt's key: undone (a frozen upload) without touching another's.
                    fence.hold("the final model",
                               lambda: store_final_model(store, settings, job.id, job.attempt),
                               lambda: store.delete_prefix(model_key(job.id, job.attempt)))
        finally:
            _publish_trackers(staged, store)
    finally:
        client.close()
    return ending(result, files.stop_reason())


def _publish_trackers(staged: StagedFiles, store: ObjectStore | None) -> None:
    """At the attempt's end, whatever ended it: the trackers' files published (and stored), unless
    the attempt no longer owns the job or cannot tell (the database away), which is said here and
    left to the error that ended the attempt: charts are not worth hiding it."""
    try:
        staged.publish_trackers()
        if store is not None:
            staged.store_trackers(store)
    except (StaleAttempt, DatabaseUnavailable) as exc:
        log.warning("the trackers' files were not published: %s", exc)


def attempt_fence(job: JobRead, settings: Settings) -> AttemptFence:
    """The fence of the attempt ``job`` was claimed as (node 0's worker holds a gang's)."""
    return AttemptFence(settings, job.id, job.worker_id or "", job.attempt)


class FinalMetrics(TrainerCallback):
    """The last step's record, for the model card. A job resumed at its end has none: the card
    then says where it ended without figures (SQL has every step)."""

    def __init__(self) -> None:
        self.record: dict[str, Any] | None = None

    def on_step(self, record: dict[str, Any]) -> None:
        self.record = record


def export_final_model(job: JobRead, spec: JobSpec, settings: Settings, result: TrainResult,
                       metrics: dict[str, Any] | None, callbacks: TrainerCallback,
                       staged: StagedFiles) -> None:
    """The job's model folder from its final checkpoint, or with ``grpo.load_best_model_at_end``
    its best eval point's (:mod:`grpo_core.io.model_export`), exported in the attempt's staging
    folder and published under its fence, announced as a ``model`` event."""
    if spec.export.merge_lora:
        loading, roots = loadable(spec, settings)
        base = resolve_model_location(loading.model, roots.models)
    else:
        base = None
    checkpoint, step, best = result.checkpoint, result.step, None
    if spec.grpo.load_best_model_at_end and result.best is not None:
        checkpoint, best = result.best, result.best_summary
        step = best["step"]
    export_model(checkpoint, staged.model_stage(), spec, step, metrics,
                 job_id=job.id, base_location=base, best=best, trained_steps=result.step)
    size = folder_bytes(staged.publish_model())
    which = f"the best checkpoint's (step {step}, {best['metric']} {best['value']:.4g})" if best else \
        f"of step {step}"
    callbacks.on_event("model", f"final model {which} ready ({size:,} bytes)",
                       {"step": step, "bytes": size, **({"best": best} if best else {})})


def train_job(job: JobRead, spec: JobSpec, settings: Settings, callbacks: TrainerCallback,
              ranks: Ranks = SINGLE) -> TrainResult:
    """Build, resume and train; every rank of a job runs this with its own ``ranks``. Running out
    of memory is the job's own failure (its size), raised as ``out_of_memory`` here so that one
    process and every rank of several report it the same way."""
    spec, roots = loadable(spec, settings)
    # The service's cap on a reward call's budget holds for jobs queued before it was lowered too.
    budget = min(spec.reward_timeout_seconds, settings.max_reward_timeout_seconds)
    spec = spec.model_copy(update={"reward_timeout_seconds": budget})
    try:
        components = build_components(spec, models_root=roots.models, data_root=roots.data,
                                      device=None, ranks=ranks, reward_models_root=roots.reward_models,
                                      verifiers=registered_verifiers(spec, settings, job.team_id),
                                      egress=EgressPolicy.from_cidrs(settings.environment_networks))
        # Written in the attempt's staging folder, renamed into the job's under its fence.
        publisher = FencedPublisher(attempt_fence(job, settings), staging_dir(settings, job.id, job.attempt))
        trainer = GRPOTrainer(components, checkpoint_dir(settings, job.id), callbacks, publisher)
        # A requeued or preempted job continues from its newest complete checkpoint.
        trainer.resume()
        return trainer.train()
    except GRPOError:
        raise
    except Exception as exc:
        known = out_of_memory_error(exc)
        if known is None:
            raise
        raise known from exc


# What a health rule's action makes of the job (grpo_core.spec.alerts).
_ALERT_STOPS = {"pause": StopRequest.PAUSE, "stop": StopRequest.CANCEL}


def ending(result: TrainResult, stop_reason: StopRequest | None) -> Outcome:
    """How a run that returned ended: stopped for a cancel, a pause or a preemption, or by a
    health rule (paused, or cancelled with the rule as its code; a person's stronger request
    wins), early stopping included in finished."""
    alert = result.alert
    if alert is not None:
        asked = _ALERT_STOPS[alert.action]
        if stronger_stop(stop_reason, asked) == asked:
            status = STATUS_AFTER_STOP[asked]
            return Outcome(status, f"{status.value} by the {alert.rule} rule: {alert.message}",
                           error_code=alert.rule if asked is StopRequest.CANCEL else None, step=result.step)
    if result.stopped and stop_reason is not None:
        return outcome_for_stop(stop_reason, result.step)
    how = "stopped early (grpo.early_stopping_patience)" if result.early_stopped else "finished"
    return Outcome(JobStatus.SUCCEEDED, f"{how} at step {result.step}", step=result.step)
