"""Secrets we must keep readable (webhook signing secrets: signing needs the secret itself, not a
hash) are stored encrypted under the operator's key, ``GRPO_SECRET_KEY``: Fernet (AES-128-CBC with
HMAC-SHA256, from ``cryptography``) through MultiFernet, so the key can be rotated. The setting
holds comma-separated keys: the first encrypts, every one decrypts; after a new key is put first,
:meth:`SecretBox.reseal` re-encrypts a stored token under it, and the old key may go once the
scheduler has resealed every row at its start (docs/operators.md).

Rows written before encryption hold the plain secret (``whsec_…``): :meth:`SecretBox.open`
still reads one, and :meth:`SecretBox.reseal` encrypts it, so the scheduler's first start with a
key seals them all.
"""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from api.security.webhook_signing import SECRET_PREFIX


class SecretKeyError(Exception):
    """The key is missing, malformed, or decrypts none of what is stored."""


class SecretBox:
    def __init__(self, keys: str) -> None:
        try:
            self._fernet = MultiFernet([Fernet(k.strip()) for k in keys.split(",") if k.strip()])
        except ValueError as exc:  # a bad key, or none at all
            raise SecretKeyError("GRPO_SECRET_KEY must be comma-separated Fernet keys (32 url-safe "
                                 "base64-encoded bytes each)") from exc

    @classmethod
    def from_key(cls, key: object | None) -> SecretBox | None:
        """From the settings' ``secret_key`` (a SecretStr or None); None when unset."""
        if key is None:
            return None
        return cls(key.get_secret_value())  # type: ignore[attr-defined]

    def seal(self, secret: str) -> str:
        return self._fernet.encrypt(secret.encode()).decode()

    def open(self, stored: str) -> str:
        """The secret ``stored`` holds (a token, or a plain secret written before encryption)."""
        if stored.startswith(SECRET_PREFIX):
            return stored
        try:
            return self._fernet.decrypt(stored.encode()).decode()
        except InvalidToken:
            raise SecretKeyError("no key in GRPO_SECRET_KEY decrypts a stored webhook secret: was "
                                 "the key changed? Put the old key back after the new one") from None

    def reseal(self, stored: str) -> str:
        """``stored`` encrypted under the first key (a plain one sealed, an older key's rotated)."""
        if stored.startswith(SECRET_PREFIX):
            return self.seal(stored)
        try:
            return self._fernet.rotate(stored.encode()).decode()
        except InvalidToken:
            return self.open(stored)  # raises the error that explains it
