"""The text-confirmation policy (off by default): a whole message that only says yes
approves the one card the person had seen waiting, when its risk allows it (which card
that is needs the store: ``webhook.WhatsAppChannel._confirms``)."""

from __future__ import annotations

import string
import unicodedata

from signoff.runtime.cards import Card, Decision, Risk, Status

YES = frozenset({"sim", "confirmo", "confirmar", "pode", "ok", "yes", "confirm"})
_ORDER = {Risk.READ: 0, Risk.REVERSIBLE: 1, Risk.CRITICAL: 2}
_PUNCT = str.maketrans("", "", string.punctuation + "¡¿!…“”‘’«»")


def normalize(text: str) -> str:
    """Lower case, no accents, no punctuation, single spaces."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(bare.translate(_PUNCT).split())


def is_yes(text: str) -> bool:
    """Whether the whole message only says yes ("Sim!", "ok", "confirmo")."""
    return normalize(text) in YES


def allowed(card: Card, max_risk: str) -> bool:
    """Whether text confirmation may approve a card of this risk."""
    return _ORDER[Risk(card.risk)] <= _ORDER[Risk(max_risk)]


def decided_as(status: Status, decision: Decision) -> bool:
    """Whether a card's status is what ``decision`` made of it (an approval: approved and
    what follows it; a rejection: rejected). A press of the other button, handled again,
    is still told what became of the card."""
    if decision is Decision.REJECT:
        return status is Status.REJECTED
    return status in (
        Status.APPROVED,
        Status.EXECUTING,
        Status.EXECUTED,
        Status.INVALIDATED,
        Status.FAILED,
    )
