"""Out of memory, recognised whatever raised it: torch's CUDA allocator (``torch.OutOfMemoryError``
or, from older paths and other backends, a RuntimeError saying "out of memory"), or the host
(``MemoryError``). The job failed for its own size, so it gets a code of its own and a message
that says what to lower, rather than ``internal_error``.

Torch is recognised by name, not imported: rewards (which the web app imports) use this too.
"""

from __future__ import annotations

from grpo_core.errors import GRPOError

OUT_OF_MEMORY = "out_of_memory"
_ALLOCATOR_TEXT = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED")
# The spec fields that set a step's memory, largest effect first.
_LOWER = (
    "grpo.prompts_per_step or grpo.num_generations (the batch; grpo.generation_batch_size or "
    "grpo.steps_per_generation when set: the generation round), grpo.max_completion_length and "
    "grpo.max_prompt_length (sequence length); or raise grpo.gradient_accumulation_steps, set "
    "grpo.gradient_checkpointing, use model.lora or a smaller model.dtype"
)


def out_of_memory_error(exc: BaseException) -> GRPOError | None:
    """``exc`` as an ``out_of_memory`` error that says what to lower, or None when it is not one."""
    if isinstance(exc, MemoryError):
        where = "host memory"
    elif any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__) or (
        isinstance(exc, RuntimeError) and any(text in str(exc) for text in _ALLOCATOR_TEXT)
    ):
        where = "device memory"
    else:
        return None
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return GRPOError(f"out of {where} ({first_line}); lower {_LOWER}", code=OUT_OF_MEMORY)
