"""Alembic revisions produce exactly the schema of ``api.store.tables``, on Postgres and on SQLite.

Run against real databases: Postgres is the production store and SQLite the embedded default,
and each reflects types and constraints its own way, so a revision right on one can be wrong on
the other.
"""

from __future__ import annotations

import json
import pprint
from collections.abc import Iterator

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import CheckConstraint, Engine, create_engine, inspect, pool, text

from api.store.migrate import alembic_config, upgrade_to_head
from api.store.tables import Base


@pytest.fixture(params=["postgres", "sqlite"])
def empty_db_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(f"fresh_{request.param}_url")


@pytest.fixture
def engine(empty_db_url: str) -> Iterator[Engine]:
    # NullPool so no connection outlives the test and blocks dropping its database.
    engine = create_engine(empty_db_url, poolclass=pool.NullPool)
    yield engine
    engine.dispose()


def schema_diff(engine: Engine) -> list:
    """What autogenerate would still have to write to turn the database into the models."""
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)


def check_constraint_names(engine: Engine) -> dict[str, set[str]]:
    """compare_metadata ignores CHECK constraints, so they are compared by name separately."""
    inspector = inspect(engine)
    return {
        table: {ck["name"] for ck in inspector.get_check_constraints(table)}
        for table in Base.metadata.tables
    }


def teams(engine: Engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text("SELECT name, weight FROM teams"))]


def test_revisions_form_one_line() -> None:
    """Two heads would make ``upgrade head`` ambiguous; a branch must be merged before release."""
    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    assert len(heads) == 1, heads


def test_upgrade_to_head_matches_the_models(empty_db_url: str, engine: Engine) -> None:
    upgrade_to_head(empty_db_url)

    diff = schema_diff(engine)
    assert diff == [], "migrations and api.store.tables differ:\n" + pprint.pformat(diff)


def test_check_constraints_match_the_models(empty_db_url: str, engine: Engine) -> None:
    upgrade_to_head(empty_db_url)

    expected = {
        name: {ck.name for ck in table.constraints if isinstance(ck, CheckConstraint)}
        for name, table in Base.metadata.tables.items()
    }
    assert check_constraint_names(engine) == expected


def test_upgrade_seeds_the_default_team(empty_db_url: str, engine: Engine) -> None:
    upgrade_to_head(empty_db_url)

    assert teams(engine) == [("default", 1.0)]


def test_downgrade_to_base_then_upgrade_again(empty_db_url: str, engine: Engine) -> None:
    upgrade_to_head(empty_db_url)

    command.downgrade(alembic_config(empty_db_url), "base")
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}

    upgrade_to_head(empty_db_url)
    diff = schema_diff(engine)
    assert diff == [], "schema after a round trip differs from api.store.tables:\n" + pprint.pformat(diff)
    assert teams(engine) == [("default", 1.0)]


def test_unfinished_code_tests_jobs_get_their_required_capabilities(empty_db_url: str,
                                                                    engine: Engine) -> None:
    """Jobs queued before ``jobs.required_capabilities`` existed are filled in from their specs,
    so the scheduler does not send a waiting code_tests job to a worker without the sandbox."""
    command.upgrade(alembic_config(empty_db_url), "0007_job_steps_by_epochs")
    code = {"rewards": [{"name": "contains", "args": {"text": "x"}}, {"name": "code_tests"}]}
    plain = {"rewards": [{"name": "contains", "args": {"text": "x"}}]}
    jobs = [("queued", code), ("running", plain), ("preempted", code), ("succeeded", code)]
    with engine.begin() as conn:
        team = conn.execute(text("SELECT id FROM teams WHERE name = 'default'")).scalar_one()
        for index, (status, spec) in enumerate(jobs):
            conn.execute(text(
                "INSERT INTO jobs (team_id, name, spec, status, priority, pool, gpus, max_steps, attempt, "
                "cancel_requested, preempt_requested, created_at, last_step) VALUES (:team, :name, :spec, "
                ":status, 'normal', 'default', 1, 4, 0, false, false, CURRENT_TIMESTAMP, 0)"),
                {"team": team, "name": f"j{index}", "spec": json.dumps(spec), "status": status})
    upgrade_to_head(empty_db_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, required_capabilities FROM jobs ORDER BY id")).all()
    found = [(status, json.loads(value) if isinstance(value, str) else value) for status, value in rows]
    assert found == [("queued", ["code_sandbox"]), ("running", None), ("preempted", ["code_sandbox"]),
                     ("succeeded", None)]
