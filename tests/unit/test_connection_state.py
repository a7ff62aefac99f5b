"""The connection's rules (``connection.state``), each where it lives: bytes decoded as a client's,
fed to the state machine with a fake clock (plain numbers), and what it answers checked as bytes."""

from __future__ import annotations

import pytest

from brokerd.connection.codec import Decoder
from brokerd.connection.packets import Connect, Disconnect, Packet, Publish
from brokerd.connection.reasons import ProtocolError, Reason
from brokerd.connection.state import (
    AWAIT_CONNECT,
    CLOSED,
    CONNECT_TIMEOUT_S,
    CONNECTED,
    CONNECTING,
    DISCONNECTING,
    PACKET_KINDS,
    TABLE,
    Action,
    ConnectionState,
)

CONNECT_V5 = b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x1e\x00\x00\x01c"  # clean start, keepalive 30, id "c"
CONNECT_V4 = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x1e\x00\x01c"
PUBLISH = b"\x30\x06\x00\x03a/bx"  # QoS 0 to a/b, payload "x"
PUBLISH_V5 = b"\x30\x07\x00\x03a/b\x00x"  # the same with no properties
PINGREQ = b"\xc0\x00"
PINGRESP = b"\xd0\x00"
TLS_CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


def packets(*wire: bytes) -> list[Packet]:
    """What a broker's decoder makes of a client's bytes (CONNECT first sets the level)."""
    decoder = Decoder()
    return [p for data in wire for p in decoder.feed(data)]


def connected(connect: bytes = CONNECT_V5, keepalive: int = 30, now: float = 100.0) -> ConnectionState:
    state = ConnectionState(now)
    assert state.receive(packets(connect)[0]).action is Action.CONNECT
    state.accept(keepalive, now)
    return state


def test_the_table_has_a_rule_for_every_packet_kind_in_every_state() -> None:
    for state, row in TABLE.items():
        assert set(row) == set(PACKET_KINDS), state


def test_connect_first_goes_to_the_handler_and_the_connection_waits_for_its_answer() -> None:
    state = ConnectionState()
    rule = state.receive(packets(CONNECT_V4)[0])
    assert rule.action is Action.CONNECT
    assert state.state is CONNECTING


@pytest.mark.parametrize("kind", [k for k in PACKET_KINDS if k is not Connect])
def test_any_packet_but_connect_first_is_refused_as_the_spec_says(kind: type) -> None:
    state = ConnectionState()
    rule = TABLE[AWAIT_CONNECT][kind]
    assert rule.action is Action.REFUSE
    exc = rule.error()
    assert exc.rule.startswith("MQTT-3.1.0-1") and exc.reason == Reason.PROTOCOL_ERROR
    assert state.state is AWAIT_CONNECT


def test_a_publish_before_connect_is_refused_with_the_first_packet_rule() -> None:
    state = ConnectionState()
    rule = state.receive(packets(PUBLISH)[0])
    assert rule.action is Action.REFUSE and "first packet must be CONNECT" in rule.rule


@pytest.mark.parametrize("accepted", [False, True])
def test_a_second_connect_is_refused_whether_or_not_the_first_was_accepted(accepted: bool) -> None:
    state = ConnectionState()
    state.receive(packets(CONNECT_V5)[0])
    if accepted:
        state.accept(30, 0.0)
    rule = state.receive(packets(CONNECT_V5)[0])  # a decoder of its own: ours refuses it itself
    assert rule.action is Action.REFUSE and rule.error().rule.startswith("MQTT-3.1.0-2")


@pytest.mark.parametrize("accepted", [False, True])
def test_pingreq_is_answered_with_pingresp_bytes_once_connect_came(accepted: bool) -> None:
    state = ConnectionState()
    state.receive(packets(CONNECT_V4)[0])
    if accepted:
        state.accept(30, 0.0)
    ping = packets(CONNECT_V4, PINGREQ)[1]
    rule = state.receive(ping)
    assert rule.action is Action.ANSWER and rule.answer == PINGRESP
    assert state.state is (CONNECTED if accepted else CONNECTING)


def test_other_packets_of_an_open_connection_are_the_handlers() -> None:
    state = connected()
    publish = packets(CONNECT_V5, PUBLISH_V5)[1]
    assert isinstance(publish, Publish)
    assert state.row[Publish] is TABLE[CONNECTED][Publish]
    assert state.receive(publish).action is Action.HANDLE


@pytest.mark.parametrize(("wire", "graceful"), [
    (b"\xe0\x00", True),  # success: the will is dropped
    (b"\xe0\x01\x00", True),
    (b"\xe0\x01\x04", False),  # 0x04 Disconnect with Will Message: published
    (b"\xe0\x01\x80", True),  # an error the client reports: the will still goes (the handler's rule)
])
def test_disconnect_ends_the_connection_with_or_without_the_will_by_its_reason(wire: bytes, graceful: bool) -> None:
    state = connected()
    disconnect = packets(CONNECT_V5, wire)[1]
    assert isinstance(disconnect, Disconnect)
    rule = state.receive(disconnect)
    assert rule.action is Action.DISCONNECT
    assert state.state is DISCONNECTING
    assert state.graceful is graceful
    assert state.receive(packets(CONNECT_V5, PUBLISH_V5)[1]).action is Action.IGNORE


def test_an_mqtt_3_disconnect_is_graceful() -> None:
    state = connected(CONNECT_V4)
    state.receive(packets(CONNECT_V4, b"\xe0\x00")[1])
    assert state.graceful


def test_a_protocol_error_in_a_disconnect_is_still_answered_with_disconnect() -> None:
    state = connected()
    state.receive(packets(CONNECT_V5, b"\xe0\x00")[1])
    assert state.disconnect_for(Reason.PROTOCOL_ERROR, 5) == b"\xe0\x01\x82"


def test_a_closed_connection_ignores_every_packet() -> None:
    state = connected()
    state.close()
    assert state.state is CLOSED
    assert all(rule.action is Action.IGNORE for rule in TABLE[CLOSED].values())
    assert state.receive(packets(CONNECT_V5, PINGREQ)[1]).action is Action.IGNORE


def test_the_connect_timeout_closes_only_a_connection_still_waiting_for_connect() -> None:
    assert CONNECT_TIMEOUT_S == 10.0
    state = ConnectionState()
    assert state.connect_timed_out()
    state.receive(packets(CONNECT_V5)[0])
    assert not state.connect_timed_out()  # the handler bounds its own wait from here
    closed = ConnectionState()
    closed.close()
    assert not closed.connect_timed_out()


def test_a_tls_handshake_as_the_first_bytes_is_refused_only_before_connect() -> None:
    state = ConnectionState()
    assert state.first_bytes_refused(TLS_CLIENT_HELLO, buffered=0)
    assert not state.first_bytes_refused(TLS_CLIENT_HELLO, buffered=3)  # not the first bytes
    assert not state.first_bytes_refused(CONNECT_V5, buffered=0)
    state.receive(packets(CONNECT_V5)[0])
    assert not state.first_bytes_refused(TLS_CLIENT_HELLO, buffered=0)


def test_an_unsupported_protocol_version_is_answered_connack_1_before_connect_only() -> None:
    with pytest.raises(ProtocolError) as caught:
        packets(b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x1e\x00\x01c")  # level 6
    exc = caught.value
    assert exc.reason == Reason.UNSUPPORTED_PROTOCOL_VERSION
    assert ConnectionState().violation_answer(exc) == b"\x20\x02\x00\x01"
    assert connected().violation_answer(exc) is None
    assert ConnectionState().violation_answer(ProtocolError("x", Reason.MALFORMED_PACKET)) is None


@pytest.mark.parametrize(("connect", "level", "says"), [
    (CONNECT_V5, 5, b"\xe0\x01\x8d"),
    (CONNECT_V4, 4, b""),  # MQTT 3 has no DISCONNECT from the server
])
def test_a_close_with_a_reason_says_disconnect_to_an_mqtt_5_client_past_connect(
        connect: bytes, level: int, says: bytes) -> None:
    assert ConnectionState().disconnect_for(Reason.KEEP_ALIVE_TIMEOUT, level) == b""  # before CONNECT
    state = ConnectionState()
    state.receive(packets(connect)[0])
    assert state.disconnect_for(Reason.KEEP_ALIVE_TIMEOUT, level) == says  # not yet accepted: says too
    state.accept(30, 0.0)
    assert state.disconnect_for(Reason.KEEP_ALIVE_TIMEOUT, level) == says
    assert state.disconnect_for(None, level) == b""
    state.close()
    assert state.disconnect_for(Reason.KEEP_ALIVE_TIMEOUT, level) == b""


def test_accept_moves_connecting_to_connected_and_nothing_else() -> None:
    state = ConnectionState()
    state.accept(30, 0.0)
    assert state.state is AWAIT_CONNECT
    state.receive(packets(CONNECT_V5)[0])
    state.accept(30, 0.0)
    assert state.state is CONNECTED


def test_the_keepalive_is_one_and_a_half_times_the_clients_and_counts_from_the_last_read() -> None:
    state = ConnectionState(100.0)
    state.receive(packets(CONNECT_V5)[0])
    assert state.accept(10, 100.0) == 115.0
    assert state.keepalive_deadline(114.9) == 115.0  # not silent long enough yet
    state.heard_at = 110.0  # a read
    assert state.keepalive_deadline(115.0) == 125.0  # checked again at the new deadline
    assert state.keepalive_deadline(124.99) == 125.0
    assert state.keepalive_deadline(125.0) is None  # silent for 15 s: gone (MQTT-3.1.2-24)


def test_a_keepalive_of_zero_is_never_enforced() -> None:
    state = ConnectionState(0.0)
    state.receive(packets(CONNECT_V5)[0])
    assert state.accept(0, 0.0) is None


def test_a_client_that_still_takes_its_backed_up_output_is_not_silent() -> None:
    state = connected(keepalive=10, now=0.0)
    assert state.keepalive_deadline(14.0, taken=100) == 29.0  # it took bytes since: heard now
    assert state.keepalive_deadline(28.0, taken=300) == 43.0
    assert state.keepalive_deadline(43.0, taken=300) is None  # took nothing for 15 s: dead


def test_connections_with_one_keepalive_share_one_silence_object() -> None:
    """An idle connection holds no float of its own for its keepalive (24 bytes each). Compiled,
    the state is a native class whose float is a C double in the object (8 bytes, no object to
    share), so the identity holds in Python only."""
    from brokerd.connection._compiled import COMPILED

    first, second = connected(keepalive=60), connected(keepalive=60)
    assert first.keepalive == second.keepalive == 90.0
    assert COMPILED or first.keepalive is second.keepalive
    assert connected(keepalive=7).keepalive == 10.5
