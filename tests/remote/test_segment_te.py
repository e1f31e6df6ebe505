"""DRAM segments read and written by other clients of the pod over the
Transfer Engine (docs/architecture.md §10): the owner serves its segment with
its own engine (MC_CXL_SEGMENT_TE, on by default) and names the session at
Attach; another process's reads of a segment object copy it over TE and
re-check the entry; a put whose preferred_segment names the owner is written
into its segment over TE.
Engines bind 0.0.0.0, so this runs only inside a private network namespace:

    unshare -n -- bash -c 'ip link set lo up && MCXL_ORACLE_NETNS=1 python -m pytest -q tests/remote'
"""
import os
import signal
import struct
import sys

import pytest

import oracle
from conftest import NONCOHERENT_RUN, SIM_HOSTS, connect, value_for, wait_until

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "space"))
import segment_workers  # noqa: E402
from segment_workers import ask, check_versioned  # noqa: E402

OWNER = "127.0.0.1:17101"
READER = "127.0.0.1:17102"

_SKIP = oracle.reference_skip_reason()
pytestmark = [
    pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP)),
    pytest.mark.skipif(NONCOHERENT_RUN or SIM_HOSTS >= 2,
                       reason="a non-coherent pool has no DRAM segments (architecture.md §10)"),
]


def owner_and_reader(children, master, stderr_path=None):
    owner = segment_workers.start_owner(children, master, OWNER, te=True)
    reader = segment_workers.start_owner(children, master, READER, stderr_path, segment=0, te=True)
    return owner, reader


def stop(*workers):
    for w in workers:
        if w.proc.is_alive():
            w.conn.send(("exit",))
            assert w.result() == "closed"


def test_another_process_reads_a_segment_object_over_the_transfer_engine(master, children):
    owner, reader = owner_and_reader(children, master)
    try:
        sizes = {"te/4k": 4096, "te/300k": 300_000, "te/1m": 1 << 20}
        for k, n in sizes.items():
            assert ask(owner, "put", k, value_for(k, n), "", True) == 0
            assert ask(owner, "desc", k)[0][0] == "segment"
        for k, n in sizes.items():
            assert ask(reader, "get", k) == value_for(k, n), k
        # The reader's description: over TE, from the owner's session.
        desc = ask(reader, "desc", "te/4k")
        assert desc[0][0] == "transfer_engine" and desc[0][1] == OWNER, desc
        session = ask(reader, "te_session", "te/4k")[0]
        assert session.startswith("127.0.0.1:"), session
        # Zero-copy reads into registered memory, and get_buffer (a copy).
        rc, vals = ask(reader, "get_into", ["te/300k"], 300_000)
        assert rc == [300_000] and vals[0] == value_for("te/300k", 300_000)
        keys = list(sizes)
        rc, vals = ask(reader, "batch_get_into", keys + ["te/absent"], 1 << 20)
        assert rc[:3] == [sizes[k] for k in keys] and rc[3] < 0, rc
        assert [v for v in vals[:3]] == [value_for(k, sizes[k]) for k in keys]
        _, b = ask(reader, "get_buffer", "te/1m")
        assert b == value_for("te/1m", 1 << 20)
        # The owner still reads its own directly; removal is seen by the reader.
        assert ask(owner, "desc", "te/4k")[0][0] == "segment"
        assert ask(owner, "remove", "te/4k") == 0
        assert ask(reader, "get", "te/4k") == b""
    finally:
        stop(owner, reader)


def test_owner_upserts_and_removes_while_another_process_reads_never_torn_or_stale(master, children):
    owner, reader = owner_and_reader(children, master)
    try:
        key = "te/race"
        assert ask(owner, "put", key, segment_workers.versioned(0, 64 << 10), "", True) == 0
        owner.conn.send(("churn", key, 300, 64 << 10))  # 19 MiB in all: never fills the segment
        reader.conn.send(("read_race", key, 2000))
        assert owner.recv() == []
        errors, hits, misses, top = reader.recv()
        assert errors == [] and hits > 0, (errors, hits, misses, top)
        assert check_versioned(ask(reader, "get", key)) == 300
    finally:
        stop(owner, reader)


def test_a_killed_owner_gives_misses_never_wrong_bytes_and_the_store_lives_on(master, children):
    owner, reader = owner_and_reader(children, master)
    plain = connect(master)
    try:
        seg = [f"te/dead/{i}" for i in range(8)]
        for k in seg:
            assert ask(owner, "put", k, value_for(k, 100_000), "", True) == 0
        assert ask(reader, "get", seg[0]) == value_for(seg[0], 100_000)
        os.kill(owner.proc.pid, signal.SIGKILL)
        owner.proc.join(30)
        # Before and after the master reclaims the slot: a miss, never other bytes.
        for k in seg:
            assert ask(reader, "get", k) in (b"", value_for(k, 100_000))
        wait_until(lambda: all(plain.is_exist(k) == 0 for k in seg), "the dead owner's objects to go",
                   master=master)
        assert all(ask(reader, "get", k) == b"" for k in seg)
        assert ask(reader, "put", "te/after", b"ok" * 1000, "", False) == 0
        assert plain.get("te/after") == b"ok" * 1000
    finally:
        plain.close()
        stop(reader)


def test_a_stub_past_the_owners_segment_is_refused_by_another_reader(master, children, pool_path, tmp_path):
    err = str(tmp_path / "reader.stderr")
    owner, reader = owner_and_reader(children, master, err)
    try:
        key = "te/bad"
        assert ask(owner, "put", key, b"z" * 8192, "", True) == 0
        assert ask(reader, "get", key) == b"z" * 8192
        stub_header = ask(owner, "desc", key)[0][2]
        # SegmentStub{magic, slot, reserved, slot_generation, offset, length}
        # after the ObjectHeader (80 B) and key, rounded up to 64 bytes.
        at = stub_header + (80 + len(key) + 63) // 64 * 64
        with open(pool_path, "r+b") as f:
            f.seek(at + 24)
            f.write(struct.pack("<QQ", segment_workers.SEGMENT - 4096, 8192))
        assert ask(reader, "get", key) == b""
        wait_until(lambda: "segment stub of 'te/bad' refused" in open(err).read(), "the refusal's log line")
        assert ask(owner, "put", "te/fine", b"ok" * 100, "", True) == 0
        assert ask(reader, "get", "te/fine") == b"ok" * 100
    finally:
        stop(owner, reader)


def test_the_owner_names_its_session_again_after_a_master_restart(master_factory, children):
    m1 = master_factory()
    owner, reader = owner_and_reader(children, m1)
    try:
        assert ask(owner, "put", "te/rs/old", b"o" * 9000, "", True) == 0
        assert ask(reader, "get", "te/rs/old") == b"o" * 9000
        m1.kill()
        m2 = master_factory(format=False, extra_flags=[f"--rpc_port={m1.port}"])
        # Recovery dropped the segment object; the owner re-attaches (with its
        # session) and places a new one, which the other process reads over TE.
        wait_until(lambda: ask(owner, "put", "te/rs/new", b"n" * 9000, "", True) == 0,
                   "the owner's put after the restart", master=m2)
        assert ask(reader, "get", "te/rs/old") == b""
        wait_until(lambda: ask(reader, "get", "te/rs/new") == b"n" * 9000, "the reader's TE read after the restart",
                   master=m2)
        assert ask(reader, "desc", "te/rs/new")[0][0] == "transfer_engine"
    finally:
        stop(owner, reader)


def test_a_put_naming_another_clients_segment_goes_to_the_pool(master, children):
    # Only the owner writes its segment (architecture.md §10: a revoked
    # writer elsewhere could land its bytes in the owner's next attachment).
    owner, putter = owner_and_reader(children, master)
    third = segment_workers.start_owner(children, master, "127.0.0.1:17103", segment=0, te=True)
    plain = connect(master)  # reads only pool objects here: no engine starts in this process
    try:
        for k, n in (("te/into/4k", 4096), ("te/into/1m", 1 << 20)):
            assert ask(putter, "put", k, value_for(k, n), OWNER, False) == 0
            assert ask(owner, "desc", k)[0][0] == "pool", k
            assert ask(owner, "get", k) == value_for(k, n)
            assert ask(third, "get", k) == value_for(k, n)
            assert plain.get(k) == value_for(k, n)
        # A name nobody serves: the pool.
        assert ask(putter, "put", "te/into/nobody", b"p" * 5000, "127.0.0.1:1", False) == 0
        assert ask(third, "desc", "te/into/nobody")[0][0] == "pool"
        assert plain.get("te/into/nobody") == b"p" * 5000
    finally:
        plain.close()
        stop(owner, putter, third)
