"""Conformance of the SSD tier: the behaviours ours and Mooncake's
store (the reference wheel 0.3.13.post1, see oracle.py) share, each test
parametrized over both.

Both run the same master flags: --enable_offload --offload_on_evict
--promotion_on_hit --promotion_admission_threshold=2 --root_fs_dir=<dir>, and
a client set up with enable_ssd_offload=True and the same directory
(ssd_offload_path and MOONCAKE_OFFLOAD_FILE_STORAGE_PATH). One store per
implementation for the module (the reference's fill takes ~20 s): 8 small
values below the watermark, then 48 values of 1 MiB into a 32 MiB pool
(segment), so the older ones are evicted to the tier.

What the reference needs on this machine (measured; mooncake_cxl/bench/tiering_ref.py says the same):
  * --root_fs_dir on its master: without it its client's FileStorage never
    offloads, memory is never freed and every put past the watermark returns
    -200;
  * MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT / _BUCKET_SIZE_LIMIT_BYTES small (10 /
    10 MiB; defaults 500 keys / 256 MiB): else its bucket backend never
    flushes, the master logs "N objects deferred for disk offload" forever and
    puts past the watermark return -200;
  * MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS=1 (default 10 s) so offload
    and promotion run within seconds.
Its puts at the watermark return -200 until the next offload heartbeat frees
memory (ours waits instead); the fill retries them, and only acknowledged
values are checked.

Differences, asserted per implementation where they show:
  * the reference's --root_fs_dir also persists every put as a DISK replica
    (is_disk_replica()), below the watermark too; its offload tier is the
    LOCAL_DISK replica (is_local_disk_replica()). Ours reports one disk
    replica for which both predicates hold. Tier membership is therefore
    asserted with is_local_disk_replica().
  * the reference's get_replica_desc counts toward the promotion admission
    (and grants a lease); ours counts reads only.

The reference half runs inside `unshare -n` like the rest of the oracle suite
(scripts/run_tests.sh; oracle.NETNS_COMMAND with this file).
"""
import os
import shutil
import tempfile
import time
import uuid

import numpy as np
import pytest

import oracle
from conftest import metric, poll, wait_until

IMPLS = ["mooncake_cxl", "mooncake"]
MIB = 1 << 20
POOL = 32 * MIB
SIZE = MIB
N = 48
N_SMALL = 8
THRESHOLD = 2
REF_ENV = {"MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": "10",
           "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES": str(10 * MIB),
           "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1"}

_REF_SKIP = oracle.reference_skip_reason()


def master_flags(tier_dir):
    return ["--enable_offload", "--offload_on_evict", "--promotion_on_hit",
            f"--promotion_admission_threshold={THRESHOLD}", f"--root_fs_dir={tier_dir}"]


def kinds(store, key):
    """'M' memory, 'T' the offload tier (LOCAL_DISK), 'D' another disk replica."""
    out = []
    for r in store.get_replica_desc(key):
        out.append("M" if r.is_memory_replica() else "T" if r.is_local_disk_replica()
                   else "D" if r.is_disk_replica() else "?")
    return tuple(out)


class Tiered:
    """A store of one kind over a tier, filled past the watermark."""

    def __init__(self, name, store, settle):
        self.name = name
        self.store = store
        self.settle = settle        # returns once an asynchronous offload shows
        self.small = {}             # below the watermark
        self.small_kinds = {}
        self.values = {}            # acknowledged puts of the fill
        self.failed_puts = 0
        self.disk_only = []         # keys whose only replicas are on disk after the fill
        self.reads_before_fill = None

    @property
    def reference(self):
        return self.name == "mooncake"

    def fill(self):
        s = self.store
        for i in range(N_SMALL):
            k = f"small_{i}"
            self.small[k] = os.urandom(4096)
            assert s.put(k, self.small[k]) == 0
        self.settle()
        self.small_kinds = {k: kinds(s, k) for k in self.small}
        self.reads_before_fill = s.get_offload_rpc_read_count()
        for i in range(N):
            k = f"fill_{i}"
            v = os.urandom(SIZE)
            # The reference: -200 until its next offload heartbeat frees memory.
            rc = poll(lambda: s.put(k, v), timeout=15, done=lambda rc: rc != -200)
            if rc == 0:
                self.values[k] = v
            else:
                self.failed_puts += 1
        self.settle()
        for k in self.values:
            kk = kinds(s, k)
            if kk and "M" not in kk and "T" in kk:
                self.disk_only.append(k)


def _filled(name, module, master, tier_dir, settle):
    """A store of `module` set up with enable_ssd_offload on `master`, filled."""
    s = module.MooncakeDistributedStore()
    rc = s.setup(f"127.0.0.1:{oracle.free_port()}", "P2PHANDSHAKE", POOL, 64 * MIB, "tcp", "",
                 master.address, None, True, tier_dir)
    assert rc == 0, f"{name}: setup with enable_ssd_offload failed: {rc}; {master.log_tail()}"
    t = Tiered(name, s, settle=settle)
    t.fill()
    return t


@pytest.fixture(scope="module", params=IMPLS)
def tiered(request, tmp_path_factory):
    name = request.param
    tier_dir = tempfile.mkdtemp(prefix="mcxl_conf_tier_", dir="/dev/shm" if name == "mooncake_cxl" else "/var/tmp")
    try:
        if name == "mooncake_cxl":
            from mooncake_cxl.launch import MasterProcess
            pool = f"/dev/shm/mcxl_conf_tier_pool_{uuid.uuid4().hex}"
            m = MasterProcess(pool, POOL, format=True, extra_flags=master_flags(tier_dir),
                              log_path=str(tmp_path_factory.mktemp("tier_ours") / "master.log")).start()
            try:
                def drained():
                    wait_until(lambda: metric(m, "mooncake_cxl_tier_queue") == 0,
                               "the tier thread to drain its queue", master=m)

                t = _filled(name, oracle.ours_module(), m, tier_dir, settle=drained)
                yield t
                t.store.close()
            finally:
                m.stop()
                for p in (pool, pool + ".lock"):
                    if os.path.exists(p):
                        os.unlink(p)
        else:
            if _REF_SKIP:
                pytest.skip(_REF_SKIP)
            m = oracle.ReferenceMaster(log_path=str(tmp_path_factory.mktemp("tier_ref") / "master.log"),
                                       extra_flags=master_flags(tier_dir))
            m.start()
            saved = {k: os.environ.get(k) for k in list(REF_ENV) + ["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"]}
            os.environ.update(REF_ENV, MOONCAKE_OFFLOAD_FILE_STORAGE_PATH=tier_dir)
            try:
                # The reference shows no sign of its offload heartbeat (every
                # second, REF_ENV): its fill waits out two and a half of them.
                t = _filled(name, oracle.reference_module(), m, tier_dir, settle=lambda: time.sleep(2.5))
                if not t.disk_only:
                    pytest.skip(f"the reference offloaded nothing on this machine: {len(t.values)} of {N} "
                                f"puts acknowledged, {t.failed_puts} gave -200 for 15 s; master log "
                                f"{m.log_path}: {m.log_tail()}")
                yield t
                t.store.remove_all(True)
                t.store.close()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                m.stop()
    finally:
        shutil.rmtree(tier_dir, ignore_errors=True)


def test_below_the_watermark_nothing_reaches_the_offload_tier(tiered):
    for k, kk in tiered.small_kinds.items():
        assert "M" in kk and "T" not in kk, (k, kk)
        if tiered.reference:
            assert kk == ("M", "D")  # its --root_fs_dir persistence of every put
        else:
            assert kk == ("M",)
    assert tiered.reads_before_fill == 0
    for k, v in tiered.small.items():
        assert tiered.store.get(k) == v


def test_eviction_moved_the_older_values_to_the_tier(tiered):
    # Most of the fill is past the watermark: a good share lives only on disk.
    assert len(tiered.values) >= N - 2, f"{tiered.failed_puts} puts failed"
    assert len(tiered.disk_only) >= N // 4, tiered.disk_only
    # The newest acknowledged value is still in memory.
    assert "M" in kinds(tiered.store, max(tiered.values, key=lambda k: int(k.split("_")[1])))


def test_replica_descriptors_report_a_disk_replica(tiered):
    s = tiered.store
    k = tiered.disk_only[-1]
    d = s.get_replica_desc(k)
    assert d and not any(r.is_memory_replica() for r in d)
    tier = [r for r in d if r.is_local_disk_replica()]
    assert len(tier) == 1 and tier[0].is_disk_replica() == (not tiered.reference)
    assert all(r.is_disk_replica() or r.is_local_disk_replica() for r in d)
    b = s.batch_get_replica_desc([k])
    assert list(b) == [k] and any(r.is_local_disk_replica() for r in b[k])


def test_remove_of_a_disk_resident_key_makes_it_absent(tiered):
    s = tiered.store
    k = tiered.disk_only[1]
    # force: the reference's get_replica_desc (in the fill) left a lease (-706)
    assert s.remove(k, True) == 0
    assert s.is_exist(k) == 0
    assert not s.get(k)
    assert s.get_replica_desc(k) == []


def test_upsert_of_a_disk_resident_key_returns_the_new_bytes(tiered):
    s = tiered.store
    k = tiered.disk_only[2]
    new = os.urandom(SIZE // 2)
    assert s.upsert(k, new) == 0
    assert s.get(k) == new
    assert s.get_size(k) == SIZE // 2
    assert "M" in kinds(s, k)


def test_promotion_on_hit_gives_a_memory_replica(tiered):
    s = tiered.store
    k = tiered.disk_only[0]
    before = s.get_offload_rpc_read_count()
    for _ in range(THRESHOLD):
        assert s.get(k) == tiered.values[k]
    # The first read is served from disk (the reference may promote after it,
    # since its get_replica_desc in the fill counted toward the admission).
    assert s.get_offload_rpc_read_count() >= before + 1
    wait_until(lambda: "M" in kinds(s, k), f"a MEMORY replica of {k}")
    n = s.get_offload_rpc_read_count()
    assert s.get(k) == tiered.values[k]
    assert s.get_offload_rpc_read_count() == n  # served from memory


def test_evicted_values_read_back_exact(tiered):
    s = tiered.store
    keys = [k for k in tiered.values if k not in tiered.disk_only[:3]]
    from_disk = [k for k in keys if k in tiered.disk_only][:12]
    before = s.get_offload_rpc_read_count()
    for k in from_disk:
        assert s.get(k) == tiered.values[k], k
    assert s.get_offload_rpc_read_count() >= before + len(from_disk)
    buf = np.zeros(SIZE, dtype=np.uint8)
    assert s.register_buffer(buf.ctypes.data, SIZE) == 0
    try:
        for k in keys:
            assert s.get_into(k, buf.ctypes.data, SIZE) == SIZE, k
            assert buf.tobytes() == tiered.values[k], k
    finally:
        s.unregister_buffer(buf.ctypes.data)
