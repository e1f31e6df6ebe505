"""The SSD tier against an unlucky operator: a tier filesystem smaller than
--offload_capacity_bytes, filled further by another program, and freed
again; a flipped bit in each tombstone block before a --format rebuild;
tier files under umask 022; a second master on the same tier directory.
Small filesystems are tmpfs mounts made here (root only, else skipped)."""
import glob
import os
import re
import struct
import subprocess
import threading
import time

import pytest

from conftest import connect, fill_fs, log_size, metrics, value_for, wait_until
from mooncake_cxl.launch import MasterError, MasterProcess
from test_tiering import disk_keys, tier_flags, tier_metric, wait_idle

POOL = 16 << 20
SIZE = 256 << 10
FS = 32 << 20
RECORD_MAGIC = b"MCXR"  # disk_tier_internal.h kRecordMagic, little-endian
KIND_TOMBSTONE = 2


@pytest.fixture
def small_fs(tier_dir):
    """tier_dir as a 32 MiB tmpfs (mode 0700: the master refuses a directory
    others may enter), unmounted afterwards."""
    os.makedirs(tier_dir)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS},mode=0700", "tmpfs", tier_dir],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip("a tmpfs cannot be mounted here (needs root)")
    yield tier_dir
    subprocess.run(["umount", "-l", tier_dir])


def tier_error_lines(text):
    return [line for line in text.splitlines() if re.search(r"\b(E|W|ERROR|WARN)\b.*\b(disk_tier|tier)\b", line)]


def put_range(s, prefix, n):
    for i in range(n):
        assert s.put(f"{prefix}{i}", value_for(f"{prefix}{i}", SIZE)) == 0


def readable_on_disk(s, prefix, n):
    """Disk-resident keys of prefix0..n-1; each one reads back intact."""
    keys = disk_keys(s, prefix, n)
    for k in keys:
        v = s.get(k)
        assert not v or v == value_for(k, SIZE), k
    return keys


def test_full_tier_filesystem_caps_degrades_and_recovers(master_factory, small_fs):
    # 1 GiB configured on a 32 MiB filesystem: the tier caps itself below it.
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(small_fs, f"--offload_capacity_bytes={1 << 30}"))
    mm = metrics(m)
    assert 16 << 20 < mm["mooncake_cxl_tier_capacity_effective_bytes"] < FS
    s = connect(m)
    n = 3 * FS // SIZE  # far more than the filesystem holds
    put_range(s, "a", n)
    wait_idle(m)
    on_disk = readable_on_disk(s, "a", n)
    # Only what the filesystem cannot hold was dropped: most of it is in use.
    fits = FS // SIZE
    assert len(on_disk) >= fits // 2, f"{len(on_disk)} of ~{fits} objects the filesystem holds are on disk"
    assert tier_metric(m, "enospc_total") == 0, "the cap kept the tier below the filesystem"
    assert tier_metric(m, "degraded") == 0

    # Another program fills the filesystem: degraded, said by the log and a gauge.
    start = log_size(m)
    filler = os.path.join(small_fs, "filler")
    fill_fs(filler)
    wait_until(lambda: tier_metric(m, "degraded") == 1, "the tier to report degraded", master=m)
    assert re.search(r"SSD tier degraded: its filesystem .* is full", m.log_tail(1 << 30)[start:])
    # Removes need tombstones: the reserve file takes the first ones, and the
    # other program takes that space too (it tops the filesystem up, as
    # compaction frees some): the tombstones wait, retried with backoff.
    for k in on_disk[:5]:
        s.remove(k, True)  # may release the reserve file (or wait for it, 10 s at most)
    fill_fs(filler)
    remover = threading.Thread(target=lambda: [s.remove(k, True) for k in on_disk[5:40]])
    remover.start()
    wait_until(lambda: fill_fs(filler) or tier_metric(m, "tombstone_retries_total") > 0,
               "a tombstone write to fail and wait for a retry", master=m)
    retries = tier_metric(m, "tombstone_retries_total")
    mark = log_size(m)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:  # the stimulus: 3 s of a full disk (topped up 5x a second)
        fill_fs(filler)
        time.sleep(0.2)
    window = time.monotonic() - t0
    lines = tier_error_lines(m.log_tail(1 << 30)[mark:])
    # At most one line a second per source (writes, tombstones, appends), never thousands.
    assert len(lines) <= 4 * window + 4, f"{len(lines)} tier log lines in {window:.1f} s: {lines[:5]}"
    assert tier_metric(m, "tombstone_retries_total") >= retries
    assert tier_metric(m, "degraded") == 1

    # Space returns: the tombstones go out, the removes return, demotion resumes.
    os.unlink(filler)
    remover.join(60)
    wait_until(lambda: tier_metric(m, "degraded") == 0, "the tier to recover", master=m)
    assert "SSD tier no longer degraded" in m.log_tail(1 << 30)[start:]
    assert not [k for k in on_disk[:40] if s.is_exist(k) == 1]
    assert s.remove_all(True) >= 0
    wait_idle(m)
    wait_until(lambda: tier_metric(m, "fs_free_bytes") > FS // 2, "compaction to give the space back", master=m)
    writes = tier_metric(m, "writes_total")
    put_range(s, "b", 100)
    wait_idle(m)
    assert tier_metric(m, "writes_total") - writes >= 30, "demotion did not resume after remove_all"
    assert len(readable_on_disk(s, "b", 100)) >= 30
    s.close()
    # A restart on the same filesystem works as well.
    m.stop()
    m2 = master_factory(pool_size=POOL, format=False, extra_flags=tier_flags(small_fs, f"--offload_capacity_bytes={1 << 30}"))
    s = connect(m2)
    writes = tier_metric(m2, "writes_total")
    put_range(s, "c", 100)
    wait_idle(m2)
    assert tier_metric(m2, "writes_total") - writes >= 30
    assert tier_metric(m2, "checksum_failures_total") == 0
    s.close()


def tombstone_blocks(tier_dir, keys):
    """(path, offset) of every tombstone block of `keys` in the segment files."""
    want = {k.encode() for k in keys}
    out = []
    for path in sorted(glob.glob(os.path.join(tier_dir, "seg-*.mcxl"))):
        with open(path, "rb") as f:
            data = f.read()
        for off in range(4096, len(data) - 64, 4096):
            if data[off:off + 4] != RECORD_MAGIC:
                continue
            kind, key_len = struct.unpack_from("<HI", data, off + 6)
            if kind == KIND_TOMBSTONE and data[off + 64:off + 64 + key_len] in want:
                out.append((path, off))
    return out


@pytest.mark.parametrize("field", [32, 60])  # a bit of the generation, of the header crc
def test_flipped_bit_in_tombstone_blocks_never_resurrects_after_format(master_factory, tier_dir, field):
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir))
    s = connect(m)
    n = 2 * POOL // SIZE
    put_range(s, "f", n)
    wait_idle(m)
    on_disk = disk_keys(s, "f", n)
    assert len(on_disk) >= 10
    removed, upserted = on_disk[:3], on_disk[3:6]
    for k in removed:
        assert s.remove(k, True) == 0
    for k in upserted:
        assert s.upsert(k, value_for("new:" + k, SIZE // 2)) == 0
    s.close()
    m.stop()
    blocks = tombstone_blocks(tier_dir, removed + upserted)
    assert len(blocks) >= 6, blocks
    for path, off in blocks:
        with open(path, "r+b") as f:
            f.seek(off + field)
            b = f.read(1)[0]
            f.seek(off + field)
            f.write(bytes([b ^ 0x10]))
    m2 = master_factory(pool_size=POOL, format=True, extra_flags=tier_flags(tier_dir))
    s = connect(m2)
    back = [k for k in removed if s.is_exist(k) == 1 or s.get(k)]
    assert not back, f"removed keys came back: {back}"
    for k in upserted:  # missing (the new value was pool-only) or the new one, never the old
        v = s.get(k)
        assert not v or v == value_for("new:" + k, SIZE // 2), f"old value of {k} came back"
    assert tier_metric(m2, "damage_dropped_records") >= len(removed) + len(upserted)
    assert re.search(r"damaged block where a record header must be", m2.log_tail(1 << 30))
    assert re.search(r"damaged blocks: dropped \d+ records", m2.log_tail(1 << 30))
    # Dropped for good: a second rebuild (the damaged blocks still there, or
    # compacted away) does not bring them back either.
    s.close()
    m2.stop()
    m3 = master_factory(pool_size=POOL, format=True, extra_flags=tier_flags(tier_dir))
    s = connect(m3)
    assert not [k for k in removed if s.get(k)]
    assert not [k for k in upserted if s.get(k) == value_for(k, SIZE)]
    s.close()


def test_tier_files_get_the_pool_mode_under_umask_022(master_factory, tier_dir):
    old = os.umask(0o022)
    try:
        m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir))
        s = connect(m)
        put_range(s, "m", 2 * POOL // SIZE)
        wait_idle(m)
        s.close()
        assert os.stat(tier_dir).st_mode & 0o777 == 0o700
        files = glob.glob(os.path.join(tier_dir, "*"))
        assert [f for f in files if f.endswith(".mcxl") and "seg-" in f]
        bad = {f: oct(os.stat(f).st_mode & 0o777) for f in files if os.stat(f).st_mode & 0o777 != 0o600}
        assert not bad, f"tier files not 0600: {bad}"
        m.stop()
        # A tier directory other users may enter is refused, as a world-readable pool is.
        os.chmod(tier_dir, 0o755)
        with pytest.raises(MasterError, match=r"refusing the SSD tier directory .* mode 0755"):
            master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir))
        master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir, "--allow_world_readable_pool"))
    finally:
        os.umask(old)


def test_second_master_on_a_tier_directory_is_refused(master_factory, tier_dir, tmp_path):
    m = master_factory(pool_size=POOL, extra_flags=tier_flags(tier_dir))
    other_pool = str(tmp_path / "pool2")
    second = MasterProcess(other_pool, POOL, format=True, extra_flags=tier_flags(tier_dir),
                           log_path=str(tmp_path / "second.log"))
    try:
        with pytest.raises(MasterError, match=rf"in use by another master \(pid {m.proc.pid} on .*, pool {m.uuid}\)"):
            second.start()
        # The first one is unaffected; once it is gone the directory is free.
        s = connect(m)
        put_range(s, "l", 2 * POOL // SIZE)
        wait_idle(m)
        assert tier_metric(m, "demotion_failures_total") == 0
        s.close()
        m.stop()
        second.start()
    finally:
        if second.proc is not None:
            second.stop()
