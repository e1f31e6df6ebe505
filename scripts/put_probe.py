"""4 KiB put and ring ping medians with this process and the master pinned to
different cores (issue 14). Each put is timed alone and followed by an untimed
remove, as the data bench does. Run it with each build's python, alternating:

    for i in 1 2 3 4; do for py in OLD/bin/python NEW/bin/python; do $py scripts/put_probe.py; done; done
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

from mooncake_cxl.bench import common
from mooncake_cxl.bench.data import _set_process_affinity
from mooncake_cxl.launch import MasterProcess


def median_us(samples):
    return statistics.median(samples) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--puts", type=int, default=50000)
    ap.add_argument("--pool-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir(),
                    help="where the pool file goes (e.g. a hugetlbfs mount)")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("needs two CPUs")
    os.environ.setdefault("MC_CXL_PREFAULT", "1")
    with common.temp_pool("mcxl_put_probe", args.pool_dir) as pool, \
            MasterProcess(pool, 512 << 20, format=True, extra_flags=["--prefault_pool"]) as m:
        _set_process_affinity(m.proc.pid, {cpus[-1]})
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
