"""A job's artifacts: where they live (:mod:`~api.artifacts.paths`) and the bytes a team's quota
counts, its jobs' artifacts and its uploads (:mod:`~api.artifacts.usage`)."""
