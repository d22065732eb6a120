"""The text-confirmation policy (off by default): a whole message that only says yes
approves the thread's one pending card, when its risk allows it."""

from __future__ import annotations

import string
import unicodedata

from signoff.runtime.cards import Card, Risk, Status

YES = frozenset({"sim", "confirmo", "confirmar", "pode", "ok", "yes", "confirm"})
_ORDER = {Risk.READ: 0, Risk.REVERSIBLE: 1, Risk.CRITICAL: 2}
_PUNCT = str.maketrans("", "", string.punctuation + "¡¿!…“”‘’«»")


def normalize(text: str) -> str:
    """Lower case, no accents, no punctuation, single spaces."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(bare.translate(_PUNCT).split())


def card_to_confirm(
    text: str, pending: list[Card], max_risk: str, quoted: str | None = None
) -> Card | None:
    """The card this text approves, or None (then it is an ordinary message). ``quoted``:
    the card a swipe reply quotes, the only one it can approve (others may wait too)."""
    if normalize(text) not in YES:
        return None
    open_cards = [
        c for c in pending if c.status is Status.PENDING and (quoted is None or c.id == quoted)
    ]
    if len(open_cards) != 1:
        return None
    card = open_cards[0]
    if _ORDER[Risk(card.risk)] > _ORDER[Risk(max_risk)]:
        return None
    return card
