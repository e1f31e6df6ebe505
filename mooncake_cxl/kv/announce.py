"""Announcements through the pool: "blocks first..end of request R (layer l)
are stored" from a prefill process to decode processes, with no TCP between
them (the C++ channel is cpp/control/include/mooncake_cxl/control/announce.h).

    ann = Announcer(store, "prefill-0")                  # one producer per channel
    cache.save(hashes[:end], blocks[:end], start=first)
    ann.blocks_ready("req-17", first, end)               # layer=ALL_LAYERS by default
    ann.request_done("req-17", end)

    lis = Listener(store, "prefill-0")                   # may start before the producer
    for a in lis.wait(timeout=5.0):                      # spin, then futex
        ...                                              # a.request, a.kind, a.first, a.end, a.layer

To follow one request (decode of a PD pair):

    for a in lis.follow("req-17", timeout=60, idle_timeout=5):   # until REQUEST_DONE
        cache.load(cache.stored_prefix(hashes, a.end), blocks, start=loaded, release=True)
    # or all of it: receive(cache, lis, "req-17", hashes, blocks, timeout=60, idle_timeout=5)

follow() raises RequestIncomplete (naming the request, the blocks that
arrived and why) as soon as the producer is gone (its pid exited, it closed
or lost the channel) or aborted the request, or nothing came for
idle_timeout seconds, or timeout passed: the consumer recomputes the rest.

Channel names are the tenant's, as keys are: two tenants' "prefill-0" are
two channels. Each Announcer and Listener holds its channel open until
close() (or its store's close, or its process's end); a channel nobody
holds and whose producer is gone is freed for other names. A client holds
at most the master's --announce_channels_per_client channels at once; past
it, or when every channel is held, opening raises KVCacheError with code
NO_AVAILABLE_HANDLE (-200).

An announcement is a hint; the store's objects are the truth. A listener that
fell more than a channel's worth of records behind is told how many it lost
(`lost`), and a consumer that misses one (or times out) falls back to
BlockKVCache.lookup(). A record is 7 words: request key, kind | layer << 32,
first, end, namespace tag, two user words.
"""
import hashlib
import time
from dataclasses import dataclass

from ..errors import ErrorCode
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


class RequestIncomplete(KVCacheError):
    """A followed request ended before REQUEST_DONE: .request (the id given),
    .blocks (blocks [0, blocks) arrived, every layer), .loaded (what receive()
    copied), .reason; .code UNAVAILABLE_IN_CURRENT_STATUS (producer gone or
    aborted) or RPC_TIMEOUT (silent, or past the deadline)."""

    def __init__(self, request_id, blocks, reason, code, loaded=None):
        RuntimeError.__init__(self, f"request {request_id!r}: {reason}; blocks [0, {blocks}) arrived"
                              + ("" if loaded is None else f", {loaded} loaded"))
        self.code = code
        self.request, self.blocks, self.reason, self.loaded = request_id, blocks, reason, loaded


def _open_error(channel, side, code):
    why = {int(ErrorCode.NO_AVAILABLE_HANDLE): ": no announcement channel free (this client holds "
           "--announce_channels_per_client channels, or every channel of the pool is held)",
           int(ErrorCode.OBJECT_ALREADY_EXISTS): ": another live process produces on it"}.get(code, "")
    return KVCacheError(f"announce channel {channel!r} ({side}){why}", code)


class Announcer:
    """The producer side of channel `channel` (claimed; -705 while another live
    process holds it)."""

    def __init__(self, store, channel, tag=0):
        obj = store._announce_open(channel, True)
        if isinstance(obj, int):
            raise _open_error(channel, "producer", obj)
        self._p = obj
        self._store = store
        self.channel = channel
        self.tag = int(tag) & _MASK

    def _publish(self, request_id, kind, layer, first, end, user=(0, 0)):
        words = [request_key(request_id), (kind | (int(layer) << 32)) & _MASK, int(first) & _MASK,
                 int(end) & _MASK, self.tag, int(user[0]) & _MASK, int(user[1]) & _MASK]
        n = self._p.publish(words)
        if n == int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS):
            # The channel is no longer ours (its hold ended with a lost slot):
            # claim it again, once; its listeners see the new epoch.
            self._p.close()  # first: a claim is by pid, and closing after would drop the new one
            obj = self._store._announce_open(self.channel, True)
            if not isinstance(obj, int):
                self._p = obj
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
            raise _open_error(channel, "listener", obj)
        self._r = obj
        self.channel = channel
        self.lost = 0
        self.channel_lost = False  # the channel was freed (its holds ended): nothing more comes
        self._stash = {}  # request key -> records follow() took for another request

    def close(self):
        """Drops this listener's hold of the channel."""
        self._r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

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
            if got[0] == "lost":
                self.channel_lost = True
                return out
            n, w = got
            out.append(Announcement(n, w[0], w[1] & 0xFFFFFFFF, w[1] >> 32, w[2], w[3], w[4], (w[5], w[6])))

    def wait(self, timeout, spin_us=50.0):
        """Announcements, waiting up to `timeout` seconds for the first (spin
        for spin_us, then sleep on a futex); [] on timeout."""
        out = self.poll()
        if out or not self._r.wait(timeout, spin_us):
            return out
        return self.poll()

    @property
    def producer_dead(self):
        """The channel's producer was a process of this machine that exited."""
        return self._r.producer_dead

    _STASH_LIMIT = 65536

    def _take(self, key):
        """New records of request `key`; other requests' are kept for their follow()."""
        stash = self._stash
        mine = stash.pop(key, [])
        for a in self.poll():
            if a.request == key:
                mine.append(a)
            else:
                stash.setdefault(a.request, []).append(a)
        if sum(len(v) for v in stash.values()) > self._STASH_LIMIT:  # nobody follows them
            self.lost += sum(len(v) for v in stash.values())
            stash.clear()
        return mine

    def follow(self, request_id, timeout=60.0, idle_timeout=None, spin_us=50.0, check_s=0.05):
        """Yields the BLOCKS_READY announcements of one request as they come,
        then its REQUEST_DONE one (a.end: every block is stored) and returns.
        Raises RequestIncomplete as soon as the
        producer is gone (a dead pid, a closed or taken-over channel), the
        request is aborted, nothing came for `idle_timeout` s (also: no
        producer yet), or `timeout` s passed. Use either this or poll()/wait()
        on one Listener: follow() keeps other requests' records for their own
        follow(), poll() does not see them."""
        key = request_key(request_id)
        t0 = time.monotonic()
        last = t0
        owner = None  # the producer's pid once one is seen
        arrived = {}  # layer -> highest end announced
        got_done = None

        def blocks():
            if got_done is not None:
                return got_done
            if ALL_LAYERS in arrived:
                return arrived[ALL_LAYERS]
            return min(arrived.values()) if arrived else 0

        def incomplete(reason, code):
            return RequestIncomplete(request_id, blocks(), reason, code)

        while True:
            recs = self._take(key)
            for a in recs:
                if a.kind == BLOCKS_READY:
                    arrived[a.layer] = max(arrived.get(a.layer, 0), a.end)
                    yield a
                elif a.kind == REQUEST_DONE:
                    got_done = a.end
                    yield a
                    return
                elif a.kind == REQUEST_ABORTED:
                    raise incomplete("the producer aborted it", ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)
            now = time.monotonic()
            if recs:
                last = now
            pid = self._r.producer_pid
            gone = None
            if self.channel_lost:
                gone = "its channel was freed (this client's hold ended)"
            elif self._r.producer_dead:
                gone = f"its producer (pid {pid}) exited"
            elif owner is None and pid != 0:
                owner = pid
            elif owner is not None and pid == 0:
                gone = f"its producer (pid {owner}) closed the channel"
            elif owner is not None and pid != owner:
                gone = f"its producer (pid {owner}) was replaced by pid {pid}"
            if gone is not None:
                if self._take_again(key):  # records published just before it went
                    continue
                raise incomplete(gone, ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)
            if idle_timeout is not None and now - last > idle_timeout:
                raise incomplete(f"no announcement for {idle_timeout:g} s"
                                 + ("" if owner or pid else " (no producer on the channel)"), ErrorCode.RPC_TIMEOUT)
            if now - t0 > timeout:
                raise incomplete(f"not done after {timeout:g} s", ErrorCode.RPC_TIMEOUT)
            left = min(timeout - (now - t0), check_s,
                       (idle_timeout - (now - last)) if idle_timeout is not None else check_s)
            self._r.wait(max(left, 0.0), spin_us)

    def _take_again(self, key):
        """Moves records published since the last look into the stash; true if
        the request has some (follow then handles them before deciding)."""
        mine = self._take(key)
        if mine:
            self._stash[key] = mine
        return bool(mine)


def receive(cache, listener, request_id, hashes, engine_blocks, timeout=60.0, idle_timeout=None,
            release=True, spin_us=50.0):
    """The decode side of a hand-off: follows `request_id` on `listener` and
    loads each announced range into the engine blocks as it arrives
    (ALL_LAYERS: every group; a layer-group index: that group), releasing the
    producer's hold. Returns the number of blocks loaded (every group) at
    REQUEST_DONE; raises RequestIncomplete (with .loaded) when the producer
    is gone or silent (see Listener.follow), KVCacheError when an announced
    object is missing."""
    hashes = list(hashes)
    G = cache.layer_groups
    done = [0] * G  # per group: blocks loaded
    try:
        for a in listener.follow(request_id, timeout=timeout, idle_timeout=idle_timeout, spin_us=spin_us):
            end = min(int(a.end), len(hashes))
            whole = a.layer == ALL_LAYERS or a.kind == REQUEST_DONE
            groups = range(G) if whole else [int(a.layer)] if int(a.layer) < G else []
            for g in groups:
                if end > done[g]:
                    cache.load(cache.stored_prefix(hashes, end), engine_blocks, start=done[g], release=release,
                               groups=[g])
                    done[g] = end
    except RequestIncomplete as e:
        e.loaded = min(done)
        e.args = (f"{e.args[0]}, {e.loaded} loaded",)
        raise
    return min(done)
