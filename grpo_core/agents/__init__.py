"""What an agent's episode needs besides the model: tool calls read from a turn (``tool_calls``),
run in the sandbox the python graders use (``tool_runner``, by ``tool_harness`` inside it), an
environment's episodes each in a sandboxed interpreter of its own (``environment_runner``, by
``environment_harness`` inside it), and the prompt and observations laid out for the model's chat
template (``rendering``). Torch-free: the API and the worker's main process run an environment's
dry run with it. The loop that
samples the turns is :mod:`grpo_core.algorithm.episodes`.

May import: ``grpo_core.rewards`` (the sandbox), ``grpo_core.io``, ``grpo_core.spec``, the
top-level foundations and this package.
"""
