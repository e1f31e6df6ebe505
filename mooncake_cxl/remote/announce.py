"""A remote client's reader of an announcement channel (announce.h's
AnnounceReader, with the same Python face as the binding's): the hold is
taken and dropped through the master (kAnnounceOpen/kAnnounceClose), the
channel's words are read over the Transfer Engine from the pool's serving
process. A remote client cannot produce: claiming a channel is a CAS, which
the engine does not have.

Record n is accepted as AnnounceReader accepts it: its seq word reads 2n+2
before and after the payload, and the channel still carries its name after
the copy; each of those reads is its own engine call, so they happen in that
order. Waiting polls the head (a futex does not cross hosts). Every offset
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
    def _read(self, offsets_or_at, n):
        """Bytes at pool offset `at` (n bytes), or for a list of offsets n bytes each."""
        many = isinstance(offsets_or_at, list)
        offs = offsets_or_at if many else [offsets_or_at]
        buf = ctypes.create_string_buffer(n * len(offs))
        base = ctypes.addressof(buf)
        if self._c._transfer(False, [base + n * j for j in range(len(offs))], offs, [n] * len(offs)) != OK:
            raise RemoteError(TRANSFER_FAIL, "announce channel: an engine read failed")
        raw = buf.raw
        return [raw[n * j:n * (j + 1)] for j in range(len(offs))] if many else raw

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
        head = self.head
        if self.cursor >= head:
            self.cursor = min(self.cursor, head)
            return None if self.named else ("lost", 0)
        if head - self.cursor > self._slots:
            lost = head - self._slots - self.cursor
            self.cursor = head - self._slots
            return ("lapped", lost)
        at, want = self._record_at(self.cursor), 2 * self.cursor + 2
        s1 = struct.unpack("<Q", self._read(at, 8))[0]
        payload = self._read(at + 8, 8 * WORDS)
        s2 = struct.unpack("<Q", self._read(at, 8))[0]
        if not self.named:
            return ("lost", 0)
        if s1 == want and s2 == want:
            n = self.cursor
            self.cursor += 1
            return (n, list(struct.unpack(f"<{WORDS}Q", payload)))
        self.cursor += 1  # overwritten while read, or a seq no producer wrote: lost
        return ("lapped", 1)

    def wait(self, timeout_s, spin_us=50.0):
        """True once a record past the cursor exists (or the channel is lost)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while self.head <= self.cursor:
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
