"""SGLang's set path by phase: batch_is_exist, then batch_put_from of new keys
from registered memory, beside one memcpy per part of the same bytes into a
cycled /dev/shm working set (the engines section's bound), with this
process's minor page faults per call. The master and this client have the
whole pool mapped before the first batch (prefault on, as by default).

    python -m mooncake_cxl.bench.put_phases [--keys 64] [--part-bytes 32768] [--batches 200]

(64 x 32 KiB is one SGLang batch of 32 pages of 64 KiB: K and V are two
keys a page.) Prints medians; for an A/B of two builds run each build's
python, alternating.
"""
import argparse
import os
import resource
import statistics
import time

from ..launch import MasterProcess
from . import common, pages

POOL = 1536 << 20  # the engines section's pool


def _minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run(keys=64, part_bytes=32 << 10, batches=200, pool_dir=None):
    import numpy as np
    os.environ.setdefault("MC_CXL_PREFAULT", "1")
    with common.temp_pool("mcxl_put_phases", pool_dir) as pool, MasterProcess(pool, POOL, format=True) as m:
        pages.wait_resident(m.proc.pid, pool, POOL)
        s = common.connect(m.address)
        try:
            pages.wait_resident(os.getpid(), pool, POOL)
            buf = np.random.randint(0, 256, size=keys * part_bytes, dtype=np.uint8)
            if s.register_buffer(buf.ctypes.data, keys * part_bytes) != 0:
                raise RuntimeError("register_buffer failed")
            ptrs = [buf.ctypes.data + i * part_bytes for i in range(keys)]
            sizes = [part_bytes] * keys
            pc = time.perf_counter_ns
            exist, put, exist_faults, put_faults = [], [], [], []
            for b in range(batches):
                names = [f"phases-{b}-{j}" for j in range(keys)]
                f0, t0 = _minflt(), pc()
                s.batch_is_exist(names)
                t1, f1 = pc(), _minflt()
                rc = s.batch_put_from(names, ptrs, sizes)
                t2, f2 = pc(), _minflt()
                if any(r != 0 for r in rc):
                    raise RuntimeError(f"batch_put_from: {rc}")
                exist.append(t1 - t0)
                put.append(t2 - t1)
                exist_faults.append(f1 - f0)
                put_faults.append(f2 - f1)
            bound = common.memcpy_baseline(1 << 20, 256 << 20)
            copy = [bound.run_parts(ptrs, sizes, True) for _ in range(batches)]
        finally:
            s.close()
    med = statistics.median
    return {"keys": keys, "part_bytes": part_bytes, "exist_us": med(exist) / 1e3, "put_us": med(put) / 1e3,
            "memcpy_us": med(copy) / 1e3, "exist_minflt": med(exist_faults), "put_minflt": med(put_faults)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mooncake_cxl.bench.put_phases",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--part-bytes", type=int, default=32 << 10)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--pool-dir", default=common.default_pool_dir())
    a = ap.parse_args(argv)
    r = run(a.keys, a.part_bytes, a.batches, a.pool_dir)
    over = (r["put_us"] - r["memcpy_us"]) / r["keys"]
    print(f"{r['keys']} keys x {r['part_bytes']} B: batch_is_exist {r['exist_us']:.1f} us, batch_put_from "
          f"{r['put_us']:.1f} us, memcpy of the same parts {r['memcpy_us']:.1f} us "
          f"(put beyond the copy: {over:.2f} us a key); minor faults a call: exist {r['exist_minflt']:g}, "
          f"put {r['put_minflt']:g}")


if __name__ == "__main__":
    main()
