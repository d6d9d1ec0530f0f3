"""What running a job's environment needs (:class:`EnvironmentSetup`): its source and the limits of
one episode, or its registered server with the egress policy its sessions go through; its turns
and per-call time. Built from the spec where the job runs (the service's registrations and egress
policy at hand); read by :mod:`grpo_core.agents.environment_runner` and
:mod:`grpo_core.agents.environment_server`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from grpo_core.egress import EgressPolicy
from grpo_core.errors import SpecError
from grpo_core.rewards.sandbox import Limits
from grpo_core.rewards.verifier_endpoint import VerifierEndpoint
from grpo_core.spec.environment_spec import EnvironmentSpec

OBSERVATION_BYTES = 64 * 2**10  # the most of one answer line read from an environment


@dataclass(frozen=True)
class EnvironmentSetup:
    """What running a job's environment needs: its source and the limits of one episode
    (:meth:`sandbox_limits` makes a batch's sandbox of them), or its registered server with the
    egress policy its sessions go through and how actions and observations map; its turns and
    per-call time."""

    source: str | None
    max_turns: int
    timeout_seconds: float
    limits: Limits
    server: VerifierEndpoint | None = None
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    action_field: str = "message"
    observation_field: str | None = None
    reset_columns: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        spec: EnvironmentSpec,
        servers: Mapping[str, VerifierEndpoint] | None = None,
        egress: EgressPolicy | None = None,
    ) -> EnvironmentSetup:
        """The setup of ``spec``; a ``server`` it names must be in ``servers`` (the registrations
        the job may use: a SpecError naming ``environment.server`` otherwise)."""
        # CPU for the whole episode: every call may use its time; the wall clock is per call.
        cpu = math.ceil(spec.timeout_seconds * (spec.max_turns + 1)) + 1
        limits = Limits(
            wall_seconds=spec.timeout_seconds,
            cpu_seconds=cpu,
            memory_bytes=spec.memory_mb * 2**20,
            processes=spec.max_processes,
            output_bytes=OBSERVATION_BYTES + 512,
        )
        server = None
        if spec.server is not None:
            server = (servers or {}).get(spec.server)
            if server is None:
                raise SpecError(
                    "environment.server",
                    f"no environment server '{spec.server}' is registered for this job's team or pool",
                )
        return cls(
            spec.source,
            spec.max_turns,
            spec.timeout_seconds,
            limits,
            server,
            egress or EgressPolicy(),
            spec.action_field,
            spec.observation_field,
            tuple(spec.reset_columns),
        )

    def sandbox_limits(self, episodes: int) -> Limits:
        """A sandbox of ``episodes``: each episode's processes, the harness and the launcher; all
        of their memory (each process's address space) and the shared /tmp."""
        processes = episodes * self.limits.processes + 2
        return replace(
            self.limits,
            processes=processes,
            run_memory_bytes=(processes * self.limits.memory_bytes + self.limits.tmp_bytes),
        )
