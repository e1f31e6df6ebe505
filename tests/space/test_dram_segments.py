"""DRAM segments beside the pool (MC_CXL_DRAM_SEGMENT=1 and
global_segment_size > 0; docs/architecture.md §10): placement by
preferred_segment, prefer_alloc_in_same_node and the pool's high watermark;
the owner reads its segment, other clients see the key but cannot read it
(a miss, never other bytes); bad stubs are refused with a log line; races of
upsert/remove on a segment object are never torn or stale. A non-coherent
pool has no segments: setup with one is refused (MCXL_TEST_COHERENCE=noncoherent
runs only that test here)."""
import os
import struct

import pytest

from conftest import NONCOHERENT_RUN, SIM_HOSTS, connect, value_for, wait_until
from mooncake_cxl import MooncakeDistributedStore
from mooncake_cxl import ReplicateConfig
import segment_workers
from segment_workers import ask, upsert_remove_reader

OWNER = "127.0.0.1:17001"


def start_owner(children, master, stderr_path=None, segment=segment_workers.SEGMENT):
    return segment_workers.start_owner(children, master, OWNER, stderr_path, segment)


segments = pytest.mark.skipif(NONCOHERENT_RUN or SIM_HOSTS >= 2,
                              reason="a non-coherent pool has no DRAM segments (architecture.md §10)")


def test_a_non_coherent_pool_refuses_a_segment(master_factory, monkeypatch):
    """The master publishes a non-coherent pool's puts itself, as COMPLETE:
    the client refuses its segment at setup (with a log line); without one
    it connects and puts to the pool."""
    m = master_factory(extra_flags=["--coherence=noncoherent"])
    monkeypatch.setenv("MC_CXL_DRAM_SEGMENT", "1")
    s = MooncakeDistributedStore()
    assert s.setup(OWNER, "P2PHANDSHAKE", segment_workers.SEGMENT, 0, "cxl", "", m.address) != 0
    monkeypatch.delenv("MC_CXL_DRAM_SEGMENT")
    plain = connect(m)
    try:
        assert plain.put("nc-pool", b"v" * 4096) == 0
        assert plain.get_replica_desc("nc-pool")[0].read_by == "pool"
    finally:
        plain.close()


@segments
def test_preferred_segment_and_same_node_place_in_the_owner_segment(master, children):
    owner = start_owner(children, master)
    other = connect(master)
    try:
        v = value_for("seg-pref", 300_000)
        assert ask(owner, "put", "seg-pref", v, OWNER, False) == 0
        assert ask(owner, "desc", "seg-pref") == [("segment", OWNER, ask(owner, "desc", "seg-pref")[0][2], len(v))]
        assert ask(owner, "get", "seg-pref") == v
        w = value_for("seg-node", 70_000)
        assert ask(owner, "put", "seg-node", w, "", True) == 0
        assert ask(owner, "desc", "seg-node")[0][0] == "segment"
        assert ask(owner, "get", "seg-node") == w
        # Without a preference, below the watermark: the pool, readable by all.
        x = value_for("seg-none", 5000)
        assert ask(owner, "put", "seg-none", x, "", False) == 0
        assert ask(owner, "desc", "seg-none")[0][0] == "pool"
        assert other.get("seg-none") == x
        # Another client sees the segment objects but cannot read them: a miss.
        assert other.is_exist("seg-pref") == 1
        assert other.get("seg-pref") == b""
        assert other.get_replica_desc("seg-pref")[0].read_by == "segment"
        # It has no segment: the reference's refusal of prefer_alloc_in_same_node.
        c = ReplicateConfig()
        c.prefer_alloc_in_same_node = True
        assert other.put("k", b"v", c) == -600
        # Naming the owner's segment from another client: the pool (only the owner writes it).
        c = ReplicateConfig()
        c.preferred_segment = OWNER
        assert other.put("seg-foreign", b"y" * 4096, c) == 0
        assert other.get_replica_desc("seg-foreign")[0].read_by == "pool"
        assert ask(owner, "get", "seg-foreign") == b"y" * 4096
        # Removal frees it; the same key then goes to the pool.
        assert ask(owner, "remove", "seg-pref") == 0
        assert ask(owner, "exist", "seg-pref") == 0
        assert ask(owner, "put", "seg-pref", v, "", False) == 0
        assert other.get("seg-pref") == v
    finally:
        other.close()
        owner.conn.send(("exit",))
        assert owner.result() == "closed"


@segments
def test_the_pool_past_its_watermark_spills_into_the_segment(master_factory, children):
    m = master_factory(pool_size=64 << 20, extra_flags=["--eviction_high_watermark_ratio=0.5",
                                                        "--eviction_ratio=0.1"])
    owner = start_owner(children, m)
    try:
        where = []
        for i in range(60):  # 60 x 1 MiB: past half the pool
            assert ask(owner, "put", f"spill{i}", value_for(f"spill{i}", 1 << 20), "", False) == 0
            where.append(ask(owner, "desc", f"spill{i}")[0][0])
        assert where[0] == "pool" and where[-1] == "segment", where
        first = where.index("segment")
        # Nothing was evicted for them: every pool object is still there.
        for i in range(60):
            assert ask(owner, "get", f"spill{i}") == value_for(f"spill{i}", 1 << 20), (i, where[i], first)
    finally:
        owner.conn.send(("exit",))
        owner.result()


@segments
def test_a_full_segment_evicts_its_least_recently_used_objects(master, children):
    owner = start_owner(children, master, segment=8 << 20)
    try:
        n = 40  # 40 x 512 KiB in an 8 MiB segment
        for i in range(n):
            k = f"ev{i}"
            assert ask(owner, "put", k, value_for(k, 512 << 10), "", True) == 0
        # (No reads meanwhile: a read's lease protects an object from eviction.)
        assert ask(owner, "desc", f"ev{n - 1}")[0][0] == "segment"
        present = [ask(owner, "exist", f"ev{i}") for i in range(n)]
        assert present[0] == 0 and present[-1] == 1, present
        for i in range(n):
            if present[i]:
                assert ask(owner, "get", f"ev{i}") == value_for(f"ev{i}", 512 << 10), i
    finally:
        owner.conn.send(("exit",))
        owner.result()


@segments
def test_a_stub_past_the_segment_is_refused_with_a_log_line(master, children, pool_path, tmp_path):
    err = str(tmp_path / "owner.stderr")
    owner = start_owner(children, master, err)
    try:
        key = "seg-bad"
        assert ask(owner, "put", key, b"z" * 8192, OWNER, False) == 0
        read_by, _, stub_header, _ = ask(owner, "desc", key)[0]
        assert read_by == "segment"
        # SegmentStub{magic, slot, reserved, slot_generation, offset, length}
        # after the ObjectHeader (80 B) and key, rounded up to 64 bytes.
        at = stub_header + (80 + len(key) + 63) // 64 * 64
        with open(pool_path, "r+b") as f:
            f.seek(at + 24)
            f.write(struct.pack("<QQ", 1 << 50, 8192))
        assert ask(owner, "get", key) == b""
        wait_until(lambda: "segment stub of 'seg-bad' refused" in open(err).read(), "the refusal's log line")
        # The store stays usable.
        assert ask(owner, "put", "after", b"ok" * 100, OWNER, False) == 0
        assert ask(owner, "get", "after") == b"ok" * 100
    finally:
        owner.conn.send(("exit",))
        owner.result()


@segments
def test_upsert_and_remove_race_on_a_segment_object_is_never_torn_or_stale(master, children):
    c = children(upsert_remove_reader, master.address, OWNER, 400, 64 << 10)  # 25 MiB: never fills the segment
    errors, (hits, misses), desc = c.result()
    assert errors == []
    assert hits > 0, (hits, misses)
    assert desc == ["segment"]
