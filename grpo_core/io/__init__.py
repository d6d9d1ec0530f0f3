"""Reading and writing outside the process: models and tokenizers (``model_loading``, from a
folder or the hub through ``hub_loading``), prompt datasets (``prompt_data``), where a ``path:``
may point (``paths``), which load failures are the source's fault (``source_errors``), the model
a user takes away (``model_export``), a full disk told apart (``disk_space``) and the tiny
random-init models the tests and examples use (``tiny_models``).

May import: ``grpo_core.spec``, the top-level foundations (``errors``, ``oom``, ``json_values``)
and this package.
"""
