"""4 KiB put and ring ping medians with this process and the master pinned to
different cores. Each put is timed alone and followed by an untimed remove, as
the data bench does. For an A/B of two builds, run it with each build's
python, alternating:

    cd /tmp && for i in 1 2 3 4; do for py in OLD/bin/python NEW/bin/python; do
        $py -m mooncake_cxl.bench.put_probe; done; done
"""
import argparse
import os
import statistics
import sys
import time

from ..launch import MasterProcess
from . import common


def median_us(samples):
    return statistics.median(samples) / 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mooncake_cxl.bench.put_probe",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--puts", type=int, default=50000)
    ap.add_argument("--pool-dir", default=common.default_pool_dir(),
                    help="where the pool file goes (e.g. a hugetlbfs mount; default MC_CXL_BENCH_POOL_DIR "
                         "or /dev/shm)")
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("needs two CPUs")
    os.environ.setdefault("MC_CXL_PREFAULT", "1")
    with common.temp_pool("mcxl_put_probe", args.pool_dir) as pool, \
            MasterProcess(pool, 512 << 20, format=True, extra_flags=["--prefault_pool"]) as m:
        common.set_process_affinity(m.proc.pid, {cpus[-1]})
        os.sched_setaffinity(0, {cpus[0]})
        s = common.connect(m.address)
        value, pc, puts, pings = b"x" * 4096, time.perf_counter_ns, [], []
        for i in range(args.puts):
            key = f"probe/{i}"
            t0 = pc()
            rc = s.put(key, value)
            puts.append(pc() - t0)
            assert rc == 0, rc
            s.remove(key, force=True)
        for _ in range(args.puts // 4):
            t0 = pc()
            s.health_check()
            pings.append(pc() - t0)
        s.close()
    print(f"put 4 KiB median {median_us(puts):.3f} µs, ping median {median_us(pings):.3f} µs "
          f"(client CPU {cpus[0]}, master CPU {cpus[-1]})")


if __name__ == "__main__":
    main()
