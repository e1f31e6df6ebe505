"""Several client processes on one pool at once: each sees the others' puts
and removes, two writers racing on the same keys leave one intact value, and
readers never see a torn value while writers put, upsert and remove.

Every client here is a separate Python process started with the "spawn"
context (conftest's `children`): each creates its own MooncakeDistributedStore
and calls setup() against `master.address` with protocol "cxl". The
child-side functions live at module level so that a spawned child can import
them by name.

Nothing here asserts on time: waits are bounded only as guards against hangs,
and loops are bounded by iteration counts.
"""
import hashlib
import os
import random
import struct
import traceback

import pytest

from conftest import (CALL_TIMEOUT, CHILD_START_TIMEOUT, SPAWN, assert_no_leak, baseline_fill, connect, open_store,
                      value_for)


pytestmark = pytest.mark.usefixtures("no_put_wait")


KiB = 1 << 10

OBJECT_NOT_FOUND = -704
REPLICA_IS_NOT_READY = -703


# --------------------------------------------------------------------------
# 1. Two client processes share one pool: each is a long-lived client that runs
# commands sent from the test; values of many sizes, bytes derived from the key.

SIZES = [1, 2, 63, 64, 65, 100, 4095, 4096, 4097, 10000, 65535, 65536, 65537,
         300_000, 1 << 20, 777_777, 1, 17, 8192, 123_457]


def size_for(i):
    return SIZES[i % len(SIZES)]


def keys_for(prefix, n):
    return [f"{prefix}{i}" for i in range(n)]


def _serve(conn, address):
    """A long-lived client process: executes ("name", args) commands from the pipe."""
    s = open_store(address)
    conn.send(("ready", os.getpid()))
    try:
        while True:
            if not conn.poll(CALL_TIMEOUT * 2):
                raise RuntimeError("no command from the parent")
            name, args = conn.recv()
            if name == "exit":
                return "bye"
            try:
                conn.send(("reply", COMMANDS[name](s, *args)))
            except Exception:
                conn.send(("reply-err", traceback.format_exc()))
    finally:
        s.close()


class Worker:
    """Parent-side handle of a _serve child."""

    def __init__(self, start, address):
        self.child = start(_serve, address)
        msg = self.child.recv(CHILD_START_TIMEOUT)
        assert msg[0] == "ready", f"worker failed to start: {msg}"
        self.pid = msg[1]

    def call(self, name, *args, timeout=CALL_TIMEOUT):
        self.child.conn.send((name, args))
        kind, value = self.child.recv(timeout)
        assert kind == "reply", f"command {name} failed in pid {self.pid}:\n{value}"
        return value

    def exit(self):
        self.child.conn.send(("exit", ()))
        assert self.child.result() == "bye"


# Commands run inside a worker; each returns a small, picklable summary.

def _cmd_put_keys(s, prefix, n):
    keys = keys_for(prefix, n)
    rcs = [s.put(k, value_for(k, size_for(i))) for i, k in enumerate(keys)]
    return rcs


def _cmd_put_other_values(s, prefix, n):
    """Puts other values (other bytes, other sizes) under existing keys."""
    keys = keys_for(prefix, n)
    return [s.put(k, value_for(k + "#other", size_for(i + 1))) for i, k in enumerate(keys)]


def _cmd_verify(s, prefix, n, skip=()):
    """Reads every key of prefix 0..n-1 but `skip` with get, get_batch, is_exist,
    batch_is_exist, get_size; returns human-readable problems (empty: all is well)."""
    problems = []
    keys, expected = [], []
    for i, k in enumerate(keys_for(prefix, n)):
        if k not in skip:
            keys.append(k)
            expected.append(value_for(k, size_for(i)))
    for k, v in zip(keys, expected):
        got = s.get(k)
        if got != v:
            problems.append(f"get({k}): {len(got)} bytes, expected {len(v)}"
                            f"{' (content differs)' if len(got) == len(v) else ''}")
        if s.is_exist(k) != 1:
            problems.append(f"is_exist({k}) = {s.is_exist(k)}")
        if s.get_size(k) != len(v):
            problems.append(f"get_size({k}) = {s.get_size(k)}, expected {len(v)}")
    batch = s.get_batch(keys)
    if len(batch) != len(keys):
        problems.append(f"get_batch returned {len(batch)} values for {len(keys)} keys")
    for k, v, got in zip(keys, expected, batch):
        if got != v:
            problems.append(f"get_batch[{k}]: {len(got)} bytes, expected {len(v)}")
    ex = s.batch_is_exist(keys)
    if ex != [1] * len(keys):
        problems.append(f"batch_is_exist: {ex}")
    return problems


def _cmd_verify_absent(s, keys):
    problems = []
    for k in keys:
        if s.get(k) != b"":
            problems.append(f"get({k}) returned data after remove")
        if s.is_exist(k) != 0:
            problems.append(f"is_exist({k}) = {s.is_exist(k)} after remove")
        if s.get_size(k) != OBJECT_NOT_FOUND:
            problems.append(f"get_size({k}) = {s.get_size(k)} after remove")
    if s.get_batch(keys) != [b""] * len(keys):
        problems.append("get_batch returned data for removed keys")
    if s.batch_is_exist(keys) != [0] * len(keys):
        problems.append(f"batch_is_exist of removed keys: {s.batch_is_exist(keys)}")
    return problems


def _cmd_remove(s, keys):
    # force: the other process's reads granted leases on these objects.
    return [s.remove(k, force=True) for k in keys]


def _cmd_batch_remove(s, keys):
    return s.batch_remove(keys, force=True)


COMMANDS = {
    "put_keys": _cmd_put_keys,
    "put_other_values": _cmd_put_other_values,
    "verify": _cmd_verify,
    "verify_absent": _cmd_verify_absent,
    "remove": _cmd_remove,
    "batch_remove": _cmd_batch_remove,
}


N_KEYS = 40


def test_two_processes_see_each_others_puts_and_removes(master, children):
    a = Worker(children, master.address)
    b = Worker(children, master.address)
    assert a.pid != b.pid != os.getpid()

    # A writes, B reads (sizes 1 B .. 1 MiB, bytes derived from the key).
    assert a.call("put_keys", "a/", N_KEYS) == [0] * N_KEYS
    assert b.call("verify", "a/", N_KEYS) == []
    # The reverse direction.
    assert b.call("put_keys", "b/", N_KEYS) == [0] * N_KEYS
    assert a.call("verify", "b/", N_KEYS) == []
    # A put by the other process of an existing key returns 0 and keeps the first value.
    assert b.call("put_other_values", "a/", N_KEYS) == [0] * N_KEYS
    assert a.call("verify", "a/", N_KEYS) == []
    assert b.call("verify", "a/", N_KEYS) == []

    # Removes by one process are seen by the other, both ways.
    gone_a = keys_for("a/", N_KEYS)[: N_KEYS // 2]
    assert a.call("remove", gone_a) == [0] * len(gone_a)
    assert b.call("verify_absent", gone_a) == []
    gone_b = keys_for("b/", N_KEYS)[::2]
    assert a.call("batch_remove", gone_b) == [0] * len(gone_b)
    assert b.call("verify_absent", gone_b) == []
    assert a.call("verify_absent", gone_b) == []
    # The rest is intact in both.
    rest_b = keys_for("b/", N_KEYS)[1::2]
    for w in (a, b):
        assert w.call("verify_absent", gone_a) == []
        assert w.call("verify", "a/", N_KEYS, set(gone_a)) == []
        assert w.call("verify", "b/", N_KEYS, set(gone_b)) == []
    for k in rest_b:
        assert b.call("remove", [k]) == [0]
    assert a.call("verify_absent", rest_b) == []

    # The parent, a third client, sees the same pool.
    s = connect(master)
    try:
        assert s.is_exist("b/1") == 0
        assert s.get(f"a/{N_KEYS - 1}") == value_for(f"a/{N_KEYS - 1}", size_for(N_KEYS - 1))
    finally:
        s.close()
    a.exit()
    b.exit()


# --------------------------------------------------------------------------
# 2. Two processes put the same keys at the same moment.

RACE_KEYS = 200
RACE_SIZES = [100, 4096, 65536, 300_000]


def race_value(key, writer):
    """Writer `writer`'s candidate for `key` ("race/<i>"): sizes differ between
    the writers, so a mix of the two would show."""
    index = int(key.rsplit("/", 1)[1])
    size = RACE_SIZES[index % len(RACE_SIZES)] + 17 * writer
    return value_for(f"{key}|writer{writer}", size)


def _race_writer(conn, address, writer, barrier, n, op):
    s = open_store(address)
    try:
        rcs, seen = [], []
        values = [race_value(f"race/{i}", writer) for i in range(n)]  # built before the race
        do = s.put if op == "put" else s.upsert
        for i in range(n):
            barrier.wait(CALL_TIMEOUT)
            rcs.append(do(f"race/{i}", values[i]))
            barrier.wait(CALL_TIMEOUT)  # both calls have returned: no write of this key in flight
            # What this process reads now: a digest (b"" would be a lost write).
            seen.append(hashlib.sha256(s.get(f"race/{i}")).hexdigest())
        return rcs, seen
    finally:
        s.close()


@pytest.mark.parametrize("op", ["put", "upsert"])
def test_same_key_race_keeps_one_intact_value_and_leaks_nothing(master, children, op):
    """Both processes put (or upsert) each key at the same moment (a Barrier per key).
    Every call returns 0; one of the two values is stored, intact; once both
    calls have returned, every process reads that value (no write is in flight,
    so the value may not change afterwards); one object per key; no space leak."""
    s = connect(master)
    try:
        baseline = baseline_fill(s)
        barrier = SPAWN.Barrier(2)
        writers = [children(_race_writer, master.address, w, barrier, RACE_KEYS, op) for w in (0, 1)]
        results = [w.result() for w in writers]
        for w, (rcs, _) in enumerate(results):
            bad = [(i, rc) for i, rc in enumerate(rcs) if rc != 0]
            assert not bad, f"writer {w}: {op} calls that did not return 0 (key index, rc): {bad[:10]}"
        winners = [0, 0]
        changed = []
        for i in range(RACE_KEYS):
            key = f"race/{i}"
            got = s.get(key)
            candidates = [race_value(key, 0), race_value(key, 1)]
            assert got in candidates, (
                f"{key}: stored value ({len(got)} bytes) is neither candidate "
                f"({len(candidates[0])} / {len(candidates[1])} bytes): torn or lost")
            winners[candidates.index(got)] += 1
            digest = hashlib.sha256(got).hexdigest()
            for w in (0, 1):
                if results[w][1][i] != digest:
                    earlier = [c for c in candidates if hashlib.sha256(c).hexdigest() == results[w][1][i]]
                    changed.append((key, w, f"candidate {candidates.index(earlier[0])}" if earlier
                                    else "neither candidate"))
        print(f"same-key {op} race: writer 0 won {winners[0]} keys, writer 1 won {winners[1]}")
        assert sum(winners) == RACE_KEYS
        # One object per key, not two.
        assert s.remove_all(force=True) == RACE_KEYS
        assert_no_leak(s, baseline, f"the same-key {op} race")
        # Checked last so that a failure here does not hide the checks above.
        assert not changed, (
            f"{op} race: {len(changed)} reads, made after both {op} calls of the key had returned, "
            f"saw a value other than the one the key holds afterwards (no write was in flight "
            f"in between, so the value changed by itself: not linearizable). "
            f"(key, reading writer, value it read) e.g. {changed[:5]}. Likely cause: PutStart of an "
            f"upsert flags only COMPLETE entries of the key kFlagSuperseded, not a concurrent upsert's "
            f"WRITING entry, and FindComplete stops at the first COMPLETE entry without that flag, so "
            f"the older generation is returned until the master's next Tick unlinks it.")
    finally:
        s.close()


# --------------------------------------------------------------------------
# 3. No torn reads while writers put / upsert / remove the same few keys.

TORN_KEYS = [f"torn/{i}" for i in range(16)]
READER_ITERS = 3000
WRITER_MAX_ITERS = 200_000  # a bound, not expected to be reached: readers stop writers
HDR = struct.Struct("<QQQ")  # total length, writer id, sequence number
DIGEST = 32


def make_checked(key, writer, seq, size, block, rnd):
    body_len = size - HDR.size - DIGEST
    off = rnd.randrange(0, len(block) - body_len)
    head = HDR.pack(size, writer, seq) + block[off:off + body_len]
    return head + hashlib.sha256(key.encode() + head).digest()


def check_value(key, v):
    """None when `v` is intact, else why not."""
    if len(v) < HDR.size + DIGEST:
        return f"{len(v)} bytes: shorter than any value written"
    total, writer, seq = HDR.unpack_from(v)
    if total != len(v):
        return f"length field {total} but {len(v)} bytes read (writer {writer} seq {seq})"
    if hashlib.sha256(key.encode() + v[:-DIGEST]).digest() != v[-DIGEST:]:
        return f"checksum mismatch ({len(v)} bytes, writer {writer} seq {seq})"
    return None


def _torn_writer(conn, address, writer, ready, stop):
    s = open_store(address)
    rnd = random.Random(1000 + writer)
    block = rnd.randbytes(512 * KiB)
    counts = {"put": 0, "upsert": 0, "remove": 0}
    bad_rcs = []
    try:
        seq = 0
        for key in TORN_KEYS:  # populate so that readers hit from the start
            seq += 1
            rc = s.upsert(key, make_checked(key, writer, seq, rnd.randint(64, 256 * KiB), block, rnd))
            if rc != 0:
                bad_rcs.append(("upsert", key, rc))
        ready.set()
        for _ in range(WRITER_MAX_ITERS):
            if stop.is_set():
                break
            key = rnd.choice(TORN_KEYS)
            op = rnd.random()
            seq += 1
            if op < 0.25:
                rc = s.remove(key, force=True)
                counts["remove"] += 1
                if rc not in (0, OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY):
                    bad_rcs.append(("remove", key, rc))
            else:
                size = rnd.choice([64, 65, 1000, 4096, 65536, 256 * KiB, rnd.randint(64, 256 * KiB)])
                v = make_checked(key, writer, seq, size, block, rnd)
                if op < 0.6:
                    rc = s.upsert(key, v)
                    counts["upsert"] += 1
                    if rc != 0:
                        bad_rcs.append(("upsert", key, rc))
                else:
                    rc = s.put(key, v)
                    counts["put"] += 1
                    if rc != 0:
                        bad_rcs.append(("put", key, rc))
        return counts, bad_rcs[:20], len(bad_rcs)
    finally:
        ready.set()
        s.close()


def _torn_reader(conn, address, reader, ready_events, iters):
    s = open_store(address)
    rnd = random.Random(2000 + reader)
    hits = misses = 0
    corrupt = []
    try:
        for ev in ready_events:
            if not ev.wait(CALL_TIMEOUT):
                raise RuntimeError("writers never became ready")
        for i in range(iters):
            if i % 10 == 9:
                keys = rnd.sample(TORN_KEYS, 4)
                values = s.get_batch(keys)
            else:
                keys = [rnd.choice(TORN_KEYS)]
                values = [s.get(keys[0])]
            for k, v in zip(keys, values):
                if v == b"":
                    misses += 1
                    continue
                why = check_value(k, v)
                if why is None:
                    hits += 1
                else:
                    corrupt.append(f"{k}: {why}")
        return hits, misses, corrupt[:20], len(corrupt)
    finally:
        s.close()


def test_no_torn_reads_under_concurrent_put_upsert_remove(master, children):
    ready = [SPAWN.Event(), SPAWN.Event()]
    stop = SPAWN.Event()
    # Readers first: they spawn while writers spawn, then wait for the writers.
    readers = [children(_torn_reader, master.address, r, ready, READER_ITERS) for r in (0, 1)]
    writers = [children(_torn_writer, master.address, w, ready[w], stop) for w in (0, 1)]
    try:
        reader_results = [r.result() for r in readers]
    finally:
        stop.set()
    writer_results = [w.result() for w in writers]

    for w, (counts, bad, nbad) in enumerate(writer_results):
        assert nbad == 0, f"writer {w}: {nbad} unexpected return codes, e.g. {bad}"
        assert counts["put"] + counts["upsert"] > 0, f"writer {w} did nothing: {counts}"
    total_hits = 0
    for r, (hits, misses, corrupt, ncorrupt) in enumerate(reader_results):
        assert ncorrupt == 0, (
            f"reader {r}: {ncorrupt} torn/corrupt reads out of {hits + misses + ncorrupt}, e.g. {corrupt}")
        total_hits += hits
        print(f"reader {r}: {hits} hits, {misses} misses; writers: {[x[0] for x in writer_results]}")
    assert total_hits > 0, f"readers never hit: {reader_results}"

    # What is left is intact too, as seen from a third process.
    s = connect(master)
    try:
        for k in TORN_KEYS:
            v = s.get(k)
            assert v == b"" or check_value(k, v) is None, f"{k}: {check_value(k, v)}"
    finally:
        s.close()
