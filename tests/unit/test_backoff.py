"""The one back-off rule every retry in nicop follows."""

import pytest

from nicop.backoff import doubling


def test_the_delay_doubles_with_each_failure_up_to_its_cap() -> None:
    assert [doubling(0.2, n, 30) for n in range(10)] == [
        0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30, 30]


def test_without_a_cap_a_long_run_of_failures_does_not_overflow() -> None:
    assert doubling(60, 2) == 240
    assert doubling(1, 10_000) == 2.0 ** 64


def test_a_negative_count_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="failures must be 0 or more"):
        doubling(1, -1)
