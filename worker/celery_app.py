"""The worker's entrypoint: ``celery -A worker.celery_app worker`` (or ``grpo worker``, which
passes the same options); ``GRPO_POOL`` and ``GRPO_WORKER_GPUS`` say what it serves.

Each worker consumes its own queue (``RedisKeys.worker_queue``, in the deployment's namespace):
the scheduler places every job on one worker, so no other worker of the pool may take the
message. The queue is added at setup whatever ``-Q`` says, and is the default queue when ``-Q``
is not given.

One job at a time per process and a fresh child per job (``worker_max_tasks_per_child=1``): a
job's CUDA context, memory fragmentation and any leaked threads die with its child, and the main
process, which forks the children, never imports torch, so CUDA is only ever touched in a child.
Late acks with ``task_reject_on_worker_lost`` put the message back when a child is killed; the
claim makes that redelivery harmless (it finds the job no longer ``dispatched``).

Settings whose default Celery 5 warns it will change in 6.0 are pinned, so an upgrade cannot
change how jobs survive a broker outage (see :data:`PINNED_FOR_CELERY_6`).
"""

from __future__ import annotations

import logging

from celery import Celery, signals

from api.settings import Settings, get_settings
from grpo_core.rewards.sandbox import CAPABILITY as SANDBOX
from worker.devices import device_count
from worker.heartbeat import WorkerHeartbeat, current_worker_id
from worker.reward_trials import RewardTrialResponder
from worker.warm_spare import drop_spare, prepare_spare

log = logging.getLogger(__name__)

# The message only starts a job; SQL (claim, lease, outcome) is the record of it.
PINNED_FOR_CELERY_6 = {
    # False (6.0 makes it True): on a lost broker connection Celery would kill every running
    # late-ack task, i.e. every training job, to have its message redelivered. A Redis restart
    # must not cost each job its work since its last checkpoint: the job keeps running and
    # renewing its lease in SQL; its message, which can no longer be acked, comes back only after
    # the visibility timeout, and the claim refuses it then.
    "worker_cancel_long_running_tasks_on_connection_loss": False,
    # A worker started while Redis is still coming up waits for it instead of exiting.
    "broker_connection_retry_on_startup": True,
    # Replace task_acks_on_failure_or_timeout (deprecated in 6.0): a task that raised has already
    # recorded its job's end (or the lease reaper will); redelivering it could only lose the claim.
    "task_acks_on_failure": True,
    "task_acks_on_timeout": True,
}


def create_celery(settings: Settings) -> Celery:
    app = Celery("grpo_worker", broker=settings.redis_url, include=["worker.tasks"])
    app.conf.update(
        **PINNED_FOR_CELERY_6,
        task_default_queue=settings.redis_keys.worker_queue(current_worker_id()),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        # One child per device the worker owns: it runs that many jobs at once, each on its own.
        worker_concurrency=device_count(settings),
        worker_pool="prefork",
        worker_max_tasks_per_child=1,
        # A new pool process starts its job's warm spare before it reports up (worker.warm_spare);
        # on a loaded host that can pass billiard's 4 s, which would kill and replace the child.
        worker_proc_alive_timeout=30.0,
        # Jobs run for hours: a message must not be redelivered to another worker while its job
        # runs. A real duplicate would only lose the claim, but it would hold a slot meanwhile.
        broker_transport_options={"visibility_timeout": 7 * 24 * 3600},
        worker_hijack_root_logger=False,
    )
    return app


app = create_celery(get_settings())
_heartbeat: WorkerHeartbeat | None = None
_reward_trials: RewardTrialResponder | None = None


@signals.worker_init.connect
def _name_this_worker(**_: object) -> None:
    """Fix the worker id in the environment before the pool forks, so job children report it."""
    current_worker_id()


@signals.celeryd_after_setup.connect
def _consume_own_queue(sender: object, instance: object, **_: object) -> None:
    """Also when started with ``-Q``: the scheduler only ever sends to this queue."""
    instance.app.amqp.queues.select_add(get_settings().redis_keys.worker_queue(current_worker_id()))


@signals.worker_process_init.connect
def _warm_the_next_job_process(**_: object) -> None:
    """Each pool process runs one job (``worker_max_tasks_per_child``) and is replaced when it
    ends: the new one starts its job's process now, so it is past its imports when the job comes."""
    settings = get_settings()
    prepare_spare(settings.warm_job_process)


@signals.worker_process_shutdown.connect
def _end_the_spare(**_: object) -> None:
    drop_spare()


@signals.worker_ready.connect
def _start_heartbeat(**_: object) -> None:
    """Advertise capacity only once the consumer is ready: the scheduler dispatches on it."""
    global _heartbeat, _reward_trials
    settings = get_settings()
    heartbeat = _heartbeat = WorkerHeartbeat(settings, current_worker_id())
    heartbeat.start()
    # Rewards dry runs the API relays, answered while the heartbeat advertises the sandbox.
    _reward_trials = RewardTrialResponder(settings, lambda: SANDBOX in heartbeat.static.capabilities)
    _reward_trials.start()
    log.info("worker %s serves pool %s in namespace %s", current_worker_id(), settings.pool,
             settings.namespace)


@signals.worker_shutting_down.connect
def _stop_heartbeat(**_: object) -> None:
    """Withdraw at the start of a (warm) shutdown so no new job is dispatched to a leaving worker."""
    if _reward_trials is not None:
        _reward_trials.stop()
    if _heartbeat is not None:
        _heartbeat.stop()


@signals.worker_shutdown.connect
def _stop_heartbeat_late(**_: object) -> None:
    _stop_heartbeat()
