"""Space freed by removes is reusable at any object size (the allocator
coalesces), and a value that can never fit fails cleanly with -200.

Pools are 64 MiB. Fills use hard-pinned objects so that eviction, should the
master evict on a failed allocation, cannot make room and hide the pool's
capacity.
"""

import pytest

from conftest import connect, fill, value_for



pytestmark = pytest.mark.usefixtures("no_put_wait")


KiB = 1 << 10
MiB = 1 << 20
POOL = 64 * MiB
NO_AVAILABLE_HANDLE = -200




def assert_intact(store, keys, size):
    for k in keys:
        got = store.get(k)
        assert got == value_for(k, size), f"{k}: {len(got)} bytes read, content differs from what was put"


@pytest.mark.parametrize("first,second", [(4 * MiB, 64 * KiB), (64 * KiB, 4 * MiB)],
                         ids=["4MiB-then-64KiB", "64KiB-then-4MiB"])
def test_space_freed_by_remove_all_is_reused_at_another_size(master_factory, first, second):
    m = master_factory(pool_size=POOL)
    s = connect(m)
    try:
        keys1 = fill(s, "one/", first)
        assert keys1, f"not a single {first}-byte value fits a {POOL}-byte pool"
        bytes1 = len(keys1) * first
        assert bytes1 <= POOL
        assert_intact(s, keys1, first)

        assert s.remove_all(force=True) == len(keys1)
        assert all(s.is_exist(k) == 0 for k in keys1)

        keys2 = fill(s, "two/", second)
        bytes2 = len(keys2) * second
        assert bytes2 >= 0.9 * bytes1, (
            f"after removing {len(keys1)} values of {first} bytes ({bytes1} bytes), only "
            f"{len(keys2)} values of {second} bytes fit ({bytes2} bytes, "
            f"{100 * bytes2 / bytes1:.1f}% < 90%): freed space is not reused")
        assert_intact(s, keys2, second)
        assert all(s.get(k) == b"" for k in keys1)
    finally:
        s.close()


def test_space_reuse_after_partial_removes(master_factory):
    """Free every other 1 MiB object: the holes are reused by smaller values,
    and once everything is removed a 4 MiB value fits again."""
    m = master_factory(pool_size=POOL)
    s = connect(m)
    try:
        keys = fill(s, "mid/", MiB)
        assert len(keys) >= 8
        gone, kept = keys[::2], keys[1::2]
        for k in gone:
            assert s.remove(k, force=True) == 0
        # 4 MiB cannot fit in 1 MiB holes.
        assert s.put("big", value_for("big", 4 * MiB)) == NO_AVAILABLE_HANDLE
        # Five 200 KiB extents (value + header) fit one 1 MiB extent.
        small = fill(s, "small/", 200 * KiB)
        assert len(small) * 200 * KiB >= 0.9 * len(gone) * MiB, (
            f"{len(gone)} holes of 1 MiB took only {len(small)} values of 200 KiB")
        assert_intact(s, kept, MiB)
        assert_intact(s, small, 200 * KiB)
        assert s.remove_all(force=True) == len(kept) + len(small)
        assert s.put("big", value_for("big", 4 * MiB)) == 0
        assert s.get("big") == value_for("big", 4 * MiB)
    finally:
        s.close()


def test_value_larger_than_the_pool_fails_cleanly(master_factory):
    m = master_factory(pool_size=POOL)
    s = connect(m)
    try:
        baseline = len(fill(s, "cap0/", MiB))
        assert s.remove_all(force=True) == baseline
        existing = {f"keep/{i}": value_for(f"keep/{i}", size)
                    for i, size in enumerate([1, 4096, 100_000, MiB, 3 * MiB])}
        for k, v in existing.items():
            assert s.put(k, v) == 0

        for size in (POOL + MiB, POOL, POOL - MiB):
            huge = bytes(size)  # zeros: cheap to build
            rc = s.put("huge", huge)
            assert rc == NO_AVAILABLE_HANDLE, f"put of {size} bytes into a {POOL}-byte pool returned {rc}"
            rc = s.upsert("keep/0", huge)
            assert rc == NO_AVAILABLE_HANDLE, f"upsert of {size} bytes returned {rc}"
            assert s.put_batch(["huge", "small-after-huge"], [huge, b"s"]) != 0
            del huge
        assert s.is_exist("huge") == 0
        assert s.get("huge") == b""

        # Existing objects unaffected (the failed upsert kept the old value).
        for k, v in existing.items():
            assert s.get(k) == v, f"{k} changed after a failed oversized put"
        # The store is still usable: puts, upserts, removes.
        assert s.put("after", b"still works") == 0
        assert s.get("after") == b"still works"
        assert s.upsert("keep/0", b"replaced") == 0
        assert s.get("keep/0") == b"replaced"
        assert s.remove("after", force=True) == 0
        # And the failed attempts took no space.
        assert s.remove_all(force=True) >= len(existing)
        refill = fill(s, "cap1/", MiB)
        assert abs(len(refill) - baseline) <= 1, (
            f"after oversized puts an emptied pool holds {len(refill)} objects of 1 MiB, "
            f"the fresh pool held {baseline}")
    finally:
        s.close()
