"""What a team's upload (``POST /v1/files``) must be, checked on a local copy before anything is
stored: a dataset's rows (:mod:`api.uploads.datasets`), a model archive's members
(:mod:`api.uploads.model_archives`). Plain functions of a file: no store, no HTTP, no torch, and
nothing from an upload is ever executed or unpickled."""
