"""The verifier services a job's ``http_verifier`` rewards name (and the environment server its
``environment.server`` names), looked up where the job runs:
registered for the job's team or its pool (as the submit check demanded; one deleted since then
is missing here, and binding the reward fails the job ``invalid_spec`` naming it). Read when the
job's process builds its rewards, so a changed URL or secret takes effect at the next attempt."""

from __future__ import annotations

from api.domain.job_spec import JobSpec
from api.settings import Settings
from api.store.db import session_scope
from api.store.verifiers import endpoints_for
from grpo_core.rewards.http_verifier import verifier_names
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint


def registered_verifiers(spec: JobSpec, settings: Settings, team_id: int) -> dict[str, VerifierEndpoint]:
    names = set(verifier_names(spec.rewards).values())
    if spec.environment is not None and spec.environment.server is not None:
        names.add(spec.environment.server)  # an environment server is registered as verifiers are
    if not names:
        return {}  # most jobs: no database round trip
    with session_scope(settings.database_url) as session:
        return endpoints_for(session, names, team_id, spec.resources.pool)
