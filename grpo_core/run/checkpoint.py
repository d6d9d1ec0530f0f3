"""Checkpoints: everything needed to continue a run exactly where it stopped.

``step-N/`` holds the weights as a Hugging Face folder (safetensors; the adapter only with
LoRA) plus the tokenizer, so it is usable on its own, and beside them the optimizer,
scheduler, RNG states, data position and, when stopped inside a generation round that feeds
several optimizer steps (``num_iterations``, ``steps_per_generation``), the round being trained
on: every rank's share of it, one file per rank (``experience.pt`` alone on one process), so it
resumes on the same number of ranks.

Under ``sharding: fsdp`` the trainable weights and the optimizer state are also written with
``torch.distributed.checkpoint`` into ``step-N/distributed/`` by every rank, each its shards;
that format is resharded on load, so such a checkpoint resumes on any number of ranks (one
process included), and the Hugging Face folder beside it is the gathered export. Under ddp
rank 0 writes ``optimizer.pt``, as a single process does.

All ranks write into one temporary folder that rank 0 renames into place once every rank is
done, so a crash never leaves a half-written ``step-N``; a failed write removes that folder, and a
full disk is reported as ``disk_full`` with the path and the space left. Where that folder is and
how it is put in place is the run's :class:`Publisher`: by default beside the checkpoints, renamed
over; a service whose run may outlive its claim on the folder supplies one that writes elsewhere
and checks its claim first (the worker's fencing), since the core knows nothing of leases. Once a
checkpoint is complete, rank 0 deletes those beyond the spec's ``checkpoint_keep_last`` and
``optimizer.pt`` from all but the newest (``prune_checkpoints``); the sharded ``distributed/``
state, which holds the weights too, stays whole.

When the ranks span hosts, the hosts share no disk: only node 0's folder is the checkpoint (the
service uploads it, and every host fetches the stored checkpoint into its own folder before a
resume), so a path rank 0 made means nothing on another host. There rank 0 writes everything
and the other ranks write nothing, nor make any folder: every rank's share of a pending round
comes to rank 0 over the process group (the same ``experience-rank{r}.pt`` files), and under fsdp
the weights and optimizer state are gathered whole into rank 0's CPU memory and written in the
non-distributed format (``optimizer.pt`` and the export, ``grpo_core.run.full_state``), which a
sharded run loads on any number of ranks, and one process too. The cost: rank 0 holds the whole
optimizer state (twice the weights in float32 for AdamW) in CPU memory at each checkpoint, which a
large host affords up to ~10B parameters. The scalable way, each host uploading its own shards
and node 0 marking the checkpoint complete once all are stored, is not built. Loading reads
whichever format the folder has, so a run moves between one host and several either way.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file

from grpo_core.algorithm.optim import reapply_schedule
from grpo_core.errors import GRPOError
from grpo_core.io.disk_space import disk_full_reported
from grpo_core.io.model_loading import PolicyAndReference
from grpo_core.io.paths import folder_bytes
from grpo_core.io.prompt_data import PromptSampler
from grpo_core.parallel.distributed import SINGLE, Ranks
from grpo_core.parallel.sharding import is_sharded
from grpo_core.run.full_state import OPTIMIZER_FILE, gathered_state, load_full_state
from grpo_core.run.processes import process_alive
from grpo_core.run.publishing import Publisher

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from grpo_core.algorithm.experience import Experience

STATE_FILE = "trainer_state.json"
DISTRIBUTED_DIR = "distributed"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_DIR = re.compile(r"^\.step-\d+\.tmp-(\d+)$")  # rank 0's pid: the writer


@dataclass
class TrainerState:
    step: int
    num_tokens: int
    sampler: dict[str, int]
    iteration: int  # optimizer steps already taken on the pending generation round
    has_experience: bool
    world_size: int = 1  # ranks the pending experience is split over, one file each
    # The health rules' windows and streaks (grpo_core.run.health) and the best eval point so far
    # (grpo_core.run.best_model): a resumed run goes on judging where it was.
    health: dict[str, Any] = field(default_factory=dict)
    best: dict[str, Any] | None = None


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    state: TrainerState,
    *,
    models: PolicyAndReference,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    experience: Experience | None = None,
    ranks: Ranks = SINGLE,
    distributed: bool = False,
    publisher: Publisher | None = None,
) -> Path:
    """Write ``root/step-{state.step}`` atomically and return it. Every rank calls this;
    ``distributed`` selects the ``torch.distributed.checkpoint`` format (``sharding: fsdp``) on
    one host. Across hosts rank 0 alone writes (the module docstring says why). ``publisher``
    says where it is written and how it is put in place (:class:`Publisher` by default)."""
    publisher = publisher or Publisher()
    final = root / f"step-{state.step}"
    contents = _Contents(models, tokenizer, optimizer, scheduler, experience)
    if _spans_hosts(ranks):
        _save_on_rank_0(root, state, contents, ranks, distributed, publisher)
        return final
    tmp = _shared_tmp_folder(publisher.staging or root, state.step, ranks)
    # Whichever rank fails removes the shared folder: a half-written checkpoint is useless,
    # and on a full disk its bytes are the ones the next attempt needs.
    with disk_full_reported(tmp, "checkpoint", undo=lambda: shutil.rmtree(tmp, ignore_errors=True)):
        _write_into(tmp, state, contents, ranks, distributed)
    if ranks.is_main:
        publisher.publish(tmp, final)
    return final


@dataclass(frozen=True)
class _Contents:
    """What a checkpoint saves besides the trainer state, as the trainer passed it."""

    models: PolicyAndReference
    tokenizer: PreTrainedTokenizerBase
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    experience: Experience | None


def _write_into(tmp: Path, state: TrainerState, contents: _Contents, ranks: Ranks, distributed: bool) -> None:
    weights = _save_distributed(tmp, contents.models, contents.optimizer) if distributed else None
    if ranks.is_main:
        # ``weights`` is the gathered state under fsdp; None saves the module's own.
        _write_main_files(tmp, contents, weights, None if distributed else contents.optimizer.state_dict())
    if contents.experience is not None:
        torch.save(contents.experience, tmp / _experience_file(ranks.rank, ranks.world_size))
    ranks.barrier()
    if ranks.is_main:
        _mark_complete(tmp, state)


def _write_main_files(tmp: Path, contents: _Contents, weights: dict[str, torch.Tensor] | None,
                      optimizer_state: dict[str, Any] | None) -> None:
    """Rank 0's files: the export (``weights``, or the module's own when None), the tokenizer,
    the optimizer state unless it is in the distributed format, the scheduler and RNG."""
    contents.models.policy.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
    contents.tokenizer.save_pretrained(tmp)
    if optimizer_state is not None:
        torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
    torch.save(contents.scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(rng_state(), tmp / "rng.pt")


def _mark_complete(tmp: Path, state: TrainerState) -> None:
    # Written last: its presence marks the checkpoint complete.
    (tmp / STATE_FILE).write_text(json.dumps(state.__dict__, indent=2))


def _spans_hosts(ranks: Ranks) -> bool:
    return len(ranks.node_sizes) > 1


def _save_on_rank_0(root: Path, state: TrainerState, contents: _Contents, ranks: Ranks,
                    distributed: bool, publisher: Publisher) -> None:
    """Across hosts: what other ranks hold comes to rank 0, which writes the whole checkpoint in
    its own folder; the others write nothing. Under fsdp the state is gathered whole (CPU)."""
    optimizer = contents.optimizer
    weights, optimizer_state = gathered_state(contents.models, optimizer) if distributed else (None, None)
    # Each rank's pending share, serialized as that rank would have written its file.
    experience = contents.experience
    shares = ranks.gather_objects(None if experience is None else _serialized(experience))
    if not ranks.is_main:
        return
    if not distributed:
        optimizer_state = optimizer.state_dict()  # replicated under ddp: rank 0's is everyone's
    final = root / f"step-{state.step}"
    tmp = (publisher.staging or root) / f".step-{state.step}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with disk_full_reported(tmp, "checkpoint", undo=lambda: shutil.rmtree(tmp, ignore_errors=True)):
        tmp.mkdir(parents=True)
        _write_main_files(tmp, contents, weights, optimizer_state)
        for rank, share in enumerate(shares):
            if share is not None:
                (tmp / _experience_file(rank, ranks.world_size)).write_bytes(share)
        _mark_complete(tmp, state)
    publisher.publish(tmp, final)


def _serialized(experience: Experience) -> bytes:
    buffer = io.BytesIO()
    torch.save(experience, buffer)
    return buffer.getvalue()


def sweep_stale_tmp_folders(root: Path) -> list[Path]:
    """Remove the temporary folders of writers that are gone (killed mid-write, so their own
    cleanup never ran) and return them. Called at resume, when this process writes nothing: its
    own pid's folders are stale too. A live pid's folder is left, since it may be another
    process's write in progress (or a reused pid: the next sweep after it ends removes it)."""
    if not root.is_dir():
        return []
    stale = [path for path in root.iterdir()
             if (m := _TMP_DIR.match(path.name)) and not _writer_alive(int(m.group(1)))]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _writer_alive(pid: int) -> bool:
    # This process writes nothing while it sweeps: its own folders are stale too.
    return pid != os.getpid() and process_alive(pid)


def estimate_checkpoint_bytes(models: PolicyAndReference, optimizer: torch.optim.Optimizer,
                              last: Path | None) -> int:
    """About how large the next checkpoint will be: the size of ``last`` (the run's newest, which
    has every file the next one will have), else the saved weights (the adapter alone with LoRA)
    plus the optimizer state (before its first step, AdamW's two float32 moments)."""
    if last is not None and last.is_dir():
        return folder_bytes(last)
    trainable = [p for p in models.policy.parameters() if p.requires_grad]
    saved = trainable if models.uses_adapters else list(models.policy.parameters())
    weights = sum(p.numel() * p.element_size() for p in saved)
    state = sum(t.numel() * t.element_size() for entry in optimizer.state.values()
                for t in entry.values() if isinstance(t, torch.Tensor))
    return weights + (state or 2 * 4 * sum(p.numel() for p in trainable))


def _shared_tmp_folder(root: Path, step: int, ranks: Ranks) -> Path:
    """Rank 0 makes a fresh temporary folder (its pid in the name) and every rank learns it; the
    exchange also keeps the other ranks from writing before it exists."""
    tmp = None
    if ranks.is_main:
        tmp = root / f".step-{step}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    return ranks.gather_objects(tmp)[0]


def _experience_file(rank: int, world_size: int) -> str:
    return "experience.pt" if world_size == 1 else f"experience-rank{rank}.pt"


def _state_dict_options(**options: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Frozen parameters (a LoRA base) come from the model source, as with the adapter export.
    return StateDictOptions(ignore_frozen_params=True, **options)


def _save_distributed(
    folder: Path, models: PolicyAndReference, optimizer: torch.optim.Optimizer
) -> dict[str, torch.Tensor]:
    """Every rank writes its shards of the trainable weights and optimizer state; returns the
    gathered full weights on rank 0 (empty elsewhere), for the Hugging Face export."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    weights, optim = get_state_dict(models.policy, optimizer, options=_state_dict_options())
    dcp.save({"model": weights, "optimizer": optim}, checkpoint_id=folder / DISTRIBUTED_DIR)
    full = _state_dict_options(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(models.policy, options=full)


def _load_distributed(folder: Path, models: PolicyAndReference, optimizer: torch.optim.Optimizer) -> None:
    """Read the shards this rank's (possibly differently sharded, or unsharded) model needs."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    options = _state_dict_options()
    weights, optim = get_state_dict(models.policy, optimizer, options=options)
    state = {"model": weights, "optimizer": optim}
    dcp.load(state, checkpoint_id=folder / DISTRIBUTED_DIR)
    set_state_dict(
        models.policy,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=options,
    )


def _complete_checkpoints(root: Path) -> list[Path]:
    """The complete ``step-N`` folders under ``root``, oldest step first."""
    if not root.is_dir():
        return []
    complete = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return [p for _, p in sorted(complete)]


def latest_checkpoint(root: Path) -> Path | None:
    complete = _complete_checkpoints(root)
    return complete[-1] if complete else None


def prune_checkpoints(root: Path, keep_last: int, written: Path, best: Path | None = None) -> list[int]:
    """Keep the newest ``keep_last`` complete checkpoints, ``written`` (the one just saved,
    the final one included) and ``best`` (the best eval point's, grpo.metric_for_best_model); drop
    ``optimizer.pt`` from all but ``written`` and the one a resume would use, which is what makes
    old checkpoints large. Rank 0 alone calls this, after ``written`` is complete, so a crash
    part-way still leaves a checkpoint to resume from. Returns the steps whose checkpoints it
    deleted, oldest first."""
    complete = _complete_checkpoints(root)
    if not complete:
        return []
    kept = {*complete[-keep_last:], written, *([best] if best is not None else [])}
    removed = [path for path in complete if path not in kept]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    for path in kept - {written, complete[-1]}:
        (path / OPTIMIZER_FILE).unlink(missing_ok=True)
    return [int(_STEP_DIR.match(path.name).group(1)) for path in removed]


def load_checkpoint(
    path: Path,
    *,
    models: PolicyAndReference,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    sampler: PromptSampler,
    ranks: Ranks = SINGLE,
) -> tuple[TrainerState, Experience | None]:
    """Restore weights, optimizer, scheduler, data position and RNG in place; return the trainer
    state and this rank's share of the pending experience (or None). Every rank calls this."""
    state = TrainerState(**json.loads((path / STATE_FILE).read_text()))
    if state.has_experience and state.world_size != ranks.world_size:
        # Each rank's file holds its rows, padded to its own width; another split would need
        # them joined and padded again, which is refused rather than made nearly equal.
        raise GRPOError(
            f"{path} was taken inside a generation round (num_iterations, steps_per_generation) split over "
            f"{state.world_size} rank(s); it resumes on {state.world_size}, not {ranks.world_size} "
            "(checkpoints at the end of a batch resume on any number)",
            code="resume_unsupported",
        )
    if (path / DISTRIBUTED_DIR).is_dir():
        _load_distributed(path, models, optimizer)
    elif not (path / OPTIMIZER_FILE).is_file():
        raise GRPOError(
            f"{path} has no optimizer state: checkpoint_keep_last keeps it only in the newest "
            "checkpoint, which is the one a run resumes from",
            code="resume_unsupported",
        )
    elif is_sharded(models.policy):
        # Written whole (across hosts, or by ddp): each rank keeps its shards of it.
        load_full_state(path, models, optimizer)
    else:
        _load_weights(path, models)
        optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    reapply_schedule(scheduler)
    sampler.load_state_dict(state.sampler)
    restore_rng_state(torch.load(path / "rng.pt", weights_only=False))
    experience = None
    if state.has_experience:
        file = path / _experience_file(ranks.rank, ranks.world_size)
        # Across hosts a rank's file may have been written by a rank on other devices (another
        # layout of hosts); a launched rank's device is its own.
        where = ranks.device if _spans_hosts(ranks) else None
        experience = torch.load(file, map_location=where, weights_only=False)
    return state, experience


def _load_weights(path: Path, models: PolicyAndReference) -> None:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    if models.uses_adapters:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(models.policy, tensors)
        return
    missing, unexpected = models.policy.load_state_dict(tensors, strict=False)
    tied = set(getattr(models.policy, "_tied_weights_keys", None) or [])
    if unexpected or [k for k in missing if k not in tied]:
        raise RuntimeError(
            f"checkpoint {path} does not match the model: missing={missing} unexpected={unexpected}"
        )
