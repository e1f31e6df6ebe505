"""Processes of the randomized fault test (tests/faults/test_fault_random.py), run as
`python fault_workers.py worker|check ARGS_JSON` so that the driver can
SIGKILL/SIGSTOP them like any process.

Ownership: worker slot w belongs to tenant w % T (T = "ntenants"; tenant 0 is
"default", the others "t1", ...) and owns the keys f/g/0 .. f/g/K-1 of its
tenant, g = w // T: slots of different tenants write the same key names, so a
read that crosses tenants returns a value whose header names another slot
(invariant tenant_leak). One process per slot lives at a time (a killed one is reaped before its successor, the next "life",
starts), so each key has one writer and "the last acknowledged value" is
well-defined. Every write and remove is journaled (one line per slot, flushed,
no fsync: a SIGKILL keeps what was flushed): `A` before the call, `R` with its
return code after it. Replaying a journal gives, per key, the set of values a
read may return (a miss is always allowed: eviction):

  upsert rc 0           -> {seq}                 (the new value, nothing older)
  put rc 0              -> allowed | {seq}        (a put keeps an existing value)
  remove rc 0 / -704    -> {}                     (only a miss, or a later write)
  write failed / no R   -> allowed | {seq}        (outcome unknown)
  remove failed / no R  -> allowed
  remove_by_regex (force) of own keys: journaled as one remove per own key it
  matches, rc 0 when the call returned a count

Values describe themselves (magic, slot, life, key index, seq, length) and end
with a blake2b digest over the key and everything before it, so a torn value,
another object's bytes or another key's value is detected by any reader.
Violations go to a per-process file, one JSON line each, flushed at once.
"""
import hashlib
import json
import os
import random
import struct
import sys
import time

MAGIC = b"MCXF"
HEAD = struct.Struct("<4sHHIQI")  # magic, slot, life, key index, seq, total length
DIGEST = 16
MIN_VALUE, MAX_VALUE = 4 << 10, 256 << 10
# Tiny values (keys nkeys .. nkeys + ntiny - 1 of a slot), put in batches:
# thousands of them fill the index long before the data region, so eviction
# for index slots (its watermark, full probe windows) runs under the faults.
TINY_MIN, TINY_MAX = 40, 160  # the header and digest, up to a few lines
SEQ_PER_LIFE = 1 << 32  # seq = life * SEQ_PER_LIFE + n: increasing across lives of a slot

OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
NO_AVAILABLE_HANDLE = -200


NT = 1  # tenants (args "ntenants"), set at start


def key_name(slot, idx):
    return f"f/{slot // NT}/{idx}"


def tenant_of(slot):
    return "default" if slot % NT == 0 else f"t{slot % NT}"


def owner_of(reader_slot, key, nslots):
    """The slot that writes `key` in reader_slot's tenant (None: nobody)."""
    group = int(key.split("/")[1])
    w = group * NT + reader_slot % NT
    return w if w < nslots else None


def make_value(slot, life, idx, seq, size, block, rnd):
    body_len = size - HEAD.size - DIGEST
    off = rnd.randrange(0, len(block) - body_len)
    head = HEAD.pack(MAGIC, slot, life, idx, seq, size) + block[off:off + body_len]
    return head + hashlib.blake2b(key_name(slot, idx).encode() + head, digest_size=DIGEST).digest()


def parse_value(key, v, owner=None):
    """(seq, None) when `v` is an intact value of `key` (written by slot
    `owner` when given), else (None, why)."""
    v = bytes(v)
    if len(v) < HEAD.size + DIGEST:
        return None, f"{len(v)} bytes: shorter than any value written"
    magic, slot, life, idx, seq, total = HEAD.unpack_from(v)
    what = f"header says slot {slot} key {idx} life {life} seq {seq:#x} len {total}"
    if magic != MAGIC:
        return None, f"bad magic {magic!r} ({len(v)} bytes): foreign or torn bytes"
    if key_name(slot, idx) != key:
        return None, f"foreign value: {what} ({len(v)} bytes read)"
    if total != len(v):
        return None, f"length field {total} but {len(v)} bytes read ({what})"
    if hashlib.blake2b(key.encode() + v[:-DIGEST], digest_size=DIGEST).digest() != v[-DIGEST:]:
        return None, f"checksum mismatch: torn ({what})"
    if owner is not None and slot != owner:
        return None, f"tenant leak: written by slot {slot} (tenant {tenant_of(slot)}), not {owner} ({what})"
    return seq, None


class KeyModel:
    """Per key: the seqs a read may return now, and every seq ever attempted."""

    def __init__(self):
        self.allowed = {}  # key -> set of seqs
        self.attempted = {}  # key -> set of seqs

    def attempt(self, key, seq, op):
        if op != "remove":
            self.attempted.setdefault(key, set()).add(seq)

    def result(self, key, seq, op, rc):
        allowed = self.allowed.setdefault(key, set())
        if op == "remove":
            if rc in (0, OBJECT_NOT_FOUND):
                allowed.clear()
        elif op == "upsert" and rc == 0:
            allowed.clear()
            allowed.add(seq)
        else:  # put rc 0 (keeps an existing value), or a failed write (unknown outcome)
            allowed.add(seq)

    def unfinished(self, key, seq, op):
        """An attempt with no result line: the process died in the call."""
        if op != "remove":
            self.allowed.setdefault(key, set()).add(seq)

    def judge(self, key, v, owner=None):
        """None if reading `v` (bytes, b"" = miss) for `key` is allowed, else
        (invariant, why)."""
        if not v:
            return None
        seq, why = parse_value(key, v, owner)
        if why is not None:
            return ("tenant_leak" if why.startswith("tenant leak") else "torn_or_foreign"), why
        allowed = self.allowed.get(key, set())
        if seq in allowed:
            return None
        newest = max(allowed) if allowed else None
        if seq in self.attempted.get(key, ()):
            return "older_value", (f"read seq {seq:#x}, allowed {sorted(hex(a) for a in allowed) or 'only a miss'}"
                                   f" (newest allowed {newest if newest is None else hex(newest)})")
        return "unknown_value", f"read seq {seq:#x} never attempted; allowed {sorted(hex(a) for a in allowed)}"


def replay(path, model):
    """Applies one slot's journal to `model`; returns the highest seq seen."""
    top = -1
    pending = {}  # (key, seq) -> op, attempts without a result yet
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return top
    for line in lines:
        p = line.split(" ")
        if len(p) < 4:
            continue  # empty or cut by a kill
        try:
            kind, key, seq, op = p[0], p[1], int(p[2]), p[3]
        except ValueError:
            continue
        top = max(top, seq)
        if kind == "A":
            model.attempt(key, seq, op)
            pending[(key, seq)] = op
        elif kind == "R" and len(p) >= 5:
            try:
                rc = int(p[4])
            except ValueError:
                continue
            pending.pop((key, seq), None)
            model.result(key, seq, op, rc)
    for (key, seq), op in pending.items():
        model.unfinished(key, seq, op)
    return top


class Violations:
    def __init__(self, path, who):
        self.f = open(path, "a", buffering=1)
        self.who = who
        self.count = 0

    def add(self, invariant, key, why, **extra):
        self.count += 1
        rec = {"invariant": invariant, "who": self.who, "key": key, "why": why, "t": time.time()}
        rec.update(extra)
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()


class Channel:
    """An announcement channel the worker produces on and follows itself:
    "fc/<g>/<life>", the same name in every tenant (slots of different
    tenants share g), a new one per life so that channels of killed lives
    must be reclaimed, and "fc/<g>/<life>/idle" it only listens on (nobody
    produces there: any record read is foreign). Every record read must be this slot's (its tag names
    tenant and name, user words slot and life): announce_foreign; an open
    refused for want of a free channel is announce_exhausted (the master
    runs with few channels). Opens and publishes fail while the master is
    down or the slot was reclaimed: retried later, never a violation. A
    remote client (produce=False: a claim needs the pool) only holds and
    reads the idle channel, over the engine; its holds must be reclaimed
    with it too."""

    def __init__(self, store, slot, life, viol, stats, produce=True):
        import zlib
        self.store, self.slot, self.life, self.viol, self.stats = store, slot, life, viol, stats
        self.produce = produce
        self.name = f"fc/{slot // NT}/{life}"
        self.tag = zlib.crc32(f"{tenant_of(slot)}/{self.name}".encode())
        self.ann = self.lis = self.idle = None
        self.next_try = 0.0

    def _open(self):
        from mooncake_cxl.kv.announce import Announcer, Listener
        from mooncake_cxl.kv.cache import KVCacheError
        if time.monotonic() < self.next_try:
            return False
        try:
            if self.produce and (self.lis is None or self.lis.channel_lost):
                self.lis = Listener(self.store, self.name, from_start=True)
            if self.produce and self.ann is None:
                self.ann = Announcer(self.store, self.name, tag=self.tag)
            if self.idle is None or self.idle.channel_lost:
                self.idle = Listener(self.store, self.name + "/idle", from_start=True)
            return True
        except KVCacheError as e:
            self.next_try = time.monotonic() + 0.2
            if e.code == NO_AVAILABLE_HANDLE:
                self.viol.add("announce_exhausted", self.name, f"{e} (held channels are not reclaimed?)")
            elif e.code == OBJECT_ALREADY_EXISTS:  # our own name: only another tenant's producer could hold it
                self.viol.add("announce_foreign", self.name, f"{e}: a producer of another tenant holds it")
            return False

    def announce(self, idx, seq):
        from mooncake_cxl.kv.cache import KVCacheError
        from mooncake_cxl.remote.client import RemoteError
        if not self._open():
            return
        try:
            if self.produce:
                self.ann.blocks_ready(idx, seq & 0xFFFFFFFF, seq >> 32, user=(self.slot, self.life))
                self.stats["announced"] += 1
        except KVCacheError:
            self.ann.close()
            self.ann = None  # lost (reclaimed while stopped): claim it again
        try:
            idle = self.idle.poll()
        except RemoteError:  # an engine read failed (the serving process restarting): later
            idle = []
        self.stats["idle_polled"] += 1
        for a in idle:
            self.viol.add("announce_foreign", self.name + "/idle", f"record {a.number} on a channel nobody "
                          f"of this tenant produces on: tag {a.tag:#x}, user words {a.user}")
        for a in (self.lis.poll() if self.produce else ()):
            self.stats["announce_read"] += 1
            if a.tag != self.tag or a.user[0] != self.slot or a.user[1] > self.life:
                self.viol.add("announce_foreign", self.name, f"record {a.number} of another channel, tenant or "
                              f"slot: tag {a.tag:#x} (ours {self.tag:#x}), user words {a.user}")


def open_store(address, deadline, stop, tenant="default"):
    from mooncake_cxl import MooncakeDistributedStore
    while True:
        s = MooncakeDistributedStore()
        # The segment size counts only with MC_CXL_DRAM_SEGMENT=1 (one worker's).
        rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 16 << 20, 0, "cxl", "", address, tenant_id=tenant)
        if rc == 0:
            return s
        s.close()
        if time.monotonic() > deadline or stop():
            raise RuntimeError(f"setup kept failing (last rc {rc})")
        time.sleep(0.2)


def worker(a):
    global NT
    NT = a.get("ntenants", 1)
    slot, life, nkeys = a["slot"], a["life"], a["nkeys"]
    rnd = random.Random(f"{a['seed']}/worker/{slot}/{life}")
    block = rnd.randbytes(MAX_VALUE + 4096)
    model = KeyModel()
    journal_path = os.path.join(a["dir"], f"journal.{slot}")
    top = replay(journal_path, model)
    seq = max(top + 1, life * SEQ_PER_LIFE)
    journal = open(journal_path, "a", buffering=1)
    viol = Violations(os.path.join(a["dir"], f"violations.{slot}.{life}"), f"worker {slot} life {life}")
    stop_path = os.path.join(a["dir"], "stop")
    stop = lambda: os.path.exists(stop_path)
    stats = {k: 0 for k in ("put", "upsert", "group_write", "tiny_batch", "remove", "remove_by_regex", "hold",
                            "release_hold", "get",
                            "get_buffer", "ok", "failed",
                            "hit", "miss", "foreign_read", "view_checked", "view_refused", "announced",
                            "announce_read", "idle_polled")}
    rcs = {}
    s = open_store(a["address"], time.monotonic() + 60, stop, tenant_of(slot))
    print(f"worker {slot} life {life} pid {os.getpid()} (tenant {tenant_of(slot)}) attached, seq from {seq:#x}",
          flush=True)
    held = []  # [handle, key, bytes at get_buffer, ops left, time taken]
    channel = Channel(s, slot, life, viol, stats, produce=getattr(s, "_remote", None) is None)
    own = [key_name(slot, i) for i in range(nkeys)]
    tiny = [key_name(slot, nkeys + i) for i in range(a.get("ntiny", 0))]
    recent = []  # own keys written lately

    own_set = set(own)
    nslots = a["nslots"]

    def read_check(key, v, how):
        mine = key in own_set
        if not v:
            stats["miss"] += 1
            return
        stats["hit"] += 1
        if mine:
            bad = model.judge(key, v, slot)
        else:
            stats["foreign_read"] += 1
            owner = owner_of(slot, key, nslots)
            if owner is None:
                bad = ("tenant_leak", f"{len(v)} bytes read, but no slot of tenant {tenant_of(slot)} writes it")
            else:
                _, why = parse_value(key, v, owner)
                bad = None if why is None else (
                    "tenant_leak" if why.startswith("tenant leak") else "torn_or_foreign", why)
        if bad:
            viol.add(bad[0], key, f"{how}: {bad[1]}", read_your_write=mine)

    def release(h):
        handle, key, before, _, since = h
        try:
            now = bytes(handle)
        except Exception as e:  # a handle may refuse access once invalid: allowed
            stats["view_refused"] += 1
            print(f"view of {key} refused on release: {e!r}", flush=True)
            return
        stats["view_checked"] += 1
        if now != before:
            _, why = parse_value(key, now)
            viol.add("view_changed", key, f"a live BufferHandle's bytes changed ({len(before)} bytes; "
                     f"now: {why or 'another intact value of the key'})", since=since)

    segment = os.environ.get("MC_CXL_DRAM_SEGMENT") == "1"
    if segment:
        from mooncake_cxl import ReplicateConfig
        same_node = ReplicateConfig()
        same_node.prefer_alloc_in_same_node = True

    def write(op, key):
        nonlocal seq
        seq += 1
        idx = int(key.rsplit("/", 1)[1])
        size = rnd.choice([MIN_VALUE, MAX_VALUE, rnd.randint(MIN_VALUE, MAX_VALUE),
                           rnd.randint(MIN_VALUE, 64 << 10)])
        v = make_value(slot, life, idx, seq, size, block, rnd)
        journal.write(f"A {key} {seq} {op}\n")
        model.attempt(key, seq, op)
        if segment and rnd.random() < 0.5:  # into this worker's DRAM segment
            rc = s.upsert(key, v, same_node) if op == "upsert" else s.put(key, v, same_node)
        else:
            rc = s.upsert(key, v) if op == "upsert" else s.put(key, v)
        journal.write(f"R {key} {seq} {op} {rc}\n")
        model.result(key, seq, op, rc)
        stats[op] += 1
        return rc

    def write_group(op, keys):
        # Own keys put in one call with one group id (K and V, TP shards):
        # eviction, demotion, promotion and a full tier move them together.
        nonlocal seq
        from mooncake_cxl import ReplicateConfig
        vals, seqs = [], []
        for key in keys:
            seq += 1
            idx = int(key.rsplit("/", 1)[1])
            vals.append(make_value(slot, life, idx, seq, rnd.randint(MIN_VALUE, 64 << 10), block, rnd))
            seqs.append(seq)
            journal.write(f"A {key} {seq} {op}\n")
            model.attempt(key, seq, op)
        cfg = ReplicateConfig()
        cfg.group_ids = [f"g{slot}.{life}.{seqs[0]}"] * len(keys)
        rc = (s.upsert_batch if op == "upsert" else s.put_batch)(keys, vals, cfg)
        for key, q in zip(keys, seqs):  # one rc for the call: nonzero leaves each key's outcome open
            journal.write(f"R {key} {q} {op} {rc}\n")
            model.result(key, q, op, rc)
        stats[op] += 1
        stats["group_write"] += 1
        return rc

    def write_tiny_batch():
        # 50-200 own tiny keys in one call; one rc for the call, as write_group.
        nonlocal seq
        op = "upsert" if rnd.random() < 0.3 else "put"
        keys = rnd.sample(tiny, min(len(tiny), rnd.randint(50, 200)))
        vals, seqs = [], []
        for key in keys:
            seq += 1
            idx = int(key.rsplit("/", 1)[1])
            vals.append(make_value(slot, life, idx, seq, rnd.randint(TINY_MIN, TINY_MAX), block, rnd))
            seqs.append(seq)
            journal.write(f"A {key} {seq} {op}\n")
            model.attempt(key, seq, op)
        rc = (s.upsert_batch if op == "upsert" else s.put_batch)(keys, vals)
        for key, q in zip(keys, seqs):
            journal.write(f"R {key} {q} {op} {rc}\n")
            model.result(key, q, op, rc)
        stats["tiny_batch"] += 1
        if rc == 0 and rnd.random() < 0.3:  # read some back at once
            for key in keys[:5]:
                stats["get"] += 1
                read_check(key, s.get(key), "get right after a tiny batch")
        return rc

    def remove_by_regex():
        # Own keys whose index starts with a digit: the master confines the
        # pattern to our tenant, so the other tenants' same names stay.
        nonlocal seq
        d = str(rnd.randrange(1, 10))
        matched = [k for k in own if k.rsplit("/", 1)[1].startswith(d)]
        seqs = []
        for k in matched:
            seq += 1
            seqs.append(seq)
            journal.write(f"A {k} {seq} remove\n")
        rc = s.remove_by_regex(f"^f/{slot // NT}/{d}[0-9]*$", force=True)
        code = 0 if rc >= 0 else rc
        for k, q in zip(matched, seqs):
            journal.write(f"R {k} {q} remove {code}\n")
            model.result(k, q, "remove", code)
        stats["remove_by_regex"] += 1
        return code

    def remove(key, force):
        nonlocal seq
        seq += 1
        journal.write(f"A {key} {seq} remove\n")
        rc = s.remove(key, force=force)
        journal.write(f"R {key} {seq} remove {rc}\n")
        model.result(key, seq, "remove", rc)
        stats["remove"] += 1
        return rc

    # A TCP client's requests make the master Tick after each one, which
    # narrows the window of a completion noticed late to nothing: the TCP
    # worker works in bursts, so that rings alone drive the master half the time.
    tcp = os.environ.get("MC_CXL_RPC") == "tcp"
    phase_end, busy = time.monotonic() + rnd.uniform(1, 3), True
    try:
        while not stop():
            if tcp and time.monotonic() > phase_end:
                phase_end, busy = time.monotonic() + rnd.uniform(1, 3), not busy
            if not busy:
                time.sleep(0.05)
                continue
            for h in list(held):
                h[3] -= 1
                if h[3] <= 0:
                    held.remove(h)
                    release(h)
            if held and rnd.random() < 0.3:
                key = rnd.choice(held)[1]
                key = key if key in own_set else rnd.choice(own)
            elif recent and rnd.random() < 0.3:  # keys written lately: read-your-write
                key = rnd.choice(recent)
            else:
                key = rnd.choice(own)
            r = rnd.random()
            rc = 0
            if tiny and rnd.random() < 0.05:
                rc = write_tiny_batch()
            elif r < 0.45:
                if rnd.random() < 0.4:  # read first: the old value is leased when replaced
                    stats["get"] += 1
                    read_check(key, s.get(key), "get before a write")
                op = "upsert" if r < 0.30 else "put"
                partner = rnd.choice(own)
                if partner != key and rnd.random() < 0.15:
                    rc = write_group(op, [key, partner])
                else:
                    rc = write(op, key)
                if rc == 0:
                    recent.append(key)
                    del recent[:-8]
                    if channel is not None:
                        channel.announce(int(key.rsplit("/", 1)[1]), seq)
                    if rnd.random() < 0.1:
                        stats["get"] += 1
                        read_check(key, s.get(key), "get right after the write")
            elif r < 0.56 and rnd.random() < 0.1:
                rc = remove_by_regex()
            elif r < 0.56:
                rc = remove(key, force=rnd.random() < 0.5)
                if rc in (OBJECT_NOT_FOUND, OBJECT_HAS_LEASE):
                    rc = 0  # expected answers (missing; leased or viewed), not failures
            elif r < 0.58:
                # A kv-layer hold (client-written lease to a deadline) or its
                # release: changes what eviction and unforced removes may take,
                # never a value.
                held_keys = [key if rnd.random() < 0.7 else key_name(rnd.randrange(a["nslots"]), rnd.randrange(nkeys))]
                if rnd.random() < 0.6:
                    s._hold(held_keys, time.time_ns() + int(rnd.uniform(0.5, 3.0) * 1e9))
                    stats["hold"] += 1
                else:
                    s._release_hold(held_keys)
                    stats["release_hold"] += 1
            elif r < 0.80:
                if rnd.random() < 0.25:  # another slot's key: integrity and tenant isolation
                    key = key_name(rnd.randrange(a["nslots"]), rnd.randrange(nkeys))
                stats["get"] += 1
                read_check(key, s.get(key), "get")
            else:
                if rnd.random() < 0.25:
                    key = key_name(rnd.randrange(a["nslots"]), rnd.randrange(nkeys))
                stats["get_buffer"] += 1
                h = s.get_buffer(key)
                if h is None:
                    stats["miss"] += 1
                else:
                    b = bytes(h)
                    read_check(key, b, "get_buffer")
                    if len(held) < 3:
                        held.append([h, key, b, rnd.randint(3, 60), time.time()])
                    else:
                        release([h, key, b, 0, time.time()])
                    del h
            stats["ok" if rc == 0 else "failed"] += 1
            if rc != 0:
                rcs[rc] = rcs.get(rc, 0) + 1
                time.sleep(0.02)  # the master is down or busy: do not spin
        for h in held:
            release(h)
        held.clear()
        # Faults are over: this worker must be able to write again.
        deadline = time.monotonic() + 30
        settle = []
        while True:
            rc = write("upsert", own[0])
            settle.append(rc)
            if rc == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if rc != 0:
            viol.add("no_progress_after_faults", own[0],
                     f"upserts kept failing for 30 s after the faults ended: {settle[:5]}... ({len(settle)})")
        else:
            read_check(own[0], s.get(own[0]), "get after the settling upsert")
        close_rc = s.close()
        with open(os.path.join(a["dir"], f"result.{slot}.{life}"), "w") as f:
            json.dump({"stats": stats, "rcs": {str(k): v for k, v in rcs.items()}, "close": close_rc,
                       "violations": viol.count}, f)
        print(f"worker {slot} life {life} done: {stats} rcs {rcs}", flush=True)
    except BaseException:
        import traceback
        viol.add("worker_error", None, traceback.format_exc())
        raise


def check(a):
    """After the faults: every key ever journaled is a miss or an allowed
    value, read in its own tenant."""
    global NT
    NT = a.get("ntenants", 1)
    viol = Violations(os.path.join(a["dir"], "violations.check"), "checker")
    hits = misses = 0
    sizes = {}
    for slot in range(a["nslots"]):
        model = KeyModel()  # the slot's keys are its own (tenant, name)s
        replay(os.path.join(a["dir"], f"journal.{slot}"), model)
        s = open_store(a["address"], time.monotonic() + 60, lambda: False, tenant_of(slot))
        for idx in range(a["nkeys"] + a.get("ntiny", 0)):
            key = key_name(slot, idx)
            v = s.get(key)
            if v:
                hits += 1
                sizes[f"{tenant_of(slot)}\t{key}"] = len(v)
            else:
                misses += 1
            bad = model.judge(key, v, slot)
            if bad:
                viol.add(bad[0], key, f"final read: {bad[1]}")
            h = s.get_buffer(key)
            for _ in range(5):
                # A view of a disk-resident value needs the master to stage it
                # into a busy pool, which may fail for a moment; wrong bytes may not.
                if h is not None or not v:
                    break
                time.sleep(0.05)
                h = s.get_buffer(key)
            if (h is None) != (not v) or (h is not None and bytes(h) != v):
                viol.add("view_differs_from_get", key, f"final get_buffer differs from get "
                         f"({None if h is None else len(h)} vs {len(v)} bytes)")
            del h
        s.close()
    with open(os.path.join(a["dir"], "result.check"), "w") as f:
        json.dump({"hits": hits, "misses": misses, "sizes": sizes, "violations": viol.count}, f)
    print(f"checker: {hits} hits, {misses} misses, {viol.count} violations", flush=True)


if __name__ == "__main__":
    {"worker": worker, "check": check}[sys.argv[1]](json.loads(sys.argv[2]))
