"""RemoteStoreMethods: StoreCore's calls (the byte API under the façade's
tensor, replica and session mixins) for a store set up on a host outside the
pod, on a RemoteClient. Same names, arguments and return shapes as the C++
binding; values are copied into and out of the caller's memory by the
Transfer Engine (get_buffer returns a private copy: there is no mapping to
view). Announcement channels live in the pool and are not reachable here."""
import bisect
import ctypes
import logging

from .. import _core
from ..errors import ErrorCode
from .announce import open_reader
from .client import INVALID, OK, RemoteClient, RemoteError
from .wire import LOCATE_PEEK

log = logging.getLogger("mooncake_cxl")

NOT_READY = int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)


def _key(key):
    if isinstance(key, str):
        try:
            key.encode()
        except UnicodeEncodeError:
            raise TypeError("key must be a str encodable as UTF-8, or bytes")
        return key
    if isinstance(key, (bytes, bytearray)):
        return bytes(key).decode(errors="surrogateescape")
    raise TypeError(f"key must be str or bytes, not '{type(key).__name__}'")


_DEFAULT = object()


def _cfg_arg(config):
    """The binding's argument rule: a ReplicateConfig, or left out."""
    if config is _DEFAULT:
        return None
    from .._core import ReplicateConfig
    if not isinstance(config, ReplicateConfig):
        raise TypeError(f"config must be a ReplicateConfig, not '{type(config).__name__}'")
    return config


def _u64(*vals):
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
            raise TypeError(f"expected an unsigned 64-bit int, not {v!r}")


def _flag(v):
    if not isinstance(v, bool):
        raise TypeError(f"force must be bool, not '{type(v).__name__}'")
    return v


class _Held:
    """Addresses of Python buffers for one call (kept alive while it runs)."""

    def __init__(self):
        self.keep = []

    def addr(self, obj):
        if isinstance(obj, bytes):
            self.keep.append(obj)
            return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value or 0, len(obj)
        try:
            m = memoryview(obj)
        except TypeError:
            raise TypeError(f"a bytes-like object is required, not '{type(obj).__name__}'")
        if not m.c_contiguous or m.readonly:
            b = m.tobytes()
            self.keep.append(b)
            return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0, len(b)
        m = m.cast("B")
        self.keep.append(m)
        return ctypes.addressof(ctypes.c_char.from_buffer(m)), m.nbytes


class RemoteBuffer(bytes):
    """get_buffer's result on a remote client without numpy: a read-only copy
    of the value with BufferHandle's ptr()/size()."""

    def ptr(self):
        return ctypes.cast(ctypes.c_char_p(self), ctypes.c_void_p).value or 0

    def size(self):
        return len(self)


def _buffer(value):
    """A read-only copy with BufferHandle's shape: int8 items ("b", as the
    reference's), ptr(), size(), len()."""
    global _RemoteArray
    if _RemoteArray is None:
        try:
            import numpy as np
        except ImportError:
            return RemoteBuffer(value)

        class RemoteArray(np.ndarray):
            # A handle, as BufferHandle: equal only to itself (lists of handles
            # are searched and removed by identity), not compared elementwise.
            __eq__ = object.__eq__
            __ne__ = object.__ne__
            __hash__ = object.__hash__

            def ptr(self):
                return int(self.ctypes.data)

            def size(self):
                return int(self.nbytes)
        _RemoteArray = RemoteArray
    import numpy as np
    return np.frombuffer(value, dtype=np.int8).view(_RemoteArray)


_RemoteArray = None


def _config(config, nkeys, op):
    """(flags, soft_pin_ttl_ms, group ids or None), or None for a config a
    local put refuses too (the binding's own checks)."""
    from .._core import ReplicateConfig
    r = _core._put_config(config if config is not None else ReplicateConfig(), nkeys, op)
    if r is None:
        return None
    flags, ttl, groups = r
    return flags, ttl, list(groups) if groups else None


class RemoteStoreMethods:
    """Mixed in before StoreCore by RemoteDistributedStore (store.py)."""

    _remote = None
    _remote_host = ""
    _registered = None  # sorted [(start, size)]: register_buffer's ranges

    # ---- lifecycle ----

    def _setup_remote(self, local_hostname, master_server_addr, tenant_id, secret, protocol,
                      connect_timeout_ms, rpc_timeout_ms, put_wait_ms):
        c = RemoteClient(local_hostname, master_server_addr, tenant_id, secret, protocol,
                         connect_timeout_ms, rpc_timeout_ms, put_wait_ms)
        rc = c.connect()
        if rc != OK:
            return rc
        self._remote, self._remote_host = c, local_hostname
        self._registered = []
        return 0

    def _ready(self, op):
        c = self._remote
        if c is None or c.closed:
            log.warning("%s() called before setup() or after close(): returns %d", op, NOT_READY)
            return None
        return c

    def close(self):
        c, self._remote = self._remote, None
        if c is not None:
            c.close()
        return 0

    def health_check(self):
        c = self._remote
        if c is None or c.closed:
            return 1
        return 0 if c.healthy() else 2

    def get_hostname(self):
        return self._remote_host

    # ---- reads ----

    def _read(self, op, keys, place):
        c = self._ready(op)
        if c is None:
            return [NOT_READY] * len(keys)
        stored, bad = [], {}
        for i, k in enumerate(keys):
            k = _key(k)
            if not k:
                log.warning("%s: empty key refused", op)
                bad[i] = INVALID
            stored.append(c.stored(k) if k else b"")
        idx = [i for i in range(len(keys)) if i not in bad]
        res = c.read([stored[i] for i in idx], lambda j, size: place(idx[j], size)) if idx else []
        out = [bad.get(i, 0) for i in range(len(keys))]
        for j, i in enumerate(idx):
            out[i] = res[j]
        return out

    def get(self, key):
        bufs = {}

        def place(i, size):
            b = bufs[i] = ctypes.create_string_buffer(size or 1)
            return [(ctypes.addressof(b), size)]
        r = self._read("get", [key], place)[0]
        return bufs[0].raw[:r] if r >= 0 and 0 in bufs else b""

    def get_batch(self, keys):
        bufs = {}

        def place(i, size):
            b = bufs[i] = ctypes.create_string_buffer(size or 1)
            return [(ctypes.addressof(b), size)]
        rs = self._read("get_batch", list(keys), place)
        return [bufs[i].raw[:r] if r >= 0 and i in bufs else b"" for i, r in enumerate(rs)]

    def get_buffer(self, key):
        r = self.get(key)
        return _buffer(r) if r else None

    def batch_get_buffer(self, keys):
        return [_buffer(v) if v else None for v in self.get_batch(keys)]

    def _locate(self, op, key, lease=0):
        c = self._ready(op)
        if c is None:
            return NOT_READY, None
        k = _key(key)
        if not k:
            return INVALID, None
        try:
            it = c.locate([c.stored(k)], lease)[0]
        except RemoteError as e:
            return e.code, None
        return it[0], it

    def is_exist(self, key):
        st, _ = self._locate("is_exist", key)
        return 1 if st == OK else 0 if st == NOT_FOUND else st

    def batch_is_exist(self, keys):
        return [self.is_exist(k) for k in keys]

    def get_size(self, key):
        st, it = self._locate("get_size", key)
        return it[5] if st == OK else st

    def _replica_info(self, key):
        st, it = self._locate("get_replica_desc", key, LOCATE_PEEK)
        if st != OK:
            return st
        return {"tier": "memory", "offset": it[4], "size": it[5], "writer": it[7],
                "remote": True, "te_session": self._remote.session}

    def _into(self, op, keys, dests):
        """Reads key i into dests[i] ([(ptr, n), ...]), each range checked first."""
        bad = {i: INVALID for i, d in enumerate(dests) if any(self._check(p, n, op) != OK for p, n in d)}
        ok = [i for i in range(len(keys)) if i not in bad]

        def place(j, size):
            d = dests[ok[j]]
            if size > sum(n for _, n in d):
                log.warning("%s: buffer of %d bytes is smaller than the value (%d)", op, sum(n for _, n in d), size)
                return INVALID
            return d
        res = self._read(op, [keys[i] for i in ok], place) if ok else []
        out = [bad.get(i, 0) for i in range(len(keys))]
        for j, i in enumerate(ok):
            out[i] = res[j]
        return out

    def get_into(self, key, buffer_ptr, size):
        _u64(buffer_ptr, size)
        return self._into("get_into", [key], [[(buffer_ptr, size)]])[0]

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID] * len(keys)
        return self._into("batch_get_into", list(keys), [[(p, n)] for p, n in zip(buffer_ptrs, sizes)])

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=False):
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [INVALID] * len(keys)

        bad = [len(p) != len(n) for p, n in zip(all_buffer_ptrs, all_sizes)]
        res = self._into("batch_get_into_multi_buffers", list(keys),
                         [[] if b else list(zip(p, n)) for b, p, n in zip(bad, all_buffer_ptrs, all_sizes)])
        return [INVALID if b else r for b, r in zip(bad, res)]

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes):
        """The binding's shapes (buffers.cc GetIntoKeyRanges); each key read
        once over the engine, its ranges copied from that one version."""
        c = self._ready("get_into_ranges")
        fail = NOT_READY if c is None else INVALID
        nb = len(buffer_ptrs)
        if not (len(all_keys) == len(all_dst_offsets) == len(all_src_offsets) == len(all_sizes) == nb):
            n = max(nb, len(all_keys))
            return [[[fail]] * (len(all_keys[b]) if b < len(all_keys) and all_keys[b] else 1) for b in range(n)]
        out, reads = [], []
        for b in range(nb):
            nk = len(all_keys[b])
            if not (len(all_dst_offsets[b]) == len(all_src_offsets[b]) == len(all_sizes[b]) == nk):
                out.append([[fail] for _ in range(nk)])
                continue
            row = []
            for k in range(nk):
                n = len(all_dst_offsets[b][k])
                row.append([fail] * n)
                if c is not None and n and len(all_src_offsets[b][k]) == n and len(all_sizes[b][k]) == n:
                    reads.append((b, k))
            out.append(row)
        for b, k in reads:
            dsts = [buffer_ptrs[b] + d for d in all_dst_offsets[b][k]]
            sizes, srcs = all_sizes[b][k], all_src_offsets[b][k]
            if any(self._check(p, n, "get_into_ranges") != OK for p, n in zip(dsts, sizes)):
                continue
            holder = {}

            def place(_, size):
                buf = holder["b"] = ctypes.create_string_buffer(size or 1)
                return [(ctypes.addressof(buf), size)]
            r = self._read("get_into_ranges", [all_keys[b][k]], place)[0]
            if r < 0:
                out[b][k] = [r] * len(sizes)
                continue
            res = []
            for dst, src, n in zip(dsts, srcs, sizes):
                if src > r or n > r - src:
                    res.append(INVALID)
                    continue
                ctypes.memmove(dst, ctypes.addressof(holder["b"]) + src, n)
                res.append(n)
            out[b][k] = res
        return out

    # ---- puts ----

    def _put(self, op, keys, parts, config, upsert):
        c = self._ready(op)
        if c is None:
            return [NOT_READY] * len(keys)
        cfg = _config(_cfg_arg(config), len(keys), op)
        if cfg is None:
            return [INVALID] * len(keys)
        flags, ttl, groups = cfg
        if groups is not None and len(groups) == 1:
            groups = groups * len(keys)
        for i, ps in enumerate(parts):
            if isinstance(ps, int) or any(self._check(a, n, op) != OK for a, n in ps):
                parts[i] = None
        out = [OK] * len(keys)
        idx, stored = [], []
        for i, k in enumerate(keys):
            k = _key(k)
            if parts[i] is None:
                out[i] = INVALID
                continue
            size = sum(n for _, n in parts[i])
            if not k or size == 0:
                log.warning("%s: %s refused", op, "an empty key" if not k else f"an empty value of '{k}'")
                out[i] = INVALID
                continue
            idx.append(i)
            stored.append(c.stored(k))
        if idx:
            gs = [groups[i] for i in idx] if groups else None
            res = c.put(stored, [parts[i] for i in idx], upsert, flags, ttl, gs)
            for j, i in enumerate(idx):
                out[i] = res[j]
        return out

    def _put_objs(self, op, keys, values, config, upsert):
        held = _Held()
        parts = [[held.addr(v) for v in vs] for vs in values]
        return self._put(op, keys, parts, config, upsert)

    def put(self, key, value, config=_DEFAULT):
        return self._put_objs("put", [key], [[value]], config, False)[0]

    def upsert(self, key, value, config=_DEFAULT):
        return self._put_objs("upsert", [key], [[value]], config, True)[0]

    def put_parts(self, key, *parts, config=_DEFAULT):
        return self._put_objs("put_parts", [key], [list(parts)], config, False)[0]

    def upsert_parts(self, key, *parts, config=_DEFAULT):
        return self._put_objs("upsert_parts", [key], [list(parts)], config, True)[0]

    def _batch(self, op, keys, values, config, upsert):
        if len(keys) != len(values):
            return INVALID
        if any(len(memoryview(v).cast("B")) == 0 for v in values):
            log.warning("%s: an empty value; nothing stored", op)
            return INVALID
        for r in self._put_objs(op, keys, [[v] for v in values], config, upsert):
            if r != 0:
                return r
        return 0

    def put_batch(self, keys, values, config=_DEFAULT):
        return self._batch("put_batch", keys, values, config, False)

    def upsert_batch(self, keys, values, config=_DEFAULT):
        return self._batch("upsert_batch", keys, values, config, True)

    def put_from(self, key, buffer_ptr, size, config=_DEFAULT):
        _u64(buffer_ptr, size)
        return self._put("put_from", [key], [[(buffer_ptr, size)]], config, False)[0]

    def upsert_from(self, key, buffer_ptr, size, config=_DEFAULT):
        _u64(buffer_ptr, size)
        return self._put("upsert_from", [key], [[(buffer_ptr, size)]], config, True)[0]

    def put_from_with_metadata(self, key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config=_DEFAULT):
        return self._put("put_from_with_metadata", [key],
                         [[(metadata_buffer_ptr, metadata_size), (buffer_ptr, size)]], config, False)[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=_DEFAULT):
        if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID] * len(keys)
        return self._put("batch_put_from", keys, [[(p, n)] for p, n in zip(buffer_ptrs, sizes)], config, False)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=_DEFAULT):
        if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID] * len(keys)
        return self._put("batch_upsert_from", keys, [[(p, n)] for p, n in zip(buffer_ptrs, sizes)], config, True)

    def _multi(self, op, keys, all_buffer_ptrs, all_sizes, config, upsert):
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [INVALID] * len(keys)
        parts = [list(zip(p, s)) if len(p) == len(s) else INVALID for p, s in zip(all_buffer_ptrs, all_sizes)]
        return self._put(op, keys, parts, config, upsert)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=_DEFAULT):
        return self._multi("batch_put_from_multi_buffers", keys, all_buffer_ptrs, all_sizes, config, False)

    def _batch_upsert_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=_DEFAULT):
        return self._multi("batch_upsert_tensor", keys, all_buffer_ptrs, all_sizes, config, True)

    # ---- registered buffers: the engine copies from any memory over TCP ----

    def register_buffer(self, buffer_ptr, size):
        """Recorded for the range checks a local client makes (the engine
        copies from any memory over TCP, so nothing is registered with it)."""
        _u64(buffer_ptr, size)
        if self._ready("register_buffer") is None:
            return NOT_READY
        reg = self._registered
        if not buffer_ptr or size <= 0:
            log.warning("register_buffer(%#x, %d): null pointer or size 0", buffer_ptr, size)
            return INVALID
        j = bisect.bisect_left(reg, (buffer_ptr, 0))
        if (j < len(reg) and reg[j][0] < buffer_ptr + size) or (j and sum(reg[j - 1]) > buffer_ptr):
            log.warning("register_buffer(%#x, %d): overlaps a registered buffer", buffer_ptr, size)
            return INVALID
        reg.insert(j, (buffer_ptr, size))
        return 0

    def unregister_buffer(self, buffer_ptr):
        if self._ready("unregister_buffer") is None:
            return NOT_READY
        for j, (p, _) in enumerate(self._registered):
            if p == buffer_ptr:
                del self._registered[j]
                return 0
        log.warning("unregister_buffer(%#x): no registered buffer starts there", buffer_ptr)
        return INVALID

    def _check(self, ptr, size, op):
        """A local client's CheckRange: a null or wrapping range, or one that
        straddles a registered buffer's edge, is INVALID_PARAMS (logged)."""
        if not ptr or ptr + size >= 1 << 64:
            log.warning("%s: buffer %#x of %d bytes is null or wraps", op, ptr, size)
            return INVALID
        reg = self._registered or []
        j = bisect.bisect_right(reg, (ptr, 1 << 64))
        if j < len(reg) and reg[j][0] < ptr + size:
            log.warning("%s: buffer [%#x, +%d) straddles a registered buffer", op, ptr, size)
            return INVALID
        if j and ptr < sum(reg[j - 1]) < ptr + size:
            log.warning("%s: buffer [%#x, +%d) runs past a registered buffer", op, ptr, size)
            return INVALID
        return OK

    # ---- removes ----

    def _remove(self, op, keys, force, batch):
        c = self._ready(op)
        if c is None:
            return [NOT_READY] * len(keys)
        stored = []
        for k in keys:
            k = _key(k)
            if not k:
                return [INVALID] * len(keys)
            stored.append(c.stored(k))
        try:
            status, results = c.remove(stored, force, batch)
        except RemoteError as e:
            return [e.code] * len(keys)
        if batch and status == OK and len(results) == len(keys):
            return results
        return [status] * len(keys)

    def remove(self, key, force=False):
        _flag(force)
        return self._remove("remove", [key], force, False)[0]

    def batch_remove(self, keys, force=False):
        _flag(force)
        return self._remove("batch_remove", list(keys), force, True) if keys else []

    def remove_by_regex(self, regex_pattern, force=False):
        _flag(force)
        if not isinstance(regex_pattern, str):
            raise TypeError("regex_pattern must be str")
        c = self._ready("remove_by_regex")
        if c is None:
            return NOT_READY
        try:
            return c.remove_matching(regex_pattern, force, False)
        except RemoteError as e:
            return e.code

    def remove_all(self, force=False):
        _flag(force)
        c = self._ready("remove_all")
        if c is None:
            return NOT_READY
        try:
            return c.remove_matching("", force, True)
        except RemoteError as e:
            return e.code

    # ---- holds (the kv layer), statistics, what needs the pool ----

    def _hold(self, keys, until_ns):
        c = self._ready("hold")
        if c is None:
            return [NOT_READY] * len(keys)
        try:
            return [it[0] for it in c.locate([c.stored(_key(k)) for k in keys], until_ns)]
        except RemoteError as e:
            return [e.code] * len(keys)

    def _release_hold(self, keys):
        # A hold lapses at its deadline; a remote client cannot lower a lease.
        return [OK] * len(keys) if self._ready("release_hold") is not None else [NOT_READY] * len(keys)

    def _offload_read_count(self):
        return 0

    def _announce_open(self, name, producer, from_start=False):
        """A reader over the engine (remote/announce.py); producing needs the pool."""
        c = self._ready("announce_open")
        if c is None:
            return NOT_READY
        if producer:
            log.warning("announce_open(%r): a remote client cannot produce (claiming a channel is a CAS "
                        "the Transfer Engine does not have): %d", name, NOT_SUPPORTED)
            return NOT_SUPPORTED
        try:
            return open_reader(c, name, from_start)
        except RemoteError as e:
            return e.code
