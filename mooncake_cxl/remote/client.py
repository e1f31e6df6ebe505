"""RemoteClient: a client on a host that cannot map the pool.

Control goes to the master over TCP (the wire of wire.py); values move with
Mooncake's Transfer Engine between the caller's memory and the mapping that
the serving process (mooncake_cxl.pool_te) registered. What a local client
does with loads and stores, this one does so:

* a read is one kLocate for all its keys (the master's seqlock snapshot of
  each newest entry, with a read's lease), one engine batch copying every
  value, then one batch re-reading each entry's version and state: a value
  whose entry changed meanwhile (upsert, remove, eviction) is located again,
  never returned. Entry fields are pool memory: offsets and sizes are
  checked against the pool's size before use.
* a put is one PutStart (extents granted), one engine batch writing the
  values, one kPublish (the master does the CAS a local client would do).
* removes, regex removes and heartbeats are the local client's requests.

Thread safety: one lock per connection; calls from several threads queue.
"""
import ctypes
import logging
import os
import socket
import struct
import threading
import time

from . import wire
from ..errors import ErrorCode

log = logging.getLogger("mooncake_cxl")

OK = 0
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
BUSY = int(ErrorCode.OBJECT_REPLICA_BUSY)
NOT_READY = int(ErrorCode.REPLICA_IS_NOT_READY)
ILLEGAL = int(ErrorCode.ILLEGAL_CLIENT)
INVALID = int(ErrorCode.INVALID_PARAMS)
TRANSFER_FAIL = int(ErrorCode.TRANSFER_FAIL)
RPC_FAIL = int(ErrorCode.RPC_FAIL)
UNAVAILABLE = int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)

READ_RETRIES = 100
_ENTRY = struct.Struct("<QQ")  # IndexEntry: version, state_gen (layout.h)
ENTRY_BYTES = 64
FLAGS_AT = 48  # IndexEntry::flags
SUPERSEDED = 1 << 2  # kFlagSuperseded
CACHE_MAX = 1 << 16
BATCH_CHECK_BY_MASTER = 4  # keys from which a read re-checks through the master
TENANT_MARK = "\x1d"


def secret_from_env():
    """The secret in MC_CXL_AUTH_TOKEN_FILE, or "" (attach is then refused)."""
    path = os.environ.get("MC_CXL_AUTH_TOKEN_FILE", "")
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            return f.read(4097).strip().decode(errors="replace")
    except OSError as e:
        log.error("MC_CXL_AUTH_TOKEN_FILE=%s: %s", path, e)
        return ""


class RemoteError(Exception):
    def __init__(self, code, what):
        super().__init__(f"{what} ({code})")
        self.code = code


class RemoteClient:
    def __init__(self, local_hostname, master_addr, tenant="default", secret="", protocol="tcp",
                 connect_timeout_ms=3000, rpc_timeout_ms=10000, put_wait_ms=2000):
        self.hostname = local_hostname
        host, _, port = master_addr.rpartition(":")
        self.master = (host or "127.0.0.1", int(port))
        self.tenant = tenant or "default"
        self.prefix = "" if self.tenant == "default" else TENANT_MARK + self.tenant + TENANT_MARK
        self.secret = secret
        self.protocol = protocol if protocol in ("tcp", "rdma") else "tcp"
        self.connect_timeout = connect_timeout_ms / 1000.0
        self.rpc_timeout = rpc_timeout_ms / 1000.0
        self.put_wait = put_wait_ms / 1000.0
        self.lock = threading.RLock()
        self.sock = None
        self.rid = 0
        self.ref = (0, 0)
        self.attach = None
        self.te = None
        self.session = ""
        self.base = 0
        self.pool_size = 0
        self.put_id = 0
        self.closed = False
        self.hb_stop = threading.Event()
        self.hb = None
        # Where keys were found: stored key -> (locate item, monotonic time).
        # A read from a cached location is valid exactly when the entry still
        # has that version and state and is not superseded (an upsert marks the
        # old entry, a remove or eviction tombstones it: both bump the version);
        # past half a lease it is located through the master again, which
        # extends the lease.
        self.cache = {}
        self.cache_s = 5.0

    # ---- connection, attach, engine ----

    def connect(self):
        """Attach and open the engine: 0 or a negative ErrorCode (logged)."""
        try:
            with self.lock:
                self._attach(prev=(0, 0))
        except RemoteError as e:
            log.error("remote setup against %s:%d failed: %s", *self.master, e)
            self._drop_socket()
            return e.code
        self.hb = threading.Thread(target=self._heartbeat, name="mcxl-remote-hb", daemon=True)
        self.hb.start()
        return OK

    def _drop_socket(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None

    def _open_socket(self):
        self._drop_socket()
        try:
            s = socket.create_connection(self.master, timeout=self.connect_timeout)
        except OSError as e:
            raise RemoteError(RPC_FAIL, f"cannot reach the master: {e}")
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(self.rpc_timeout)
        self.sock = s

    def _call_once(self, mtype, payload):
        if self.sock is None:
            self._open_socket()
        self.rid += 1
        try:
            self.sock.sendall(wire.frame(mtype, self.rid, payload))
            return wire.recv_reply(self.sock)
        except (OSError, wire.WireError) as e:
            self._drop_socket()
            raise RemoteError(RPC_FAIL, f"master connection lost: {e}")

    def _attach(self, prev):
        reply = wire.attach_reply(self._call_once(
            wire.ATTACH, wire.attach(self.hostname, "remote:" + socket.gethostname(), os.getpid(),
                                     prev[0], prev[1], self.tenant, self.secret)))
        if reply["status"] != OK:
            why = ("refused: no secret or a wrong one (MC_CXL_AUTH_TOKEN_FILE, the master's "
                   "--auth_token_file)" if reply["status"] == ILLEGAL else "refused")
            raise RemoteError(reply["status"], f"attach {why}")
        self.ref = (reply["slot"], reply["generation"])
        self.attach = reply
        self.cache_s = reply["lease_ttl_ms"] / 2000.0
        self.cache.clear()
        self.pool_size = reply["pool_size"]
        if reply["te_session"] != self.session or self.te is None:
            self._open_engine(reply)
        log.info("remote client attached as slot %d; values over the Transfer Engine at %s (%s)",
                 reply["slot"], self.session, reply["te_protocol"])

    def _open_engine(self, reply):
        if not reply["te_session"]:
            raise RemoteError(UNAVAILABLE, "the master advertises no Transfer Engine for its pool "
                                           "(start it with --pool_te_protocol=tcp)")
        if self.te is None:
            from .engine import transfer_engine_class
            te = transfer_engine_class()()
            host = self.hostname.rpartition(":")[0] or "127.0.0.1"
            if te.initialize(host, "P2PHANDSHAKE", reply["te_protocol"] or self.protocol, "") != 0:
                raise RemoteError(TRANSFER_FAIL, "the local Transfer Engine did not start")
            self.te = te
        base = self.te.get_first_buffer_address(reply["te_session"])
        if not base:
            raise RemoteError(TRANSFER_FAIL, f"no pool registered at {reply['te_session']}")
        self.session, self.base = reply["te_session"], base

    def _reattach(self):
        self._open_socket()
        self._attach(prev=self.ref)

    def call(self, mtype, payload_of, idempotent=True):
        """One request: payload_of(ref) builds it (so a re-attach renames the
        client). Re-attaches on a lost connection or ILLEGAL_CLIENT and
        retries once when idempotent."""
        with self.lock:
            if self.closed:
                raise RemoteError(UNAVAILABLE, "closed")
            for attempt in (0, 1):
                try:
                    reply = self._call_once(mtype, payload_of(self.ref))
                except RemoteError:
                    if attempt or not idempotent:
                        raise
                    self._reattach()
                    continue
                if wire.status_of(reply) == ILLEGAL and attempt == 0:
                    self._reattach()
                    continue
                return reply
            return reply

    def _heartbeat(self):
        while not self.hb_stop.wait(1.0):
            try:
                self.call(wire.HEARTBEAT, wire.ref_only)
            except RemoteError:
                pass  # the next call re-attaches

    def close(self):
        with self.lock:
            if self.closed:
                return
            self.hb_stop.set()
            try:
                self._call_once(wire.DETACH, wire.ref_only(self.ref))
            except RemoteError:
                pass
            self.closed = True
            self._drop_socket()

    def healthy(self):
        try:
            self.call(wire.HEARTBEAT, wire.ref_only)
            return True
        except RemoteError:
            return False

    # ---- keys ----

    def stored(self, key):
        k = key.decode() if isinstance(key, (bytes, bytearray)) else key
        return (self.prefix + k).encode()

    # ---- the engine ----

    def _in_pool(self, off, n):
        return 0 <= off and 0 <= n and off + n <= self.pool_size

    def _transfer(self, write, locals_, remotes, lengths):
        """One engine batch; on failure re-attach (the serving process may
        have restarted on another port) and try once more. 0 or TRANSFER_FAIL."""
        if not locals_:
            return OK
        for attempt in (0, 1):
            te, base = self.te, self.base
            addrs = [base + r for r in remotes]
            if len(locals_) == 1:
                fn = te.transfer_sync_write if write else te.transfer_sync_read
                rc = fn(self.session, locals_[0], addrs[0], lengths[0])
            else:
                fn = te.batch_transfer_sync_write if write else te.batch_transfer_sync_read
                rc = fn(self.session, locals_, addrs, lengths)
            if rc == 0:
                return OK
            if attempt == 0:
                try:
                    with self.lock:
                        self._reattach()
                except RemoteError:
                    return TRANSFER_FAIL
        return TRANSFER_FAIL

    # ---- reads ----

    def locate(self, stored_keys, lease_until_ns=0):
        out = []
        for i in range(0, len(stored_keys), wire.MAX_REQUEST_KEYS):
            chunk = stored_keys[i:i + wire.MAX_REQUEST_KEYS]
            status, items = wire.locate_reply(self.call(wire.LOCATE, lambda ref: wire.locate(ref, chunk, lease_until_ns)))
            if status != OK:
                raise RemoteError(status, "locate refused")
            if len(items) != len(chunk):
                raise RemoteError(RPC_FAIL, "locate reply of another length")
            out.extend(items)
        return out

    def read(self, stored_keys, place):
        """Reads every key: place(i, size) returns [(addr, n), ...] where key
        i's value goes (together at least size bytes, or a negative code).
        Returns per key its size or a negative code."""
        n = len(stored_keys)
        result = [NOT_FOUND] * n
        todo = list(range(n))
        deadline = time.monotonic() + 10.0
        use_cache = True
        for _ in range(READ_RETRIES):
            if not todo:
                break
            now = time.monotonic()
            items, ask = {}, []
            for i in todo:
                hit = self.cache.get(stored_keys[i]) if use_cache else None
                if hit is not None and now - hit[1] < self.cache_s:
                    items[i] = hit
                else:
                    ask.append(i)
            if ask:
                try:
                    for i, it in zip(ask, self.locate([stored_keys[i] for i in ask])):
                        items[i] = (it, now)
                except RemoteError as e:
                    for i in ask:
                        result[i] = e.code
                    return result
            use_cache = False  # a retry asks the master
            asked = set(ask)
            loc, rem, ln, snaps, again = [], [], [], [], []
            for i in todo:
                it, born = items[i]
                status, entry_off, version, state_gen, value_off, size = it[:6]
                if status == NOT_READY and time.monotonic() < deadline:
                    again.append(i)  # being staged from the SSD tier
                    continue
                if status != OK:
                    result[i] = status
                    self.cache.pop(stored_keys[i], None)
                    continue
                if not (self._in_pool(value_off, size) and self._in_pool(entry_off, ENTRY_BYTES)):
                    result[i] = NOT_FOUND  # a corrupt entry: a miss, as a local reader
                    continue
                dest = place(i, size)
                if isinstance(dest, int):
                    result[i] = dest
                    continue
                left, pos = size, value_off
                for addr, cap in dest:
                    k = min(cap, left)
                    if k:
                        loc.append(addr)
                        rem.append(pos)
                        ln.append(k)
                    pos += k
                    left -= k
                if left:
                    result[i] = INVALID
                    continue
                snaps.append((i, it, born))
            if self._transfer(False, loc, rem, ln) != OK:
                for i, *_ in snaps:
                    result[i] = TRANSFER_FAIL
                return result
            # Then each entry again: unchanged version and state means the
            # copy saw one value (the seqlock rule of a local read).
            if len(snaps) >= BATCH_CHECK_BY_MASTER:
                again += self._check_by_master(stored_keys, snaps, result)
                todo = again
                continue
            check = ctypes.create_string_buffer(ENTRY_BYTES * len(snaps))
            base = ctypes.addressof(check)
            if self._transfer(False, [base + ENTRY_BYTES * j for j in range(len(snaps))],
                              [s[1][1] for s in snaps], [ENTRY_BYTES] * len(snaps)) != OK:
                for i, *_ in snaps:
                    result[i] = TRANSFER_FAIL
                return result
            raw = check.raw
            for j, (i, it, born) in enumerate(snaps):
                at = ENTRY_BYTES * j
                same = _ENTRY.unpack_from(raw, at) == (it[2], it[3])
                flags = struct.unpack_from("<I", raw, at + FLAGS_AT)[0]
                key = stored_keys[i]
                if same and not flags & SUPERSEDED:
                    result[i] = it[5]
                    if len(self.cache) >= CACHE_MAX:
                        self.cache.clear()
                    self.cache[key] = (it, born)
                elif same and i in asked:
                    # Located just now: the master's newest value while an
                    # upsert is unfinished (never cached).
                    result[i] = it[5]
                    self.cache.pop(key, None)
                else:
                    self.cache.pop(key, None)
                    again.append(i)
            todo = again
            if todo:
                time.sleep(0.0002)  # backoff while a writer holds the entries
        return result

    def _check_by_master(self, stored_keys, snaps, result):
        """The re-check of a batch: one kLocate (the master reads each entry
        under its seqlock now) instead of an engine batch of small reads,
        which costs a round trip per entry. Valid when the key's newest entry
        is still the one copied, with the same version and state. Returns
        the keys to read again."""
        again = []
        try:
            now = self.locate([stored_keys[i] for i, _, _ in snaps], wire.LOCATE_TO_VALIDATE)
        except RemoteError as e:
            for i, _, _ in snaps:
                result[i] = e.code
            return []
        for (i, it, born), cur in zip(snaps, now):
            key = stored_keys[i]
            if cur[0] == OK and cur[1:4] == it[1:4]:
                result[i] = it[5]
                if len(self.cache) >= CACHE_MAX:
                    self.cache.clear()
                self.cache[key] = (it, born)
            else:
                self.cache.pop(key, None)
                again.append(i)
        return again

    # ---- writes ----

    def _next_put_id(self):
        self.put_id += 1
        return self.put_id

    def put(self, stored_keys, parts, upsert, flags=0, soft_pin_ttl_ms=0, groups=None):
        """parts[i]: [(addr, n), ...] of key i's value. Per key 0 or a negative code."""
        n = len(stored_keys)
        for k in stored_keys:
            self.cache.pop(k, None)
        out = [OK] * n
        sizes = [sum(p[1] for p in ps) for ps in parts]
        groups = groups or [""] * n
        todo = [i for i in range(n)]
        deadline = time.monotonic() + self.put_wait
        backoff = 0.001
        while todo:
            busy = []
            for c in range(0, len(todo), wire.MAX_REQUEST_KEYS):
                chunk = todo[c:c + wire.MAX_REQUEST_KEYS]
                busy += self._put_once(stored_keys, parts, sizes, groups, upsert, flags, soft_pin_ttl_ms, chunk, out)
            if not busy:
                break
            if time.monotonic() > deadline:
                for i in busy:
                    out[i] = int(ErrorCode.NO_AVAILABLE_HANDLE)
                break
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.05)
            todo = busy
        return out

    def _put_once(self, keys, parts, sizes, groups, upsert, flags, ttl, idx, out):
        put_id = self._next_put_id()
        try:
            status, items = wire.put_start_reply(self.call(
                wire.PUT_START, lambda ref: wire.put_start(ref, put_id, [], upsert, flags, ttl,
                                                           [keys[i] for i in idx], [sizes[i] for i in idx],
                                                           [groups[i] for i in idx]), idempotent=False))
        except RemoteError as e:
            for i in idx:
                out[i] = e.code
            return []
        if status != OK or len(items) != len(idx):
            for i in idx:
                out[i] = status if status != OK else RPC_FAIL
            return []
        loc, rem, ln, granted, busy = [], [], [], [], []
        for i, (st, slot, gen, value_off, settle) in zip(idx, items):
            if st == EXISTS:
                out[i] = OK  # the first value is kept: success, as in Mooncake
                continue
            if st == BUSY:
                busy.append(i)
                continue
            if st != OK:
                out[i] = st
                continue
            if not self._in_pool(value_off, sizes[i]):
                out[i] = TRANSFER_FAIL
                continue
            pos = value_off
            for addr, k in parts[i]:
                if k:
                    loc.append(addr)
                    rem.append(pos)
                    ln.append(k)
                pos += k
            granted.append((i, slot, gen, settle))
        if not granted:
            return busy
        if self._transfer(True, loc, rem, ln) != OK:
            for i, *_ in granted:
                out[i] = TRANSFER_FAIL  # never published: the master revokes it
            return busy
        try:
            status, results, ticket = wire.publish_reply(self.call(
                wire.PUBLISH, lambda ref: wire.publish(ref, [(g[1], g[2]) for g in granted]), idempotent=False))
        except RemoteError as e:
            for i, *_ in granted:
                out[i] = e.code
            return busy
        if status != OK or len(results) != len(granted):
            for i, *_ in granted:
                out[i] = status if status != OK else RPC_FAIL
            return busy
        settle = []
        for (i, slot, gen, must_settle), r in zip(granted, results):
            out[i] = r
            if r == OK and must_settle:
                settle.append((keys[i], gen))
        if settle:
            try:
                st, t = wire.ticket_reply(self.call(wire.SETTLE, lambda ref: wire.settle(ref, settle)))
                ticket = max(ticket, t)
            except RemoteError:
                pass
        self.wait_tombstones(ticket)
        return busy

    def wait_tombstones(self, ticket):
        """Waits (10 s at most) until the SSD tier's durable tombstone word
        reaches `ticket`, read over the engine."""
        if not ticket:
            return OK
        word = ctypes.c_uint64(0)
        deadline = time.monotonic() + 10.0
        off = self.attach["tombs_word_offset"]
        while time.monotonic() < deadline:
            if self._transfer(False, [ctypes.addressof(word)], [off], [8]) != OK:
                return TRANSFER_FAIL
            if word.value >= ticket:
                return OK
            time.sleep(0.002)
        log.warning("remote: tombstones of a remove not durable after 10 s")
        return int(ErrorCode.RPC_TIMEOUT)

    # ---- removes ----

    def remove(self, stored_keys, force, batch):
        status, results, ticket = wire.remove_reply(self.call(
            wire.BATCH_REMOVE if batch else wire.REMOVE, lambda ref: wire.remove(ref, stored_keys, force),
            idempotent=False))
        self.wait_tombstones(ticket)
        return status, results

    def remove_matching(self, pattern, force, all_keys):
        status, count, ticket = wire.count_reply(self.call(
            wire.REMOVE_ALL if all_keys else wire.REMOVE_BY_REGEX,
            lambda ref: wire.remove_matching(ref, pattern, force), idempotent=False))
        self.wait_tombstones(ticket)
        return count if status == OK else status
