"""Mooncake 0.3.13's SSD offload, measured in the same run as ours (the
Mooncake rows of python -m mooncake_cxl.bench --only tiering).

The reference (the wheel mooncake-transfer-engine-non-cuda 0.3.13.post1)
runs in a child process inside a private loopback-only network namespace
(`unshare -n`, as --compare does: its client binds 0.0.0.0). Its master gets
--enable_offload --offload_on_evict --promotion_on_hit
--promotion_admission_threshold=2 --root_fs_dir=<dir>; its client
setup(..., enable_ssd_offload=True, ssd_offload_path=<dir>) with
MOONCAKE_OFFLOAD_FILE_STORAGE_PATH=<dir>. What it needs here (measured):

  * --root_fs_dir: without it the client's FileStorage never offloads and
    every put past the watermark returns -200 (NO_AVAILABLE_HANDLE);
  * MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT / _BUCKET_SIZE_LIMIT_BYTES below the
    defaults (500 keys / 256 MiB): else its bucket backend never flushes, the
    master logs "[EVICT] No memory freed this cycle; N objects deferred for
    disk offload" every cycle, and puts past the watermark return -200 for
    good;
  * MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS=1 (default 10): offload and
    promotion run on that heartbeat.

Per value size: a segment (its pool) of a few dozen values is filled 1.5x
over with retries of -200 (puts at the watermark fail until the next offload
heartbeat frees memory); then get_into of values with a MEMORY replica
("pool"), of LOCAL_DISK-only values after posix_fadvise(DONTNEED) of every
file under the tier directory ("tier"; get_offload_rpc_read_count checks
that each was a disk read), and the promotion time: from the read that
crosses the admission threshold until get_replica_desc shows a MEMORY
replica (polled every 10 ms). Then 64 KiB puts at the watermark with offload
on eviction against the same puts on a master without offload (eviction
drops), same sizes.
"""
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from . import common, reference
from .common import KIB, MIB

SIZES = (64 * KIB, MIB, 16 * MIB)
THRESHOLD = 2
_MARK = "MCXL_TIERING_REF_RESULT "


def _segment(size):
    # a pool of 24..256 values, at least 16 MiB; 16 MiB values: 128 MiB
    return max(16 * MIB, min(256 * size, 128 * MIB))


def _env(size):
    return {"MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": "10",
            "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES": str(max(10 * MIB, 2 * size)),
            "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1"}


# ---------------------------------------------------------------- parent side

def skip_reason():
    """None when the reference can run here, else why not."""
    return reference.netns_skip_reason("its client")


def run(quick=False, tier_root="/var/tmp"):
    why = skip_reason()
    if why:
        print(f"Mooncake tiering rows skipped: {why}", flush=True)
        return {"skipped": why}
    return reference.run_child_in_netns(
        "mooncake_cxl.bench.tiering_ref", {"quick": quick, "tier_root": tier_root},
        _MARK, "Mooncake tiering rows", timeout=1800)


# ---------------------------------------------------------------- child side

def _client(address, segment, tier_dir=None):
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    args = [f"127.0.0.1:{common.free_port()}", "P2PHANDSHAKE", segment, 64 * MIB, "tcp", "", address]
    rc = s.setup(*args, None, True, tier_dir) if tier_dir else s.setup(*args)
    if rc != 0:
        raise RuntimeError(f"reference setup failed with {rc}")
    return s


def _put(s, key, value, timeout=20):
    """put, retrying -200 (the reference's puts at the watermark fail until
    its next offload heartbeat frees memory). Returns (rc, retries)."""
    deadline = time.monotonic() + timeout
    retries = 0
    while True:
        rc = s.put(key, value)
        if rc != -200 or time.monotonic() > deadline:
            return rc, retries
        retries += 1
        time.sleep(0.01)


def _kinds(s, key):
    return ["M" if r.is_memory_replica() else "T" if r.is_local_disk_replica() else "D"
            for r in s.get_replica_desc(key)]


def _drop_cache(tier_dir):
    for p in glob.glob(os.path.join(tier_dir, "**"), recursive=True):
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _flags(tier_dir):
    return ["--enable_offload", "--offload_on_evict", "--promotion_on_hit",
            f"--promotion_admission_threshold={THRESHOLD}", f"--root_fs_dir={tier_dir}"]


def _reads(size, quick, tier_root, logdir):
    import numpy as np
    segment = _segment(size)
    tier_dir = tempfile.mkdtemp(prefix="mcref_bench_tier_", dir=tier_root)
    saved = common.set_environ(dict(_env(size), MOONCAKE_OFFLOAD_FILE_STORAGE_PATH=tier_dir))
    m = reference.ReferenceMaster(os.path.join(logdir, f"master_{size}.log"), _flags(tier_dir)).start()
    try:
        s = _client(m.address, segment, tier_dir)
        value = os.urandom(size)
        n = int(1.5 * segment // size) + 2
        acked, failed, retries = [], 0, 0
        t0 = time.perf_counter()
        for i in range(n):
            rc, r = _put(s, f"v{i}", value)
            retries += r
            if rc == 0:
                acked.append(f"v{i}")
            else:
                failed += 1
        fill_s = time.perf_counter() - t0
        time.sleep(2.5)  # two offload heartbeats
        kinds = {k: _kinds(s, k) for k in acked}  # (its get_replica_desc counts toward admission)
        disk = [k for k in acked if kinds[k] and "M" not in kinds[k] and "T" in kinds[k]]
        pool = [k for k in reversed(acked) if "M" in kinds[k]]
        buf = np.empty(size, dtype=np.uint8)
        assert s.register_buffer(buf.ctypes.data, size) == 0
        reps = 3 if quick else (10 if size < 16 * MIB else 4)
        t_pool = []
        for k in pool[:reps]:
            t1 = time.perf_counter()
            rc = s.get_into(k, buf.ctypes.data, size)
            dt = time.perf_counter() - t1
            if rc == size:
                t_pool.append(dt)
        # Promotion: the read that crosses the threshold, then poll for MEMORY.
        t_promo, promo_fail = [], 0
        n_promo = 1 if quick else 2
        for k in disk[:n_promo]:
            assert s.get_into(k, buf.ctypes.data, size) == size
            t1 = time.perf_counter()
            while time.perf_counter() - t1 < 30 and "M" not in _kinds(s, k):
                time.sleep(0.01)
            if "M" in _kinds(s, k):
                t_promo.append(time.perf_counter() - t1)
            else:
                promo_fail += 1
        t_disk, not_disk, ok = [], 0, True
        for k in disk[n_promo:n_promo + reps]:
            _drop_cache(tier_dir)
            c0 = s.get_offload_rpc_read_count()
            t1 = time.perf_counter()
            rc = s.get_into(k, buf.ctypes.data, size)
            dt = time.perf_counter() - t1
            if rc == size and s.get_offload_rpc_read_count() == c0 + 1:
                t_disk.append(dt)
            else:
                not_disk += 1
            ok = ok and buf.tobytes() == value
        s.unregister_buffer(buf.ctypes.data)
        s.close()
        med = statistics.median
        return {"size": size, "segment": segment, "puts": n, "acked": len(acked), "failed_puts": failed,
                "put_retries": retries, "fill_s": fill_s, "disk_only": len(disk), "bytes_ok": ok,
                "pool_us": med(t_pool) * 1e6 if t_pool else None,
                "tier_us": med(t_disk) * 1e6 if t_disk else None,
                "promotion_ms": med(t_promo) * 1e3 if t_promo else None,
                "n_pool": len(t_pool), "n_tier": len(t_disk), "n_promo": len(t_promo),
                "not_disk_reads": not_disk, "promotion_timeouts": promo_fail}
    finally:
        m.stop()
        common.restore_environ(saved)
        shutil.rmtree(tier_dir, ignore_errors=True)


def _put_rate(address, segment, offload_dir, n, value, prefix):
    s = _client(address, segment, offload_dir)
    try:
        retries = failed = 0
        t0 = time.perf_counter()
        for i in range(n):
            rc, r = _put(s, f"{prefix}{i}", value)
            retries += r
            failed += rc != 0
        dt = time.perf_counter() - t0
    finally:
        s.close()
    return {"gbps": (n - failed) * len(value) / dt / 1e9, "retries": retries, "failed": failed, "seconds": dt}


def _puts(quick, tier_root, logdir):
    size = 64 * KIB
    segment = 16 * MIB
    n = int(2 * segment // size)  # every put past the first half evicts
    value = os.urandom(size)
    tier_dir = tempfile.mkdtemp(prefix="mcref_bench_tier_", dir=tier_root)
    out = {"size": size, "segment": segment, "puts": n}
    try:
        m = reference.ReferenceMaster(os.path.join(logdir, "master_plain.log")).start()
        try:
            out["without"] = _put_rate(m.address, segment, None, n, value, "p")
        finally:
            m.stop()
        saved = common.set_environ(dict(_env(size), MOONCAKE_OFFLOAD_FILE_STORAGE_PATH=tier_dir))
        m = reference.ReferenceMaster(os.path.join(logdir, "master_offload.log"), _flags(tier_dir)).start()
        try:
            out["with"] = _put_rate(m.address, segment, tier_dir, n, value, "p")
        finally:
            m.stop()
            common.restore_environ(saved)
    finally:
        shutil.rmtree(tier_dir, ignore_errors=True)
    out["slowdown"] = 1 - out["with"]["gbps"] / out["without"]["gbps"] if out["without"]["gbps"] else None
    return out


def _child(cfg):
    reference.bring_loopback_up()
    logdir = tempfile.mkdtemp(prefix="mcref_bench_logs_")
    result = {"reads": [], "logdir": logdir}
    for size in SIZES:
        print(f"reference tiering: {size} B values", file=sys.stderr, flush=True)
        result["reads"].append(_reads(size, cfg["quick"], cfg["tier_root"], logdir))
    result["puts"] = _puts(cfg["quick"], cfg["tier_root"], logdir)
    print(_MARK + json.dumps(result), flush=True)


# ---------------------------------------------------------------- markdown

def markdown(r):
    size = common.size_name

    def num(x, fmt="{:.0f}"):
        return "n/a" if x is None else fmt.format(x)
    if "skipped" in r:
        return f"Mooncake 0.3.13 rows: not run: {r['skipped']}"
    lines = ["Mooncake 0.3.13.post1 (the wheel), same run, in a loopback-only network namespace: master "
             "`--enable_offload --offload_on_evict --promotion_on_hit --promotion_admission_threshold=2 "
             "--root_fs_dir=DIR`, client `enable_ssd_offload=True`, `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH=DIR`, "
             "`MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT=10`, `MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES=max(10 MiB, "
             "2x value)`, `MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS=1` (with the default bucket limits it "
             "never offloads here: puts past the watermark return -200 for good). Tier files dropped from the "
             "page cache with posix_fadvise before every tier read; each tier read moved "
             "get_offload_rpc_read_count by one.", "",
             "| value | Mooncake pool get_into µs | GB/s | Mooncake tier get_into µs | GB/s | "
             "promotion on hit (crossing read → MEMORY replica) ms | fill: puts acked / -200 retries |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for x in r["reads"]:
        def gbps(us):
            return None if us is None else x["size"] / us / 1e3
        lines.append(f"| {size(x['size'])} | {num(x['pool_us'])} | {num(gbps(x['pool_us']), '{:.2f}')} | "
                     f"{num(x['tier_us'])} | {num(gbps(x['tier_us']), '{:.2f}')} | {num(x['promotion_ms'])} | "
                     f"{x['acked']}/{x['puts']} in {x['fill_s']:.1f} s, {x['put_retries']} retries |")
    for x in r["reads"]:
        if not x["bytes_ok"] or x["not_disk_reads"] or x["promotion_timeouts"]:
            lines.append(f"\n{size(x['size'])}: tier reads with wrong bytes: {not x['bytes_ok']}; reads not "
                         f"served from disk: {x['not_disk_reads']}; promotions not seen within 30 s: "
                         f"{x['promotion_timeouts']}.")
    p = r["puts"]
    sd = "n/a" if p["slowdown"] is None else f"{p['slowdown'] * 100:.0f}%"
    lines += ["", f"| Mooncake: {size(p['size'])} puts at the watermark ({p['puts']} into a "
              f"{p['segment'] // MIB} MiB segment, -200 retried) | GB/s | -200 retries |", "|---|---:|---:|",
              f"| no offload (eviction drops) | {p['without']['gbps']:.3f} | {p['without']['retries']} |",
              f"| offload on eviction | {p['with']['gbps']:.3f} | {p['with']['retries']} |",
              f"| put slowdown while offload runs | {sd} | |"]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]))
    else:
        r = run(quick="--quick" in sys.argv, tier_root=os.environ.get("MC_CXL_BENCH_TIER_DIR", "/var/tmp"))
        print(markdown(r))
