"""``X-Hub-Signature-256``: HMAC-SHA256 of the raw body with the app secret, checked in
constant time before anything is parsed (DESIGN.md §9)."""

from __future__ import annotations

import hashlib
import hmac

from signoff.runtime.errors import BadSignature

PREFIX = "sha256="


def sign(body: bytes, app_secret: str) -> str:
    """The header value Meta sends for ``body``."""
    return PREFIX + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


def verify(body: bytes, header: str | None, app_secret: str) -> None:
    """Raise :class:`BadSignature` unless ``header`` signs exactly these bytes."""
    if not app_secret:
        raise BadSignature("the WhatsApp channel has no app secret")
    if not header or not header.startswith(PREFIX):
        raise BadSignature("missing or malformed X-Hub-Signature-256")
    expected = sign(body, app_secret)
    if not hmac.compare_digest(expected.encode(), header.strip().lower().encode()):
        raise BadSignature("X-Hub-Signature-256 does not match the body")


def verify_token_matches(given: str | None, expected: str) -> bool:
    """The GET handshake's ``hub.verify_token``, compared in constant time."""
    if not expected or given is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())
