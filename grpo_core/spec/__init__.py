"""What a run is asked to do: the spec a user writes and its checks, torch-free.

``run_spec`` (the spec's sections and their bounds), ``sources`` (a ``path:``, ``hf:`` or
``file:`` source string read and checked), ``grpo_config`` (the ``grpo:`` section, TRL's names),
``trl_fields`` (TRL fields taken, ignored or refused), ``field_hints`` (a near-miss field's likely
name), ``prompt_rows`` (what a prompt row must hold) and ``spec_file`` (reading a spec from
YAML/JSON). The web app validates specs with these alone, so nothing here loads torch.

May import: ``grpo_core.errors`` and the other modules of this package; pydantic and yaml.
"""
