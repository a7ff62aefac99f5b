"""The mesh's delivery rules (cluster/mesh/delivery.py) with values: frame numbers received once,
the ring of unconfirmed frames and what a new incarnation is sent again, the backlog kept for a
silent peer and what happens when it is full. No sockets, no clock."""

from __future__ import annotations

from brokerd.cluster.mesh import Peer, delivery
from brokerd.cluster.mesh.limits import SEEN_WINDOW


def peer() -> Peer:
    return Peer("x/w0", "x", None, None)


def test_a_frame_counts_once_and_a_late_one_an_old_incarnation_never_read_counts_too():
    p = peer()
    assert delivery.first_receipt(p, 1, 10) and delivery.first_receipt(p, 3, 30)
    assert (p.seq_in, p.origin_mark) == (3, 30)
    assert not delivery.first_receipt(p, 3, 30), "the same frame twice"
    assert not delivery.first_receipt(p, 1, 10), "a frame sent again"
    assert delivery.first_receipt(p, 2, 20), "a number below the highest, never seen"
    assert (p.seq_in, p.origin_mark) == (3, 30), "a late frame lowers neither the number nor the mark"


def test_a_frame_older_than_the_window_is_taken_for_seen():
    p = peer()
    for seq in range(1, SEEN_WINDOW + 11):
        assert delivery.first_receipt(p, seq, -1)
    assert len(p.seqs_seen) == SEEN_WINDOW
    assert not delivery.first_receipt(p, 5, -1)  # forgotten, but below the window: seen
    assert p.origin_mark == -1  # (-1 claims nothing)


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
    delivery.first_receipt(p, 7, 70)
    delivery.logged(p, 7, 99)
    delivery.new_incarnation(p)
    assert p.resend == [b"f2", b"f3"]
    assert (p.seq_in, p.seqs_seen, list(p.unwritten)) == (0, {}, [])
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
