"""Every wait of a QoS 1/2 acknowledgement before it is sent, in one object the router owns
(``router.acks``): for its record to be written into the kernel (the connection's output gated
behind it), to be fsynced (``--fsync always``), or to be on enough nodes (replication).

The log and the replication call back into it (``_written``, ``_durable``, ``_log_failed``;
``send_held`` / ``refuse_held``), and each wait ends in one of two ways: the acknowledgement is
sent, or its connection closes without it (the client sends again after reconnecting).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from brokerd.connection.codec import PUBACK
from brokerd.connection.reasons import Reason

if TYPE_CHECKING:
    from brokerd.connection.batching import EndOfTick

    from .client import Client
    from .log import CommitLog
    from .ports import ReplicationPort

log = logging.getLogger("brokerd.router.router")  # (where these lines were always logged)


class AckWaits:
    def __init__(self) -> None:
        self.log: CommitLog | None = None
        self.ack_when_durable = False
        # Replication (cluster.replication.Replication, when --replication-factor > 1): it holds
        # QoS 1/2 acknowledgements until enough nodes have the record, and gives them back
        # through ``send_held`` / ``refuse_held``.
        self.replication: ReplicationPort | None = None
        self._deferred: deque[tuple[int, Client, bytes]] = deque()  # waiting to be durable
        # (offset, client, ack) whose connection is gated until the log has written ``offset``
        self._gates: deque[tuple[int, Client, bytes]] = deque()
        self._write_soon: _WriteSoon | None = None

    def attach(self, log_: CommitLog, ack_when_durable: bool, end_of_tick: EndOfTick | None = None) -> None:
        """A QoS 1/2 acknowledgement waits for its record (``defer``): until it is fsynced with
        ``ack_when_durable`` (``--fsync always``), else until it is written into the kernel, so
        that a crash of this process (SIGKILL, OOM) loses nothing acknowledged. ``end_of_tick``
        (the worker's ``connection.batching.EndOfTick``): where the log is marked to be written
        at the end of the loop iteration in which an acknowledgement began to wait, ahead of the
        log's linger (without it: at the linger)."""
        self.log = log_
        self.ack_when_durable = ack_when_durable
        self._write_soon = _WriteSoon(log_, end_of_tick) if end_of_tick is not None and not ack_when_durable \
            else None
        if self._write_soon is not None:
            log_.use_iteration_end(self._write_soon.begun)
        if ack_when_durable:
            log_.on_durable(self._durable)
        else:
            log_.on_written(self._written)
        log_.on_error(self._log_failed)

    def defer(self, offset: int, client: Client, ack: bytes) -> None:
        """Send ``ack`` to ``client`` (a ``router.client.Client``) once the record at ``offset`` is
        safe (``attach``). Written: the ack is queued at once, in its place among the
        connection's packets, and the connection's output gated until the log has written
        ``offset`` (``Connection.gate``; a graceful close waits for it too). Durable, or on
        enough nodes with replication: held here. Either way ``client.held_acks`` counts the
        PUBACKs not sent yet (MQTT 5 Receive Maximum; a QoS 2 message held is counted among the
        client's ids awaiting PUBREL already). Replicated, the batch is marked to be written at
        the end of this iteration too: its REPLICATE frames leave at its flush, not a linger later."""
        if self.replication is not None:
            if self.replication.hold(offset, client, ack):
                if ack[0] == PUBACK:
                    client.held_acks += 1
                soon = self._write_soon
                if soon is not None and not soon.marked:
                    soon.mark()
            else:
                client.conn.send(ack)
            return
        log_ = self.log
        if not self.ack_when_durable:
            conn = client.conn
            if offset > log_.written_offset:  # type: ignore[union-attr]  # a defer comes after attach
                conn.gate(offset)
                if ack[0] == PUBACK:  # not sent yet: it counts towards the Receive Maximum
                    client.held_acks += 1
                self._gates.append((offset, client, ack))
                soon = self._write_soon
                if soon is not None and not soon.marked:
                    soon.mark()
            conn.send(ack)
            return
        if offset <= log_.durable_offset:  # type: ignore[union-attr]  # as above
            client.conn.send(ack)
            return
        if ack[0] == PUBACK:
            client.held_acks += 1
        self._deferred.append((offset, client, ack))

    def send_held(self, held: list[tuple[Client, bytes]]) -> None:
        """Held acknowledgements now safe to send (durable, or on enough nodes): (client, ack) in
        offset order."""
        for client, ack in held:
            if ack[0] == PUBACK:
                client.held_acks -= 1
            if not client.conn.closing:
                client.conn.send(ack)

    def refuse_held(self, held: list[tuple[Client, bytes]], why: str, gated: bool = False) -> None:
        """Held acknowledgements that cannot be given (the log failed, or the record is not on
        enough nodes in time): never sent; their connections close, and the clients resend after
        reconnecting. ``gated``: the acknowledgements wait behind their connections' gates
        (``defer``), which drop what they hold, unwritten, and close, whether or not a close
        already waits for them."""
        counts: dict[int, list] = {}
        for client, ack in held:
            if ack[0] == PUBACK:
                client.held_acks -= 1
            counts.setdefault(id(client), [client, 0])[1] += 1
        for client, n in counts.values():
            conn = client.conn
            if gated or not conn.closing:
                log.warning("client %s (%s): closing, %d publish(es) %s", conn.client_id, conn.peer, n, why)
                (conn.refuse_output if gated else conn.close)(Reason.IMPLEMENTATION_SPECIFIC_ERROR)

    def _log_failed(self, error: OSError | None) -> None:
        """Records waiting to be written or to become durable never will: refuse their
        acknowledgements by closing their connections, the gated ones with what the gate held
        unwritten (the clients resend after reconnecting); never acknowledge them."""
        if error is None:
            return
        acks, self._deferred = self._deferred, deque()
        self.refuse_held([(client, ack) for _, client, ack in acks], f"could not be made durable: {error}")
        gates, self._gates = self._gates, deque()
        self.refuse_held([(client, ack) for _, client, ack in gates], f"could not be written: {error}", gated=True)

    def _durable(self, durable: int) -> None:
        acks = self._deferred
        due = []
        while acks and acks[0][0] <= durable:
            _, client, ack = acks.popleft()
            due.append((client, ack))
        self.send_held(due)

    def _written(self, written: int) -> None:
        """The log is written up to ``written``: the connections gated on records up to it write
        what they hold."""
        gates = self._gates
        while gates and gates[0][0] <= written:
            _, client, ack = gates.popleft()
            if ack[0] == PUBACK:
                client.held_acks -= 1
            client.conn.open_gate(written)


class _WriteSoon:
    """The log as an end-of-iteration flush (``connection.batching.EndOfTick``): marked when an
    acknowledgement begins to wait for its record to be written, so the batch is written (and
    the connections gated on it write) in the iteration's own end-of-iteration pass, not a
    linger later. Batches of QoS 0 messages alone keep the linger: nothing waits for them.

    End-only (``mark_end``): one write of the log an iteration, never one per quiet client
    (``flush_since``). At a fixed rate most reads are a device's one PUBLISH, and written early
    each was a batch of its own: 2.4 log writes an iteration, each a flush's whole fixed cost
    (the iteration's acknowledgements then wait for its end; what the publishes delivered still
    goes early).

    It also stands for the log's linger timer (``CommitLog.use_iteration_end``): a batch begun in
    an iteration is looked at in its pass (``begun``), and only one nothing waits for gets the
    timer."""

    __slots__ = ("log", "tick", "marked", "queued")

    def __init__(self, log_: CommitLog, tick: EndOfTick) -> None:
        self.log = log_
        self.tick = tick
        self.marked = False  # an acknowledgement waits for the batch: write it in this pass
        self.queued = False  # in this iteration's pass

    def mark(self) -> None:
        self.marked = True
        self.begun()

    def begun(self) -> None:
        """A batch began (or an acknowledgement waits): see to it at this iteration's end."""
        if not self.queued:
            self.queued = True
            self.tick.mark_end(self)

    def flush(self) -> None:
        self.queued = False
        if self.marked:
            self.marked = False
            self.log.flush()
        self.log.at_iteration_end()
