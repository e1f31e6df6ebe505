"""Mooncake 0.3.13's batch put/get sessions and the *_multi_buffer_ranges calls.

Put session (layer-by-layer writes of one object):
    batch_put_session_start(keys, sizes[, config]) -> [0 | -705 exists | -600]
    batch_put_from_multi_buffer_ranges(keys, ptrs, sizes, dst_offsets) -> [bytes | -600]
    batch_put_session_end(keys) -> [0 | error]     the objects become readable
    batch_put_session_revoke(keys) -> [0 | -600]
Get session:
    batch_get_session_start(keys) -> [0 | -704]
    batch_get_into_multi_buffer_ranges(keys, ptrs, sizes, src_offsets) -> [bytes | -600]
    batch_get_session_end(keys) -> 0
A key used by a ranges call outside its session gets -600, as in Mooncake.

Works differently on purpose: the reference reserves the object's space at
start and writes the ranges straight into it. Here the ranges are gathered in
a private staging buffer of this client and stored by session_end in one
batch put (one master round trip for all keys; one extra copy per byte). So
the space is claimed at end, not start (a full pool fails end, not start),
and another client's put of the same key between start and end wins (end
then returns -705 for that key, OBJECT_ALREADY_EXISTS, as the reference's
start would have).
A get session only checks that each key exists: reads are one-sided and
always see the current object, so there is nothing to cache.
"""
import ctypes
import logging
import threading

from .errors import ErrorCode

log = logging.getLogger("mooncake_cxl")
INVALID = int(ErrorCode.INVALID_PARAMS)


def _shapes_ok(op, keys, ptrs, sizes, offsets):
    if len(ptrs) == len(keys) and len(sizes) == len(keys) and len(offsets) == len(keys) and \
            all(len(p) == len(s) == len(o) for p, s, o in zip(ptrs, sizes, offsets)):
        return True
    log.error("%s: keys, buffer lists, size lists and offset lists must match, one entry per buffer", op)
    return False


class SessionMethods:
    """Mixed into MooncakeDistributedStore."""

    def _init_sessions(self):
        self._session_lock = threading.Lock()
        self._put_sessions = {}   # key -> (staging bytearray, ReplicateConfig)
        self._get_sessions = set()

    def batch_put_session_start(self, keys, sizes, config=None):
        """Open a put session per key for an object of sizes[i] bytes."""
        from ._core import ReplicateConfig
        keys, sizes = list(keys), list(sizes)
        if len(keys) != len(sizes):
            log.error("batch_put_session_start: %d keys but %d sizes", len(keys), len(sizes))
            return [INVALID] * len(keys)
        config = ReplicateConfig() if config is None else config
        out = []
        with self._session_lock:
            for key, size in zip(keys, sizes):
                info = self._replica_info(key)
                if isinstance(info, dict):
                    out.append(int(ErrorCode.OBJECT_ALREADY_EXISTS))
                elif info != int(ErrorCode.OBJECT_NOT_FOUND):
                    out.append(info)
                elif key in self._put_sessions or not key or size <= 0:
                    log.error("batch_put_session_start(%r): %s", key,
                              "session already open" if key in self._put_sessions else
                              f"invalid key or size {size}")
                    out.append(INVALID)
                else:
                    self._put_sessions[key] = (bytearray(size), config)
                    out.append(0)
        return out

    def batch_put_from_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes, all_dst_offsets):
        """Copy each buffer j of key i to object[dst_offsets[i][j]:+sizes[i][j]]; bytes written per key."""
        op = "batch_put_from_multi_buffer_ranges"
        keys = list(keys)
        if not _shapes_ok(op, keys, all_buffer_ptrs, all_sizes, all_dst_offsets):
            return [INVALID] * len(keys)
        out = []
        with self._session_lock:
            for key, ptrs, sizes, offs in zip(keys, all_buffer_ptrs, all_sizes, all_dst_offsets):
                s = self._put_sessions.get(key)
                if s is None or any(o < 0 or n < 0 or o + n > len(s[0]) for o, n in zip(offs, sizes)) \
                        or any(n and not p for p, n in zip(ptrs, sizes)):
                    log.error("%s(%r): %s", op, key, "no open put session" if s is None else
                              "a range is outside the object or a buffer is null; nothing written")
                    out.append(INVALID)
                    continue
                base = ctypes.addressof(ctypes.c_char.from_buffer(s[0]))
                for p, n, o in zip(ptrs, sizes, offs):
                    ctypes.memmove(base + o, p, n)
                out.append(sum(sizes))
        return out

    def batch_put_session_end(self, keys):
        """Store every session's object: one master round trip per distinct config."""
        keys = list(keys)
        out = [INVALID] * len(keys)
        with self._session_lock:
            taken = {}
            for i, key in enumerate(keys):
                s = self._put_sessions.pop(key, None)
                if s is None:
                    log.error("batch_put_session_end(%r): no open put session", key)
                    continue
                if isinstance(self._replica_info(key), dict):
                    log.error("batch_put_session_end(%r): another put stored the key during the session",
                              key)
                    out[i] = int(ErrorCode.OBJECT_ALREADY_EXISTS)
                    continue
                taken.setdefault(id(s[1]), (s[1], []))[1].append((i, key, s[0]))
        for config, items in taken.values():
            ptrs = [ctypes.addressof(ctypes.c_char.from_buffer(b)) for _, _, b in items]
            rs = self.batch_put_from([k for _, k, _ in items], ptrs, [len(b) for _, _, b in items], config)
            for (i, _, _), r in zip(items, rs):
                out[i] = r
        return out

    def batch_put_session_revoke(self, keys):
        with self._session_lock:
            return [0 if self._put_sessions.pop(k, None) is not None else INVALID for k in keys]

    def batch_get_session_start(self, keys):
        """Open a get session per existing key: [0 | -704 ...]."""
        out = []
        with self._session_lock:
            for key in keys:
                info = self._replica_info(key)
                if isinstance(info, dict):
                    self._get_sessions.add(key)
                    out.append(0)
                else:
                    out.append(info)
        return out

    def batch_get_into_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes, all_src_offsets):
        """Copy object[src_offsets[i][j]:+sizes[i][j]] of key i into buffer j; bytes read per key.
        No master round trip."""
        op = "batch_get_into_multi_buffer_ranges"
        keys = list(keys)
        if not _shapes_ok(op, keys, all_buffer_ptrs, all_sizes, all_src_offsets):
            return [INVALID] * len(keys)
        out = [INVALID] * len(keys)
        go = []
        with self._session_lock:
            in_session = [k in self._get_sessions for k in keys]
        for i, (key, ptrs, sizes, offs) in enumerate(zip(keys, all_buffer_ptrs, all_sizes, all_src_offsets)):
            if not in_session[i]:
                log.error("%s(%r): no open get session", op, key)
                continue
            info = self._replica_info(key)
            if isinstance(info, int):
                out[i] = info
                continue
            if any(o < 0 or n < 0 or o + n > info["size"] for o, n in zip(offs, sizes)):
                log.error("%s(%r): a range is outside the %d-byte object; nothing read", op, key, info["size"])
                continue
            go.append(i)
        if go:
            # One call for every key: the destination pointers are absolute, so the "buffer" base is 0.
            rs = self.get_into_ranges([0], [[keys[i] for i in go]],
                                      [[list(all_buffer_ptrs[i]) for i in go]],
                                      [[list(all_src_offsets[i]) for i in go]],
                                      [[list(all_sizes[i]) for i in go]])[0]
            for i, r in zip(go, rs):
                bad = [x for x in r if x < 0]
                out[i] = bad[0] if bad else sum(all_sizes[i])
        return out

    def batch_get_session_end(self, keys):
        with self._session_lock:
            for k in keys:
                self._get_sessions.discard(k)
        return 0
