"""Where a run's tensors live and how k data-parallel ranks make one step: the ranks and their
collectives (``distributed``), device and precision (``placement``) and FSDP2 sharding
(``sharding``).

May import: ``grpo_core.io`` (sharding wraps loaded models), ``grpo_core.spec``, the top-level
foundations and this package.
"""
