"""The GRPO training core: a library of its own (``grpo train`` runs a spec with no service).

Sub-packages by role, each importing only those listed before it:

- top-level foundations: ``errors`` (the core's error codes), ``oom`` (out of memory recognised),
  ``json_values`` (records fit for JSON), ``install_hints`` (how to install an optional
  library), ``egress`` (the one guard every outbound request a tenant can aim goes through,
  torch-free); they import nothing else of the core;
- ``spec``: what a run is asked to do, torch-free;
- ``io``: models, tokenizers, datasets and exported models in and out;
- ``parallel``: ranks, devices and sharding;
- ``rewards``: reward functions, their registry and the sandbox that runs untrusted code;
- ``algorithm``: GRPO's pure pieces (rollout, advantages, log-probs, losses, the update);
- ``run``: components, the training loop, checkpoints, launching ranks;
- ``cli``: the ``grpo train`` / ``grpo tiny-model`` entry.

Never imports the service (``api``, ``worker``) or its frameworks; ``tests/test_architecture.py``
holds these rules.
"""
