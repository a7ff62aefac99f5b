"""The agreement client's rule for a silent service (cluster/agreement/client.py) on a
``FakeClock``: the majority the service published counts until ``SILENT_S`` have passed without
it being said again, and not a moment longer; each time it is said again the silence starts
over. The client's subscription is a stand-in that hands over what the service published; the
``FakeClock`` is its loop (its once-a-second check is a ``call_later``). No service, no sleeping."""

from __future__ import annotations

import msgpack
import zmq

from brokerd.cluster.agreement.client import SILENT_S, AgreementClient
from brokerd.cluster.config import Config
from brokerd.router.clock import FakeClock


class Published:
    """The client's SUB socket, as it reads it: what the service published, then nothing."""

    def __init__(self) -> None:
        self.waiting: list[bytes] = []

    def recv(self, flags: int = 0) -> bytes:
        if not self.waiting:
            raise zmq.Again()
        return self.waiting.pop(0)


def test_a_majority_not_said_again_for_silent_s_is_dropped_and_not_before():
    clock = FakeClock()
    client = AgreementClient(Config(workers=1, node_id="u", listen=("127.0.0.1", 1)), clock,  # type: ignore[arg-type]
                             clock=clock.now)
    told: list[bool] = []
    client.on_majority = told.append
    client._sub = published = Published()  # type: ignore[assignment]

    def majority() -> None:
        published.waiting.append(msgpack.packb(["majority", True]))
        client._check()  # the once-a-second check reads what a lost edge left

    majority()
    assert client.majority and told == [True]
    clock.advance(2.0)
    majority()  # said again: the silence starts over
    clock.advance(SILENT_S)
    client._check()
    assert client.majority and told == [True], "dropped at SILENT_S of silence, not after it"
    clock.advance(0.25)
    client._check()
    assert not client.majority and told == [True, False], "kept past SILENT_S of silence"
