"""Remove latency with the SSD tier: disk-resident keys (the client waits for
its tombstone to be written) against pool-only keys (no ticket, no wait), and
one batch_remove of 100 disk-resident keys (group commit).

    cd /tmp && python -m mooncake_cxl.bench.tier_remove_latency [--tier-parent DIR]

A 32 MiB pool is filled three times over with 64 KiB values on a master with
--offload_on_evict, so most keys end up on disk only.
"""
import argparse
import os
import shutil
import statistics
import sys
import time
import uuid

from ..launch import MasterProcess
from . import common

SIZE = 64 * common.KIB
POOL = 32 * common.MIB
TIMED = 300      # single removes per kind
BATCH = 100      # keys of the one batch_remove
WAIT_S = 60      # for the tier to hold TIMED + BATCH keys


def _disk_resident(s, keys):
    out = []
    for k in keys:
        d = s.get_replica_desc(k)
        if d and d[0].is_disk_replica():
            out.append(k)
    return out


def _latencies_us(s, keys):
    out = []
    for k in keys:
        t0 = time.perf_counter()
        rc = s.remove(k, True)
        out.append((time.perf_counter() - t0) * 1e6)
        if rc != 0:
            raise RuntimeError(f"remove({k!r}) returned {rc}")
    out.sort()
    return len(out), statistics.median(out), out[int(0.99 * len(out))], statistics.mean(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mooncake_cxl.bench.tier_remove_latency",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--tier-parent", default=common.default_pool_dir(),
                    help="directory the tier directory is made in (default MC_CXL_BENCH_POOL_DIR or /dev/shm)")
    args = ap.parse_args(argv)
    tier = os.path.join(args.tier_parent, f"mcxl_tier_{uuid.uuid4().hex}")
    flags = ["--enable_offload", f"--root_fs_dir={tier}", "--offload_on_evict"]
    try:
        with common.temp_pool("mcxl_tier_remove") as pool, \
                MasterProcess(pool, POOL, format=True, extra_flags=flags, log_path=os.devnull) as m:
            s = common.connect(m.address)
            keys = [f"k{i}" for i in range(3 * POOL // SIZE)]
            for i, k in enumerate(keys):
                s.put(k, common.value(SIZE, i))
            # Offload runs in the background: wait until the tier holds enough keys.
            deadline = time.monotonic() + WAIT_S
            disk = _disk_resident(s, keys)
            while len(disk) < TIMED + BATCH and time.monotonic() < deadline:
                time.sleep(0.2)
                disk = _disk_resident(s, keys)
            if len(disk) < TIMED + BATCH:
                sys.exit(f"only {len(disk)} keys reached the tier within {WAIT_S} s")
            on_disk = set(disk)
            pool_only = [k for k in keys if k not in on_disk]
            print("disk-resident remove: n=%d p50=%.1f us p99=%.1f us mean=%.1f us"
                  % _latencies_us(s, disk[:TIMED]))
            print("pool-only remove:     n=%d p50=%.1f us p99=%.1f us mean=%.1f us"
                  % _latencies_us(s, pool_only[:TIMED]))
            batch = disk[TIMED:TIMED + BATCH]
            t0 = time.perf_counter()
            s.batch_remove(batch, True)
            dt = (time.perf_counter() - t0) * 1e6
            print(f"batch_remove of {len(batch)} disk-resident keys: {dt:.1f} us ({dt / len(batch):.1f} us/key)")
            s.close()
    finally:
        shutil.rmtree(tier, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
