"""GRPO itself, as pure pieces over tensors: sample completions (``rollout`` with ``decoders``,
``sampling`` and keyed ``randomness``) or multi-turn episodes with tools (``episodes``), turn them
into text (``completion_text``), score and group them into one round of experience
(``experience``, ``advantages``), compute log-probs and the clipped loss (``logprobs``,
``losses``), take an optimizer step (``update``, ``optim``) and name what happened (``metrics``).
No file I/O and no process handling: that is ``grpo_core.run``.

May import: ``grpo_core.agents``, ``grpo_core.rewards``, ``grpo_core.parallel``, ``grpo_core.io``,
``grpo_core.spec``, the top-level foundations and this package.
"""
