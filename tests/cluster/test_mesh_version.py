"""A mesh frame of another version is refused with a clear log line, and nothing else breaks."""

from __future__ import annotations

import msgpack
import zmq
import zmq.auth

from brokerd.cluster.mesh import MESH_VERSION, PUBLISH
from tests.cluster.test_multihost import mesh_port
from tests.helpers import LEASES, Client, mesh_key, mesh_key_file


def test_frame_of_another_mesh_version_is_refused_and_logged(start_broker):
    mp = mesh_port("127.0.0.1")
    broker = start_broker("--mesh", f"127.0.0.1:{mp}", *LEASES, *mesh_key(), workers=1)
    sub = Client(broker.port, "vsub").connect()
    sub.subscribe("v/#", 0)
    ctx = zmq.Context()
    try:
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        public, secret = zmq.auth.load_certificate(mesh_key_file())  # a node of the cluster, another version
        push.curve_publickey, push.curve_secretkey, push.curve_serverkey = public, secret, public
        push.connect(f"tcp://127.0.0.1:{mp}")
        frame = [MESH_VERSION + 1, PUBLISH, "future/w0", 1, [["v/x", b"from the future", 0, False, "c", "future/w0",
                                                                0, None, 0]]]
        push.send(msgpack.packb(frame, use_bin_type=True))
        broker.wait_log(f"mesh version {MESH_VERSION + 1}, this node speaks {MESH_VERSION}")
        push.close()
    finally:
        ctx.term()
    Client(broker.port, "vpub").connect().publish("v/ok", b"ok", qos=1)
    sub.wait_topic("v/ok")
    assert [m.topic for m in sub.messages] == ["v/ok"]  # the refused frame delivered nothing
