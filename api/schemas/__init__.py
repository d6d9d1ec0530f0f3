"""Wire schemas (``XRead``, request bodies): what the store returns and the HTTP API sends. SQL
rows never leave ``api.store``; these do. Pure pydantic: imports only ``api.vocabulary``,
``api.domain.lifecycle`` and ``grpo_core.spec.run_spec``.
"""
