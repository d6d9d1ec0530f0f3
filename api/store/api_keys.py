"""API keys: how they look, how they are made and how they are stored. Pure: no I/O.

A key is ``grpo_`` followed by 43 URL-safe base64 characters (32 random bytes). Only its
SHA-256 digest is stored, plus its first :data:`PREFIX_LENGTH` characters, which listings show
so an operator can tell keys apart without ever seeing one again.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import NamedTuple

KEY_MARKER = "grpo_"
KEY_BYTES = 32
PREFIX_LENGTH = 12  # the marker and 7 random characters: enough to tell a team's keys apart
# token_urlsafe(32) is 43 characters of [A-Za-z0-9_-] (unpadded base64 of 32 bytes).
_KEY_FORMAT = re.compile(r"grpo_[A-Za-z0-9_-]{43}")


class NewKey(NamedTuple):
    plaintext: str  # shown to its owner once, never stored
    prefix: str
    key_hash: str


def generate_key() -> NewKey:
    key = KEY_MARKER + secrets.token_urlsafe(KEY_BYTES)
    return NewKey(key, key_prefix(key), hash_key(key))


def is_well_formed(token: str) -> bool:
    """Whether ``token`` could be a key at all; anything else is refused before any lookup."""
    return _KEY_FORMAT.fullmatch(token) is not None


def key_prefix(key: str) -> str:
    return key[:PREFIX_LENGTH]


def hash_key(key: str) -> str:
    """SHA-256 hex digest. A slow password hash (bcrypt, argon2) protects guessable secrets;
    a key is 256 random bits, which no offline attack can enumerate, so one fast hash is as
    safe and lets every lookup be a single indexed equality match."""
    return hashlib.sha256(key.encode()).hexdigest()
