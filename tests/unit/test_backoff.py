"""Doubling retry pauses stay bounded, however many attempts were made."""

from signoff.runtime.backoff import doubling


def test_doubling_doubles_up_to_its_bound() -> None:
    assert [doubling(0.5, n, 30.0) for n in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def test_doubling_never_overflows_a_float() -> None:
    # 0.1 * 2**1023 raised OverflowError where a retry loop meant to wait.
    assert doubling(0.1, 1_023, 1.0) == 1.0
    assert doubling(0.5, 10**9, 30.0) == 30.0
    assert doubling(0.5, -3, 30.0) == 0.5
