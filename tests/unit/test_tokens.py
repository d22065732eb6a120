"""Bearer tokens (gateway/auth.py): an issuer's clock a little ahead is no refusal, a
deploy file's placeholder is no secret."""

from __future__ import annotations

import time

import jwt
import pytest

from signoff.gateway.auth import CLOCK_SKEW_SECONDS, Tokens
from signoff.runtime.errors import ConfigError, InvalidInput, Unauthenticated

SECRET = "s" * 16 + "0123456789abcdef"


def signed(**claims: object) -> str:
    now = int(time.time())
    base: dict[str, object] = {"iss": "signoff", "sub": "ana", "tenant": "t", "exp": now + 600}
    return jwt.encode({**base, **claims}, SECRET, algorithm="HS256")


def test_a_token_issued_by_a_clock_a_little_ahead_is_taken() -> None:
    """An operator probe: a token minted on a host whose clock ran 5 s ahead was refused
    ("The token is not yet valid (iat)") until this gateway's clock caught up."""
    tokens = Tokens(SECRET)
    now = int(time.time())
    assert tokens.verify(signed(iat=now + 5)).user == "ana"
    assert tokens.verify(signed(iat=now + CLOCK_SKEW_SECONDS - 5)).user == "ana"
    assert tokens.verify(signed()).user == "ana"  # no iat at all, as before


@pytest.mark.parametrize("iat", [10**6, "soon", True, None])
def test_a_token_from_far_in_the_future_or_with_an_odd_iat_is_refused(iat: object) -> None:
    tokens = Tokens(SECRET)
    value = int(time.time()) + 10**6 if iat == 10**6 else iat
    with pytest.raises(Unauthenticated, match="invalid token"):
        tokens.verify(signed(iat=value))


def test_an_expired_token_is_refused_without_leeway() -> None:
    tokens = Tokens(SECRET)
    with pytest.raises(Unauthenticated, match="expired"):
        tokens.verify(signed(exp=int(time.time()) - 1))


@pytest.mark.parametrize(
    "secret", ["CHANGE-ME-to-32-or-more-random-characters", "x" * 30 + "change-me", "short"]
)
def test_the_deploy_files_placeholder_is_no_secret(secret: str) -> None:
    with pytest.raises(ConfigError, match="SIGNOFF_SECRET"):
        Tokens(secret)


def test_a_token_of_another_secret_is_counted_and_said_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Gateways with different SIGNOFF_SECRETs refuse each other's tokens: an operator saw
    only 401s. Counted each time, logged at most once a minute with the count."""
    from signoff.runtime.metrics import COUNTERS

    ours, theirs = Tokens(SECRET), Tokens("t" * 40)
    token = theirs.issue("ana", "t")
    before = COUNTERS.values.get("signoff_tokens_bad_signature_total", 0)
    caplog.set_level("WARNING", logger="signoff.gateway")
    for _ in range(3):
        with pytest.raises(Unauthenticated, match="invalid token"):
            ours.verify(token)
    assert COUNTERS.values.get("signoff_tokens_bad_signature_total", 0) == before + 3
    said = [r.getMessage() for r in caplog.records if "SIGNOFF_SECRET" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("1 token(s) refused"), said
    with pytest.raises(Unauthenticated):  # an expired token is no bad signature
        ours.verify(signed(exp=int(time.time()) - 1))
    assert COUNTERS.values.get("signoff_tokens_bad_signature_total", 0) == before + 3


@pytest.mark.parametrize(
    "sub", ["fuzz\u202e", "\u2066ana\u2069", "an\u200ba", "\u3164", "a\u2028b"]
)
def test_a_name_that_could_read_as_another_is_refused(sub: str) -> None:
    # A hostile probe: "fuzz\u202e" was a valid user, shown as such in a card's "decided by".
    tokens = Tokens(SECRET)
    with pytest.raises(Unauthenticated, match="not a valid name"):
        tokens.verify(signed(sub=sub))
    with pytest.raises(InvalidInput):
        tokens.issue(sub, "t")
    assert tokens.verify(signed(sub="José 👩\u200d💻")).user == "José 👩\u200d💻"  # joiners stay
