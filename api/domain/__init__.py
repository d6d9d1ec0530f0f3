"""The service's own words for a job, pure and shared by every role: its state machine
(:mod:`~api.domain.lifecycle`), its spec (:mod:`~api.domain.job_spec`, with tags and description in
:mod:`~api.domain.job_labels`), where stored specs differ (:mod:`~api.domain.spec_diff`), what a
pending reason or error code means (:mod:`~api.domain.explanations`), the cluster as the scheduling
policy sees it (:mod:`~api.domain.cluster_state`) and errors with no HTTP knowledge
(:mod:`~api.domain.errors`). Nothing here talks to SQL, Redis or HTTP."""
