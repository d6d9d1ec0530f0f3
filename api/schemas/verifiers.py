"""Wire schemas of verifier services (``/v1/admin/verifiers``), which ``http_verifier`` rewards
name. The auth secret is write-only: a read says whether one is set, never what it is."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from api.schemas.jobs import UtcDatetime
from api.vocabulary import NAME_PATTERN
from grpo_core.rewards.verifier_endpoint import MAX_URL_LENGTH, check_verifier_url

# An HTTP header name is a "token" (RFC 9110); a value is visible text without line breaks.
HEADER_NAME_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$"
HEADER_VALUE_PATTERN = r"^[^\x00-\x1f\x7f]{1,4096}$"


class VerifierSet(BaseModel):
    """A verifier's whole registration (PUT replaces it): for one team's jobs or one pool's."""

    model_config = ConfigDict(extra="forbid")

    team: str | None = Field(None, max_length=64, pattern=NAME_PATTERN,
                             description="The team whose jobs may use it (or give `pool`)")
    pool: str | None = Field(None, max_length=64, pattern=NAME_PATTERN,
                             description="The pool whose jobs may use it (or give `team`)")
    url: str = Field(max_length=MAX_URL_LENGTH, description="http(s) URL the rows are POSTed to; no "
                                                            "credentials in it (use the auth header)")
    auth_header: str | None = Field(None, pattern=HEADER_NAME_PATTERN,
                                    description="Header that carries the secret, e.g. Authorization")
    auth_secret: str | None = Field(None, pattern=HEADER_VALUE_PATTERN,
                                    description="The header's value; stored, sent, never shown again")
    timeout_seconds: float = Field(10.0, gt=0, le=600, allow_inf_nan=False, description="One request's limit")
    max_concurrency: int = Field(4, ge=1, le=256, description="Requests in flight at once per job")
    max_batch_size: int = Field(64, ge=1, le=10_000, description="Rows per request")

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_verifier_url(url)

    @model_validator(mode="after")
    def _consistent(self) -> VerifierSet:
        if (self.team is None) == (self.pool is None):
            raise ValueError("give exactly one of team and pool")
        if (self.auth_header is None) != (self.auth_secret is None):
            raise ValueError("auth_header and auth_secret go together")
        return self


class VerifierRead(BaseModel):
    name: str
    team: str | None
    pool: str | None
    url: str
    auth_header: str | None
    auth_secret_set: bool = Field(description="Whether a secret is stored (it is never returned)")
    timeout_seconds: float
    max_concurrency: int
    max_batch_size: int
    created_at: UtcDatetime
    updated_at: UtcDatetime

