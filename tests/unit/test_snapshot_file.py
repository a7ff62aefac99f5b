"""``SnapshotFile``: the session snapshot (and a replica's held sessions) is written from threads
as things change and on the loop at a stop; the writes must neither meet nor land out of order."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from brokerd.router.persistence import SnapshotFile


def test_a_write_asked_for_earlier_never_lands_after_a_later_one(tmp_path):
    """A periodic write still under way in a thread when the stop writes the final state: the
    older one, done last, is skipped, so the file holds the final state."""
    f = SnapshotFile(str(tmp_path / "state.msgpack"))
    older, final = f.ticket(), f.ticket()
    assert f.write(b"final", final)
    assert not f.write(b"older", older)
    assert (tmp_path / "state.msgpack").read_bytes() == b"final"


def test_writes_at_once_from_many_threads_all_finish_and_the_newest_wins(tmp_path):
    """Each write goes through one temporary file: at once, they used to rename it from under
    each other (FileNotFoundError) or leave parts of two snapshots in it."""
    f = SnapshotFile(str(tmp_path / "state.msgpack"))
    tickets = [f.ticket() for _ in range(64)]
    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda t: f.write(str(t).encode() * 20_000, t), reversed(tickets)))
    assert done[0]  # the newest, first in: written
    assert (tmp_path / "state.msgpack").read_bytes() == str(tickets[-1]).encode() * 20_000
    assert not (tmp_path / "state.msgpack.tmp").exists()
