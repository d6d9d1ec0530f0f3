"""Key naming (``api.redis_keys``): every key and queue of a deployment under its namespace,
the namespace derived from the database URL unless set, and no two deployments' names shared."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.redis_keys import RedisKeys, namespace_for
from api.settings import Settings

POSTGRES = "postgresql+psycopg://grpo:secret@db.internal:5432/grpo"


def every_name(keys: RedisKeys) -> list[str]:
    return [keys.job_stream(7), keys.worker("w1"), keys.busy("w1"), keys.queue, keys.queue_positions,
            keys.scheduler_pass, keys.scheduler_leader, keys.stat("dispatches"), keys.stream_ticket("ab12"),
            keys.reward_trials("gpu"), keys.reward_trial_reply("r1"), keys.serve_requests(7),
            keys.serve_reply("r1"), keys.serve_cancel("r1"), keys.worker_queue("w1")]


def test_two_namespaces_share_no_name_and_each_pattern_matches_only_its_own() -> None:
    from fnmatch import fnmatchcase

    first, second = RedisKeys("a1"), RedisKeys("a11")  # one a prefix of the other
    assert not set(every_name(first)) & set(every_name(second))
    assert len(set(every_name(first))) == len(every_name(first))
    for keys, other in ((first, second), (second, first)):
        assert fnmatchcase(keys.worker("w1"), keys.workers_pattern)
        assert not fnmatchcase(keys.busy("w1"), keys.workers_pattern)  # a busy mark is no heartbeat
        assert not any(fnmatchcase(name, keys.everything_pattern) for name in every_name(other))
        assert all(fnmatchcase(name, keys.everything_pattern) for name in every_name(keys)[:-1])
        assert keys.namespace in keys.worker_queue("w1")


def test_the_namespace_follows_the_database_but_not_its_password() -> None:
    assert namespace_for(POSTGRES) == namespace_for(POSTGRES)  # every process of a stack agrees
    assert namespace_for(POSTGRES) == namespace_for(POSTGRES.replace("secret", "rotated"))
    assert "secret" not in namespace_for(POSTGRES)
    others = {POSTGRES.replace("/grpo", "/other"), POSTGRES.replace("db.internal", "db2"),
              "sqlite:///./grpo.db", "sqlite:///./other.db"}
    assert len({namespace_for(url) for url in others} | {namespace_for(POSTGRES)}) == len(others) + 1
    RedisKeys(namespace_for("not a url at all"))  # any text hashes to a valid name


def test_settings_derive_the_namespace_unless_one_is_given() -> None:
    derived = Settings(database_url=POSTGRES)
    assert derived.namespace == namespace_for(POSTGRES)
    assert derived.redis_keys.job_stream(3) == f"grpo:{derived.namespace}:job:3"
    assert Settings(database_url=POSTGRES, namespace="staging").redis_keys == RedisKeys("staging")


@pytest.mark.parametrize("bad", ["", "a:b", "ns*", "a.b", "x" * 65, "sp ace"])
def test_a_namespace_that_could_leak_into_another_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(namespace=bad)
    assert refused.value.errors()[0]["loc"] == ("namespace",)
    with pytest.raises(ValueError, match="namespace"):
        RedisKeys(bad)
