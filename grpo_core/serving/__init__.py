"""Serving a job's model to chat and completion requests ("chat with a job's model"): the
request, its sampling parameters and its events in OpenAI's terms, torch-free (``requests``),
and the engine that answers many of them at once on one loaded model, continuously batched,
streaming each request's text as it is sampled (``engine``). A library: whoever drives it (a
worker process) feeds it requests and relays their events; no Redis, no service code here.

May import: ``grpo_core.algorithm`` (the rollout's decoder and sampler), ``grpo_core.io``,
``grpo_core.spec``, the top-level foundations and this package; never ``grpo_core.parallel``
(one model on one device), ``grpo_core.rewards``, ``grpo_core.agents``, ``grpo_core.run``,
``grpo_core.cli`` or the service.
"""
