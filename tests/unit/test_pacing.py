"""How often an agent rescans: quickly while the host changes, less and less often at rest."""

from nicop.node.pacing import QUIET_LONGEST, Pacer


def test_a_host_at_rest_is_scanned_less_often_and_a_change_brings_the_pace_back() -> None:
    pacer = Pacer(0.5)
    assert pacer.after("eight NICs") == 0.5  # the first scan is news
    waits = [pacer.after("eight NICs") for _ in range(6)]
    assert waits == [1.0, 2.0, 4.0, QUIET_LONGEST, QUIET_LONGEST, QUIET_LONGEST]
    assert pacer.after("one link down") == 0.5
    assert pacer.after("one link down") == 1.0


def test_a_fast_poll_slows_to_ten_intervals_and_a_slow_one_is_kept() -> None:
    fast = Pacer(0.05)
    assert [fast.after("same") for _ in range(6)][-1] == 0.5
    slow = Pacer(30.0)
    assert [slow.after("same") for _ in range(3)] == [30.0, 30.0, 30.0]
