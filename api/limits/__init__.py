"""Limits over the settings' defaults: a pool's (:mod:`~api.limits.pool_limits`), a team's
(:mod:`~api.limits.team_limits`) and the token-bucket arithmetic of rate limits
(:mod:`~api.limits.rate_limits`). Pure: the store reads the rows, these decide."""
