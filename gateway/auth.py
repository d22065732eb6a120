"""Signed bearer tokens (HS256 JWT) and the authenticated principal."""

from __future__ import annotations

import logging
import math
import time
import unicodedata

import jwt
import msgspec

from signoff.runtime.errors import ConfigError, InvalidInput, Unauthenticated
from signoff.runtime.metrics import COUNTERS
from signoff.runtime.text import BLANK

log = logging.getLogger("signoff.gateway")

ISSUER = "signoff"


class Principal(msgspec.Struct, frozen=True):
    user: str
    tenant: str
    role: str = "user"


VERIFIED_CACHE = 10_000
# A token issued up to this long "in the future" is taken: the issuer's clock may run
# ahead of this gateway's (an operator probe: a token minted on another host was refused
# for a few seconds, "The token is not yet valid (iat)"). Its expiry is kept exactly.
CLOCK_SKEW_SECONDS = 60
PLACEHOLDER = "change-me"  # deploy/kubernetes.yml's placeholder: never a real secret
BAD_SIGNATURE_WARN_SECONDS = 60.0  # at most one warning a minute (forgeries are free)
MAX_NAME = 256  # characters of a user's or a tenant's name
# Characters that let a name pass for another where it is shown (a card's "decided by"):
# bidi marks, embeddings, overrides and isolates, invisible spaces, and the characters
# that draw nothing (runtime/text.py). Joiners (U+200C/200D) stay: scripts and emoji use them.
_DECEPTIVE = (
    frozenset(
        "\u061c\u200b\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2066\u2067\u2068\u2069\ufeff"
    )
    | BLANK
)


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot name a user or a tenant (None: it can): a non-empty string of
    at most MAX_NAME characters, none of them a control character or half a surrogate
    pair (Postgres would refuse it, on every request the token makes), nor one that lets
    it read as another name (``_DECEPTIVE``: "fuzz\u202e" was a valid user)."""
    if not isinstance(value, str) or not value.strip():
        return "is empty"
    if len(value) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp") for ch in value):
        return "holds a control character or half a surrogate pair"
    if _DECEPTIVE & set(value):
        return "holds a bidi control or an invisible character"
    return None


class Tokens:
    """Issue and verify tokens. A verified token is remembered until it expires (WebSocket
    frames are authorised one by one, mostly with the same token): the signature of a
    given token string is checked once, its expiry every time."""

    def __init__(self, secret: str, ttl_seconds: int = 12 * 3600) -> None:
        if len(secret) < 32:
            raise ConfigError("SIGNOFF_SECRET must be at least 32 characters")
        if PLACEHOLDER in secret.lower():
            # Published in the deploy files: anyone could sign tokens with it.
            raise ConfigError(
                "SIGNOFF_SECRET is still the deploy file's placeholder (CHANGE-ME...): "
                'set it to 32+ random characters, e.g. python -c "import secrets; '
                'print(secrets.token_urlsafe(32))"'
            )
        self._secret = secret
        self._ttl = ttl_seconds
        self._verified: dict[str, tuple[Principal, float]] = {}
        self._warned_at = -math.inf  # time.monotonic() of the last bad-signature warning
        self._unsaid = 0  # bad signatures since then

    def issue(self, user: str, tenant: str, role: str = "user", ttl: int | None = None) -> str:
        """A token for ``user`` of ``tenant``; InvalidInput for a name no token may carry."""
        for kind, value in (("user", user), ("tenant", tenant)):
            problem = name_problem(value)
            if problem is not None:
                raise InvalidInput(f"the {kind} {problem}")
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": user,
            "tenant": tenant,
            "role": role,
            "iat": now,
            "exp": now + (ttl if ttl is not None else self._ttl),
        }
        return jwt.encode(claims, self._secret, algorithm="HS256")

    def _bad_signature(self) -> None:
        """Counted, and said now and then: gateways (or `signoff token`) with different
        secrets refuse each other's tokens, which an operator saw only as 401s (a probe)."""
        COUNTERS.inc("signoff_tokens_bad_signature_total")
        self._unsaid += 1
        now = time.monotonic()
        if now - self._warned_at >= BAD_SIGNATURE_WARN_SECONDS:
            self._warned_at = now
            log.warning(
                "%d token(s) refused since the last warning: signature does not verify. "
                "Forged, or signed with another SIGNOFF_SECRET: every gateway and "
                "`signoff token` must share one",
                self._unsaid,
            )
            self._unsaid = 0

    def verify(self, token: str | None) -> Principal:
        return self.verify_until(token)[0]

    def verify_until(self, token: str | None) -> tuple[Principal, float]:
        """The token's principal and its expiry (Unix seconds), for sessions that must end
        when the token does (a WebSocket arms a timer with it)."""
        if not token:
            raise Unauthenticated("missing bearer token")
        known = self._verified.get(token)
        if known is not None:
            if time.time() < known[1]:
                return known
            del self._verified[token]
        try:
            claims = jwt.decode(
                token,
                self._secret,
                algorithms=["HS256"],
                issuer=ISSUER,
                options={"require": ["exp", "sub", "iss"], "verify_iat": False},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthenticated("token expired") from exc
        except jwt.InvalidSignatureError as exc:
            self._bad_signature()
            raise Unauthenticated(f"invalid token: {exc}") from exc
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"invalid token: {exc}") from exc
        iat = claims.get("iat", 0)
        if isinstance(iat, bool) or not isinstance(iat, int | float):
            raise Unauthenticated("invalid token: its issue time (iat) is not a number")
        if iat > time.time() + CLOCK_SKEW_SECONDS:
            raise Unauthenticated(
                f"invalid token: issued in the future (clocks more than {CLOCK_SKEW_SECONDS}s "
                "apart?)"
            )
        sub, tenant, role = claims.get("sub"), claims.get("tenant"), claims.get("role", "user")
        if not isinstance(sub, str) or not sub or not isinstance(tenant, str):
            raise Unauthenticated("token lacks a user or tenant")
        if name_problem(sub) or name_problem(tenant):
            raise Unauthenticated("token's user or tenant is not a valid name")
        who = Principal(user=sub, tenant=tenant, role=str(role))
        if len(self._verified) >= VERIFIED_CACHE:
            self._verified.clear()
        try:
            until = float(claims["exp"])
        except OverflowError:  # a signed exp past float range: never expires in practice
            until = math.inf
        self._verified[token] = known = (who, until)
        return known


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
