"""All SQL lives in this package. Functions take a ``Session`` and return wire schemas
(``api.schemas``) or plain values; callers own the transaction (``api.db.session_scope``)."""
