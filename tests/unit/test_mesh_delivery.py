"""The mesh's delivery rules (cluster/mesh/delivery.py) with values: frame numbers received once,
frames lost on the way found and sent again, the ring of unconfirmed frames and what a new
incarnation is sent again, the backlog kept for a silent peer and what happens when it is full.
No sockets, no clock."""

from __future__ import annotations

from brokerd.cluster.mesh import Peer, delivery
from brokerd.cluster.mesh.limits import MISSING_MAX, NAMED_MAX, RESEND_AFTER_S


def peer() -> Peer:
    return Peer("x/w0", "x", None, None)


def test_a_frame_counts_once_and_a_late_one_fills_its_gap():
    p = peer()
    assert delivery.first_receipt(p, 1, 10) and delivery.first_receipt(p, 3, 30)
    assert (p.seq_in, list(p.missing), delivery.contiguous(p)) == (3, [2], 1)
    assert p.origin_mark == 10, "a mark past a missing frame is held back"
    assert not delivery.first_receipt(p, 3, 30), "the same frame twice"
    assert not delivery.first_receipt(p, 1, 10), "a frame sent again"
    assert delivery.first_receipt(p, 2, 20), "a number below the highest, missed"
    assert (p.seq_in, p.missing, delivery.contiguous(p)) == (3, {}, 3)
    assert p.origin_mark == 30, "the gap filled, the mark held back is taken"
    assert not delivery.first_receipt(p, 2, 20), "and not twice"


def test_a_confirmation_stops_before_the_first_frame_missed():
    """Partition seed 218: frames 43 and 44 lost when the connection under them broke, 45 and on
    arrived; confirming 45 let the sender drop 43 and 44 from its ring for good."""
    p = peer()
    for seq in (1, 2, 5, 6):
        delivery.first_receipt(p, seq, -1)
    assert delivery.confirmable(p, written=100) == 2
    assert delivery.missed(p) == [3, 4]
    assert delivery.first_receipt(p, 4, -1) and delivery.confirmable(p, written=100) == 2
    assert delivery.first_receipt(p, 3, -1) and delivery.confirmable(p, written=100) == 6


def test_the_missed_numbers_are_bounded_and_named_a_few_at_a_time():
    p = peer()
    delivery.first_receipt(p, MISSING_MAX + 10, -1)
    assert len(p.missing) == MISSING_MAX and next(iter(p.missing)) == 10, "the oldest given up"
    assert delivery.missed(p) == list(range(10, 10 + NAMED_MAX))


def test_the_senders_numbers_find_a_lost_tail_and_let_go_of_what_it_let_go():
    p = peer()
    delivery.first_receipt(p, 1, 10)
    delivery.sent(p, base=1, last=3)  # 2 and 3 went out before its HELLO, which came: lost
    assert (p.seq_in, list(p.missing)) == (3, [2, 3])
    delivery.first_receipt(p, 4, 40)
    assert p.origin_mark == 10
    delivery.sent(p, base=3, last=-1)  # its ring let 2 go: nothing waits for it any more
    assert list(p.missing) == [3] and delivery.contiguous(p) == 2
    delivery.first_receipt(p, 3, 30)
    assert (delivery.contiguous(p), p.origin_mark) == (4, 40)


def test_a_peer_parked_here_is_in_doubt_until_a_later_number_or_its_hello_tells_what_was_lost():
    """What a connection held when it was replaced is lost without a word: after a silence, the
    receiver learns of a lost tail only from a frame numbered beyond it or the sender's HELLO
    (partition seeds 331, 341: a hand-on in that moment took the sender's answer for all it
    had sent)."""
    p = peer()
    delivery.first_receipt(p, 1, 10)
    assert not delivery.in_doubt(p)
    delivery.parked(p, None)
    assert delivery.in_doubt(p) and not p.missing, "frame 2 may be lost: nobody knows yet"
    delivery.first_receipt(p, 3, 30)  # (kept for us while we were silent to it, sent at the heal)
    assert delivery.in_doubt(p) and list(p.missing) == [2], "now it is known: missed"
    delivery.first_receipt(p, 2, 20)  # sent again
    assert not delivery.in_doubt(p)
    delivery.parked(p, None)
    delivery.sent(p, base=1, last=-1)  # a HELLO that does not say what went out
    assert delivery.in_doubt(p)
    delivery.sent(p, base=1, last=3)  # nothing lost after all
    assert not delivery.in_doubt(p) and not p.missing


def test_a_new_receiver_starts_at_the_senders_base():
    p = peer()
    delivery.sent(p, base=500, last=-1)  # met anew: its numbers for us start at 500
    assert (p.seq_in, p.missing) == (499, {})
    assert delivery.first_receipt(p, 500, -1) and delivery.contiguous(p) == 500


def test_frames_named_as_missed_are_sent_again_from_the_ring_once_a_second():
    p = peer()
    for seq in range(1, 6):
        delivery.unconfirmed(p, seq, b"f%d" % seq, cap=1000)
    p.seq_out = 5
    assert delivery.base(p) == 1
    delivery.confirmed(p, 2)
    assert delivery.base(p) == 3
    assert delivery.to_send_again(p, [3, 4, 9], now=10.0) == [b"f3", b"f4"], "9 is not in the ring"
    assert delivery.to_send_again(p, [3, 4], now=10.5) == [], "on its way still"
    assert delivery.to_send_again(p, [4], now=10.0 + RESEND_AFTER_S) == [b"f4"]


def test_the_base_counts_frames_kept_for_a_silent_peer():
    p = peer()
    p.seq_out = 9
    delivery.parked(p, None)
    delivery.keep(p, b"k", 1, cap=100, log_end=None, log_ok=False, seq=8)
    assert delivery.base(p) == 8


def test_the_ring_keeps_unconfirmed_frames_within_its_bytes_and_a_confirmation_empties_it():
    p = peer()
    for seq in range(1, 6):
        delivery.unconfirmed(p, seq, b"x" * 10, cap=35)
    assert [s for s, _ in p.ring] == [3, 4, 5] and p.ring_bytes == 30  # oldest first out
    delivery.confirmed(p, 4)
    assert [s for s, _ in p.ring] == [5] and (p.acked, p.ring_bytes) == (4, 10)
    delivery.confirmed(p, 2)  # an older confirmation changes nothing
    assert p.acked == 4 and len(p.ring) == 1


def test_a_new_incarnation_is_sent_again_what_the_old_one_never_confirmed_and_numbered_anew():
    p = peer()
    for seq in (1, 2, 3):
        delivery.unconfirmed(p, seq, b"f%d" % seq, cap=1000)
    delivery.confirmed(p, 1)
    delivery.first_receipt(p, 1, 70)
    delivery.logged(p, 1, 99)
    delivery.new_incarnation(p)
    assert p.resend == [b"f2", b"f3"]
    assert (p.seq_in, p.missing, list(p.unwritten)) == (0, {}, [])
    assert p.origin_mark == 70, "the mark is kept across incarnations"


def test_a_frame_is_confirmable_once_the_log_wrote_its_copies():
    p = peer()
    for seq, end in ((1, 10), (2, 20), (3, 30)):
        delivery.first_receipt(p, seq, -1)
        delivery.logged(p, seq, end)
    assert delivery.confirmable(p, 9) == 0
    assert delivery.confirmable(p, 20) == 2
    assert delivery.confirmable(p, 30) == 3 and not p.unwritten


def test_a_silent_peers_backlog_fills_then_the_rest_is_left_to_the_log():
    p = peer()
    delivery.parked(p, log_end=100)
    assert delivery.keep(p, b"a" * 40, 2, cap=100, log_end=103, log_ok=True) is delivery.KEPT
    assert delivery.keep(p, b"b" * 40, 3, cap=100, log_end=107, log_ok=True) is delivery.KEPT
    assert (p.backlog_bytes, p.backlog_msgs, p.log_mark) == (80, 5, 107)
    assert delivery.keep(p, b"c" * 40, 1, cap=100, log_end=108, log_ok=True) is delivery.TO_LOG
    assert p.replay_from == 107, "read back from the log's offset at the last frame kept"
    assert delivery.keep(p, b"d", 1, cap=100, log_end=109, log_ok=True) is delivery.LEFT_TO_LOG
    assert p.backlog_msgs == 5 and p.dropped == 0
    frames, size, msgs, dropped = delivery.take_backlog(p)
    assert (len(frames), size, msgs, dropped) == (2, 80, 5, 0) and p.backlog == [] and p.backlog_bytes == 0


def test_without_a_log_what_the_full_backlog_cannot_take_is_dropped_and_counted():
    p = peer()
    delivery.parked(p, log_end=None)
    assert delivery.keep(p, b"a" * 60, 2, cap=100, log_end=None, log_ok=False) is delivery.KEPT
    assert delivery.keep(p, b"b" * 60, 3, cap=100, log_end=None, log_ok=False) is delivery.DROPPED
    assert delivery.keep(p, b"c" * 60, 4, cap=100, log_end=None, log_ok=False) is delivery.DROPPED
    assert (p.dropped, p.replay_from, p.backlog_msgs) == (7, None, 2)
    delivery.parked(p, log_end=None)  # parked again: a new count
    assert p.dropped == 0


def test_a_numbered_frame_after_a_missed_one_waits_and_all_go_in_order_once_it_came():
    """Frames of other kinds than PUBLISH are acted on in the order sent: one sent again comes
    after those that followed it (``hold``, ``released``)."""
    p = peer()
    assert delivery.first_receipt(p, 1, -1) and not delivery.hold(p, 1, "one"), "nothing missed: at once"
    delivery.first_receipt(p, 4, -1)  # 2 and 3 lost with a connection
    assert delivery.hold(p, 4, "four")
    delivery.first_receipt(p, 3, -1)  # sent again first
    assert delivery.hold(p, 3, "three"), "acted on with 2 still missed"
    assert delivery.released(p) == [] and [seq for seq, _ in p.held] == [3, 4], "not held in number order"
    delivery.first_receipt(p, 2, -1)
    assert not delivery.hold(p, 2, "two")
    assert delivery.released(p) == ["three", "four"] and p.held == []


def test_frames_held_are_bounded_by_giving_up_the_numbers_they_wait_for(monkeypatch):
    monkeypatch.setattr(delivery, "HELD_MAX", 2)
    p = peer()
    for seq in (3, 4, 5):  # 1 and 2 lost, never sent again
        delivery.first_receipt(p, seq, -1)
        assert delivery.hold(p, seq, seq)
    assert not p.missing, "held beyond the bound"
    assert delivery.released(p) == [3, 4, 5]


def test_the_frames_held_of_an_incarnation_that_ended_all_go():
    p = peer()
    delivery.first_receipt(p, 3, -1)
    delivery.hold(p, 3, "three")
    assert delivery.released(p) == [] and delivery.released(p, every=True) == ["three"]
