"""The WebSocket layer (``connection.websocket``) with bytes and a fake clock: the upgrade is due
within CONNECT_TIMEOUT_S of accept, MQTT goes both ways in binary frames once it is done, and
then the MQTT connection's own CONNECT timeout holds. The client side is wsproto's, in memory;
the layer's timer is on its MQTT connection's loop, here a ``FakeClock``."""

from __future__ import annotations

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    RejectConnection,
    Request,
    TextMessage,
)

from brokerd.connection.batching import EndOfTick
from brokerd.connection.packets import Connect, Packet
from brokerd.connection.protocol import CONNECT_TIMEOUT_S, MQTTConnection
from brokerd.connection.websocket import WebSocketConnection
from brokerd.router.clock import FakeClock

from .sockets import FakeTransport

CONNECT_V4 = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x1e\x00\x01c"  # keepalive 30 s
CONNACK = b"\x20\x02\x00\x00"


class _Handler:
    """Accepts every CONNECT with its CONNACK."""

    def __init__(self, conn: MQTTConnection) -> None:
        self.conn = conn
        self.got: list[Packet] = []

    def packet_received(self, packet: Packet) -> None:
        self.got.append(packet)
        if type(packet) is Connect:
            self.conn.accept(30, 4)
            self.conn.send(CONNACK)

    def connection_lost(self, graceful: bool) -> None:
        pass


def _accepted() -> tuple[FakeClock, WebSocketConnection, FakeTransport, WSConnection]:
    clock = FakeClock(now=1000.0)
    inner = MQTTConnection(_Handler, EndOfTick(clock), max_packet_size=1 << 20, loop=clock)
    ws = WebSocketConnection(inner, "/mqtt")
    transport = FakeTransport(("127.0.0.1", 50000))
    ws.connection_made(transport)
    return clock, ws, transport, WSConnection(ConnectionType.CLIENT)


def _upgrade(ws: WebSocketConnection, transport: FakeTransport, client: WSConnection,
             target: str = "/mqtt", subprotocols: tuple[str, ...] = ("mqtt",)) -> list[object]:
    ws.data_received(client.send(Request(host="localhost", target=target, subprotocols=list(subprotocols))))
    client.receive_data(transport.take())
    return list(client.events())


def test_a_socket_that_never_asks_for_the_upgrade_is_closed_at_the_connect_timeout() -> None:
    clock, ws, transport, client = _accepted()
    clock.advance(CONNECT_TIMEOUT_S - 0.01)
    assert not transport.closed
    clock.advance(0.02)
    assert transport.aborted and not ws.open and clock.pending == 0


def test_after_the_upgrade_mqtt_flows_in_binary_frames_and_the_handshake_timer_is_gone() -> None:
    clock, ws, transport, client = _accepted()
    clock.advance(2)
    events = _upgrade(ws, transport, client)
    assert [type(e) for e in events] == [AcceptConnection] and events[0].subprotocol == "mqtt"  # type: ignore[attr-defined]
    assert ws.open
    ws.data_received(client.send(BytesMessage(data=CONNECT_V4[:5])) + client.send(BytesMessage(data=CONNECT_V4[5:])))
    clock.run_ready()  # the end of the loop turn: the connection's output is written
    client.receive_data(transport.take())
    assert [(type(e), bytes(e.data)) for e in client.events()] == [(BytesMessage, CONNACK)]  # type: ignore[attr-defined]
    clock.advance(40)  # past the handshake's and the CONNECT's timeouts; within the keepalive's 45 s
    assert not transport.closed


def test_an_upgraded_socket_that_sends_no_connect_is_closed_by_the_mqtt_connect_timeout() -> None:
    clock, ws, transport, client = _accepted()
    clock.advance(CONNECT_TIMEOUT_S - 1)
    _upgrade(ws, transport, client)
    clock.advance(CONNECT_TIMEOUT_S - 1 - 0.01)  # its MQTT connection's first deadline, in whole seconds
    assert not transport.closed
    clock.advance(1.02)
    assert transport.aborted


def test_a_wrong_path_or_no_mqtt_subprotocol_is_refused_with_a_status() -> None:
    for target, offered, status in (("/other", ("mqtt",), 404), ("/mqtt", ("chat",), 400)):
        clock, ws, transport, client = _accepted()
        events = _upgrade(ws, transport, client, target, offered)
        assert [type(e) for e in events][0] is RejectConnection and events[0].status_code == status  # type: ignore[attr-defined]
        assert transport.closed and not ws.open


def test_a_text_frame_closes_the_websocket_with_1003() -> None:
    """MQTT-6.0.0-1: MQTT travels in binary frames only."""
    clock, ws, transport, client = _accepted()
    _upgrade(ws, transport, client)
    ws.data_received(client.send(TextMessage(data="hello")))
    client.receive_data(transport.take())
    assert [(type(e), e.code) for e in client.events()] == [(CloseConnection, 1003)]  # type: ignore[attr-defined]
    assert transport.closed
