"""Doubling retry pauses, bounded (one place, so no caller overflows a float).

``first * 2 ** attempt`` grows past a float after ~1,023 doublings: a retry loop that
had run that long (a Redis refusing for ~17 minutes at one pub/sub attempt a second)
raised ``OverflowError`` where it meant to wait, and then retried with no pause.
"""

from __future__ import annotations

_MOST_DOUBLINGS = 32  # 2**32 × any first pause here is far beyond every cap


def doubling(first: float, attempt: int, most: float) -> float:
    """``first`` doubled ``attempt`` times, at most ``most`` (never an overflow)."""
    doublings: int = min(max(attempt, 0), _MOST_DOUBLINGS)
    return min(first * float(2**doublings), most)
