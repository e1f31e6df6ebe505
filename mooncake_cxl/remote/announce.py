"""A remote client's reader of an announcement channel (announce.h's
AnnounceReader, with the same Python face as the binding's): the hold is
taken and dropped through the master (kAnnounceOpen/kAnnounceClose), the
channel's words are read over the Transfer Engine from the pool's serving
process. A remote client cannot produce: claiming a channel is a CAS, which
the engine does not have.

A record is accepted when its copy is surely whole (`_fill`: the head read
before and after the copy bound it, as a seqlock's two reads would), and the
channel still carries its name after the copy; each read is its own engine
call, so they happen in that order, and a run of records costs one read. Waiting polls the head (a futex does not cross hosts). Every offset
comes from the superblock's region words, checked against the pool's size.
The hold ends at close() or when the client detaches (not when the object
is collected: that would be a master call from a finalizer)."""
import ctypes
import struct
import time

from . import wire
from .client import OK, RPC_FAIL, TRANSFER_FAIL, RemoteError

ANNOUNCE_AT = 144          # Superblock: announce_offset (u64), channels (u32), slots (u32)
HEADER_BYTES = 640         # AnnounceChannelHeader
HEAD_AT, OWNER_AT, EPOCH_AT = 64, 8, 24
RECORD_BYTES = 64          # AnnounceRecord: seq, then 7 payload words
WORDS = 7
MAX_SLOTS = 1 << 20
POLL_S = 0.0005            # paces the head polls of wait()


class RemoteAnnounceReader:
    def __init__(self, client, channel, name_hash, from_start):
        self._c, self._ch_index, self._name = client, channel, name_hash
        self._open = True
        self._ready = []  # records read ahead, in order (next() returns them first)
        geo = self._read(ANNOUNCE_AT, 16)
        off, channels, slots = struct.unpack("<QII", geo)
        stride = HEADER_BYTES + slots * RECORD_BYTES
        if (channel >= channels or slots == 0 or slots > MAX_SLOTS or slots & (slots - 1)
                or off + channels * stride > client.pool_size):
            raise RemoteError(RPC_FAIL, f"announce channel {channel}: a region past the pool")
        self._slots, self._at = slots, off + channel * stride
        head = self.head
        self.cursor = (head - slots if head > slots else 0) if from_start else head

    # ---- engine reads ----
    def _read_spans(self, spans):
        """The bytes of each (pool offset, length), in one engine batch."""
        bufs = [ctypes.create_string_buffer(n) for _, n in spans]
        if self._c._transfer(False, [ctypes.addressof(b) for b in bufs], [o for o, _ in spans],
                             [n for _, n in spans]) != OK:
            raise RemoteError(TRANSFER_FAIL, "announce channel: an engine read failed")
        return [b.raw for b in bufs]

    def _read(self, at, n):
        return self._read_spans([(at, n)])[0]

    def _u64(self, rel):
        return struct.unpack("<Q", self._read(self._at + rel, 8))[0]

    def _record_at(self, n):
        return self._at + HEADER_BYTES + (n & (self._slots - 1)) * RECORD_BYTES

    # ---- the binding's reader face ----
    @property
    def named(self):
        return self._open and self._u64(0) == self._name

    @property
    def head(self):
        return self._u64(HEAD_AT)

    @property
    def producer_pid(self):
        return self._u64(OWNER_AT)

    @property
    def producer_dead(self):
        return False  # the producer is another host's process: its pid says nothing here

    @property
    def epoch(self):
        return self._u64(EPOCH_AT)

    def next(self):
        """None, ("lapped", lost), ("lost", 0) or (number, words), as the binding's."""
        if not self._open:
            return ("lost", 0)
        if not self._ready:
            self._fill()
        return self._ready.pop(0) if self._ready else (None if self.named else ("lost", 0))

    def _fill(self):
        """Reads the records past the cursor (up to a lap): the head, then the
        records' lines (one engine read per contiguous run), then the name and
        the head again. Record n's copy is whole when it was complete before
        the copy (head before > n) and its slot not yet rewritten after it
        (head after < n + slots: record n + slots is written only once head
        passed n + slots - 1); a seq other than 2n+2 is one no producer wrote."""
        head = self.head
        if self.cursor >= head:
            self.cursor = head
            return
        slots = self._slots
        if head - self.cursor > slots:
            self._ready.append(("lapped", head - slots - self.cursor))
            self.cursor = head - slots
        first, k = self.cursor, head - self.cursor
        run = min(k, slots - (first & (slots - 1)))
        spans = [(self._record_at(first), run * RECORD_BYTES)]
        if k > run:
            spans.append((self._record_at(first + run), (k - run) * RECORD_BYTES))
        lines = b"".join(self._read_spans(spans))
        header = self._read(self._at, HEAD_AT + 8)
        name, head_after = struct.unpack_from("<Q", header, 0)[0], struct.unpack_from("<Q", header, HEAD_AT)[0]
        if name != self._name:
            self._ready = [("lost", 0)]
            return
        for j in range(k):
            n = first + j
            seq, *words = struct.unpack_from(f"<{WORDS + 1}Q", lines, j * RECORD_BYTES)
            whole = head_after < n + slots and seq == 2 * n + 2
            self._ready.append((n, words) if whole else ("lapped", 1))
        self.cursor = first + k

    def wait(self, timeout_s, spin_us=50.0):
        """True once a record past the cursor exists (or the channel is lost)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while not self._ready and self.head <= self.cursor:
            if not self.named:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def close(self):
        if not self._open:
            return
        self._open = False
        try:
            self._c.call(wire.ANNOUNCE_CLOSE, lambda ref: wire.announce_close(ref, self._ch_index, self._name),
                         idempotent=False)
        except RemoteError:
            pass  # a lost attachment dropped the hold already


def open_reader(client, name, from_start):
    """A RemoteAnnounceReader of the client's channel `name`, or a negative code."""
    st, channel, name_hash = wire.announce_open_reply(
        client.call(wire.ANNOUNCE_OPEN, lambda ref: wire.announce_open(ref, name), idempotent=False))
    if st != OK:
        return st
    try:
        return RemoteAnnounceReader(client, channel, name_hash, from_start)
    except RemoteError as e:
        client.call(wire.ANNOUNCE_CLOSE, lambda ref: wire.announce_close(ref, channel, name_hash), idempotent=False)
        return e.code
