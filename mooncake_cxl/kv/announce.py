"""Announcements through the pool: "blocks first..end of request R (layer l)
are stored" from a prefill process to decode processes, with no TCP between
them (the C++ channel is cpp/include/mooncake_cxl/announce.h).

    ann = Announcer(store, "prefill-0")                  # one producer per channel
    cache.save(hashes[:end], blocks[:end], start=first)
    ann.blocks_ready("req-17", first, end)               # layer=ALL_LAYERS by default
    ann.request_done("req-17", end)

    lis = Listener(store, "prefill-0")                   # may start before the producer
    for a in lis.wait(timeout=5.0):                      # spin, then futex
        ...                                              # a.request, a.kind, a.first, a.end, a.layer

An announcement is a hint; the store's objects are the truth. A listener that
fell more than a channel's worth of records behind is told how many it lost
(`lost`), and a consumer that misses one (or times out) falls back to
BlockKVCache.lookup(). A record is 7 words: request key, kind | layer << 32,
first, end, namespace tag, two user words.
"""
import hashlib
from dataclasses import dataclass

from .cache import KVCacheError

ALL_LAYERS = 0xFFFFFFFF
BLOCKS_READY, REQUEST_DONE, REQUEST_ABORTED = 1, 2, 3
_MASK = (1 << 64) - 1


def request_key(request_id):
    """The 64-bit key of a request id (str, bytes or int)."""
    if isinstance(request_id, int):
        return request_id & _MASK
    data = request_id.encode() if isinstance(request_id, str) else bytes(request_id)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Announcement:
    number: int   # the record's number in its channel
    request: int  # request_key(request id)
    kind: int     # BLOCKS_READY, REQUEST_DONE, REQUEST_ABORTED
    layer: int    # ALL_LAYERS or a layer (or layer group) index
    first: int
    end: int
    tag: int      # namespace tag (BlockKVCache.tag), 0 = any
    user: tuple


class Announcer:
    """The producer side of channel `channel` (claimed; -705 while another live
    process holds it)."""

    def __init__(self, store, channel, tag=0):
        obj = store._announce_open(channel, True)
        if isinstance(obj, int):
            raise KVCacheError(f"announce channel {channel!r} (producer)", obj)
        self._p = obj
        self.channel = channel
        self.tag = int(tag) & _MASK

    def _publish(self, request_id, kind, layer, first, end, user=(0, 0)):
        words = [request_key(request_id), (kind | (int(layer) << 32)) & _MASK, int(first) & _MASK,
                 int(end) & _MASK, self.tag, int(user[0]) & _MASK, int(user[1]) & _MASK]
        n = self._p.publish(words)
        if n < 0:
            raise KVCacheError("announce publish", n)
        return n

    def blocks_ready(self, request_id, first, end, layer=ALL_LAYERS, user=(0, 0)):
        """Blocks [first, end) of the request are stored (for `layer`)."""
        return self._publish(request_id, BLOCKS_READY, layer, first, end, user)

    def request_done(self, request_id, blocks, user=(0, 0)):
        """The request's `blocks` blocks are all stored: nothing more comes."""
        return self._publish(request_id, REQUEST_DONE, ALL_LAYERS, 0, blocks, user)

    def request_aborted(self, request_id, user=(0, 0)):
        """Nothing more comes for this request: consumers recompute what is missing."""
        return self._publish(request_id, REQUEST_ABORTED, ALL_LAYERS, 0, 0, user)

    def close(self):
        self._p.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Listener:
    """A reader of channel `channel`, with its own cursor. from_start: also
    the records the channel still holds (else only those published after)."""

    def __init__(self, store, channel, from_start=True):
        obj = store._announce_open(channel, False, from_start)
        if isinstance(obj, int):
            raise KVCacheError(f"announce channel {channel!r} (listener)", obj)
        self._r = obj
        self.channel = channel
        self.lost = 0

    @property
    def producer_pid(self):
        """The producing process, 0 while none holds the channel."""
        return self._r.producer_pid

    def poll(self):
        """Every announcement published since the last call (no waiting)."""
        out = []
        while True:
            got = self._r.next()
            if got is None:
                return out
            if got[0] == "lapped":
                self.lost += got[1]
                continue
            n, w = got
            out.append(Announcement(n, w[0], w[1] & 0xFFFFFFFF, w[1] >> 32, w[2], w[3], w[4], (w[5], w[6])))

    def wait(self, timeout, spin_us=50.0):
        """Announcements, waiting up to `timeout` seconds for the first (spin
        for spin_us, then sleep on a futex); [] on timeout."""
        out = self.poll()
        if out or not self._r.wait(timeout, spin_us):
            return out
        return self.poll()
