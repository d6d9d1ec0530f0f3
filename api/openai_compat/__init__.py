"""OpenAI's fine-tuning API (reinforcement method) as another door to this service's own jobs:
what maps to what, pure and torch-free. A create's body becomes a JobSpec (``job_request``), a
job becomes a ``fine_tuning.job`` (``job_object``), its events and checkpoints OpenAI's
(``job_events``, ``job_checkpoints``), a ``purpose=fine-tune`` upload OpenAI's file object
(``file_object``); OpenAI's ids (``ftjob-7``) are read and written in ``ids``. The routes
(``api.http.routes.fine_tuning``) submit through the same checks as ``POST /v1/jobs``; the store
keeps what a create carries beside the spec (``api.store.openai_jobs``). docs/user_guide.md,
"Coming from OpenAI's fine-tuning", has the table of decisions."""
