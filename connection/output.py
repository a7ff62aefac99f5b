"""One client connection's output: what the handler sends in a loop iteration goes out in one write
(``send``/``flush``), held behind the log's gate while it acknowledges what the log has not written
(``gate``), and a close with something to say lingers until the client has read it (``_end``).

A base of ``connection.protocol.MQTTConnection``, not an object of its own: ``send`` is called per
outgoing message, and a call through a second object would cost the hot path a call more.
"""

from __future__ import annotations

import asyncio

from .batching import EndOfTick
from .flow import OUTPUT
from .loop import Loop, Timer
from .traffic import ConnectionCounters, Traffic

# After a close with something still to say (a DISCONNECT, a refusing CONNACK): how long the
# client's input is read and dropped while it reads why (see ``MQTTConnection._end``).
LINGER_S = 1.0
# A connection whose output backed up is read again once it drained: looked at after this, then
# twice as long each time up to the maximum (``MQTTConnection._drain_check``).
DRAIN_POLL_S = 0.01
DRAIN_POLL_MAX_S = 0.5
# Nothing queued: one shared empty tuple, not an empty list per connection (56 bytes each, kept by
# every idle connection); ``send`` makes the list with its first chunk.
NOTHING: tuple[()] = ()


class Output:
    """The output half of ``MQTTConnection`` (which sets these fields in its ``__init__``)."""

    __slots__ = ("transport", "counters", "traffic", "write_paused", "_batcher", "_out", "_gate", "_lingering",
                 "_polling", "_timer")

    transport: asyncio.Transport | None
    counters: ConnectionCounters
    traffic: Traffic  # the worker's sums of every connection's counters
    write_paused: bool  # transport above its high-water mark: a slow consumer
    _batcher: EndOfTick
    _out: list[bytes] | tuple[()]  # queued for this loop iteration's write (NOTHING: none)
    _gate: int | None  # output held until open_gate(this or more): see gate()
    _lingering: bool  # closed with something to say: see _end()
    _polling: bool  # its output backed up: _drain_check looks until it drained
    _timer: Timer | None  # the linger after a close (``_end``)
    # The input half's, which this half pauses while the output backs up, and closes with.
    closing: bool
    _loop: Loop  # the connection's time and timers (``connection.loop``)
    _reading_paused_by: set[object] | frozenset[object]

    def close(self, reason: int | None = None) -> None:
        raise NotImplementedError

    def pause_reading(self, by: object) -> None:
        raise NotImplementedError

    def _drained(self) -> None:
        """Its output drained after ``_backed_up``: reading may resume."""
        raise NotImplementedError

    def pause_writing(self) -> None:
        """The transport holds more than ``--max-client-buffer`` unwritten: a slow consumer (QoS 0
        to it is dropped until it drains below a quarter of that)."""
        self.write_paused = True
        self._backed_up()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._drained()

    def _backed_up(self) -> None:
        """The kernel did not take all of a write: the client reads slower than it is answered.
        Nothing more is read from it (nor decoded of its last read) until its buffer has drained
        (``_drain_check``, or ``resume_writing``). Every packet kind counts: a client that sends
        PINGREQs, SUBSCRIBEs or QoS 1 PUBLISHes and never reads the answers grew the worker by ten
        times what it sent (one uvloop write request of ~400 bytes per tick's few-byte write)."""
        if OUTPUT not in self._reading_paused_by and not self.closing:
            self.pause_reading(OUTPUT)
            if not self._polling:  # one look-out per connection, however often it backs up
                self._polling = True
                self._loop.call_later(DRAIN_POLL_S, self._drain_check, DRAIN_POLL_S)

    def _drain_check(self, delay: float) -> None:
        """Read again once the transport holds nothing unwritten; look again later if it does."""
        transport = self.transport
        if OUTPUT not in self._reading_paused_by or self.closing or transport is None:
            self._polling = False
            return
        if transport.get_write_buffer_size():
            delay = min(2 * delay, DRAIN_POLL_MAX_S)
            self._loop.call_later(delay, self._drain_check, delay)
            return
        self._polling = False
        self._drained()

    def send(self, data: bytes) -> None:
        """Queue bytes for this iteration's single write."""
        out = self._out
        if not out:
            if self.closing:
                return
            self._batcher.mark(self)
            self._out = [data]
            return
        out.append(data)  # (not empty: a list)

    def flush(self) -> None:
        out = self._out
        if not out or self.transport is None or self._gate is not None:
            return
        self._out = NOTHING
        if self.closing and self.transport.is_closing():
            return
        n = 0
        for chunk in out:
            n += len(chunk)
        self.counters.bytes_out += n
        self.traffic.bytes_out += n
        if self.counters.moved != self.traffic.epoch:
            self.traffic.mark_moved(self)  # type: ignore[arg-type]  # Output is MQTTConnection's half
        transport = self.transport
        transport.write(out[0] if len(out) == 1 else b"".join(out))
        if transport.get_write_buffer_size():
            self._backed_up()

    def gate(self, until: int) -> None:
        """Hold this connection's output, in order, until ``open_gate`` reaches ``until``: the
        router queues a PUBACK/PUBREC at once (so it keeps its place among the connection's
        packets) and gates the connection until the log has written the record (a crash of the
        process must not lose what was acknowledged). A gate opened later by a higher mark only."""
        if self._gate is None or until > self._gate:
            self._gate = until

    def open_gate(self, reached: int) -> None:
        gate = self._gate
        if gate is None or gate > reached:
            return
        self._gate = None
        self.flush()  # from the log's write, in the end-of-iteration pass (or a writer report)
        if self.closing and self.transport is not None and not self.transport.is_closing():
            self._end(True)  # close() came while the gate held the output

    def refuse_output(self, reason: int) -> None:
        """What the gate held can never go out (the log could not write the records it
        acknowledges): drop it, unwritten, and close (MQTT 5: DISCONNECT ``reason``)."""
        self._gate = None
        self._out = NOTHING
        if not self.closing:
            self.close(reason)
        elif self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # close() came while the gate held the output: end it now

    def _end(self, said: bool) -> None:
        """Close the transport. When the close has something to say (``said``: a DISCONNECT, a
        refusing CONNACK, what was queued before them), half-close instead and read and drop the
        client's input until it closes too, or for ``LINGER_S`` at most.

        Why: a socket closed with input unread (a client still pipelining, or answering PUBRECs)
        makes the kernel answer with RST, and the client's next write fails before it reads why it
        was closed (Paho's MQTT 5 flow-control test saw a broken pipe instead of DISCONNECT 0x93).
        TLS and WebSocket transports cannot half-close: they only wait for the client to close."""
        transport = self.transport
        assert transport is not None
        if not said:
            transport.close()
            return
        if self._lingering:
            return
        self._lingering = True
        try:
            if transport.can_write_eof():
                transport.write_eof()  # FIN once the output is written
        except (NotImplementedError, OSError, RuntimeError):
            pass
        if self._reading_paused_by:
            transport.resume_reading()  # drain what it sends meanwhile (data_received drops it)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(LINGER_S, self._linger_over)

    def _linger_over(self) -> None:
        """The client did not close within ``LINGER_S``: close, dropping output it has not read."""
        self._timer = None
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if transport.get_write_buffer_size():
                transport.abort()  # a client that reads nothing must not keep its buffer held
            else:
                transport.close()
