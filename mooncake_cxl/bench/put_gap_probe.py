"""Put latency against the idle gap before it: one client busy-waits `gap` µs,
then puts (4 KiB and 1 MiB, each followed by an untimed remove, as the data
bench does); 300 puts per gap, median and p99. A gap longer than the ring
thread's spin window makes the put pay a wake-up of the master's core.

    cd /tmp && python -m mooncake_cxl.bench.put_gap_probe [--pin] [--master-flag=--ring_max_spin_us=0]
"""
import argparse
import os
import time

from ..launch import MasterProcess
from . import common

GAPS_US = (0, 20, 40, 60, 100, 300)


def spin(us):
    t = time.perf_counter_ns() + us * 1000
    while time.perf_counter_ns() < t:
        pass


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mooncake_cxl.bench.put_gap_probe",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--pin", action="store_true", help="this process on the first CPU, the master on the last")
    ap.add_argument("--puts", type=int, default=300)
    ap.add_argument("--master-flag", action="append", default=[], help="extra master flag (repeatable)")
    args = ap.parse_args(argv)
    os.environ.setdefault("MC_CXL_PREFAULT", "1")
    pc = time.perf_counter_ns
    with common.temp_pool("mcxl_gap_probe") as pool, \
            MasterProcess(pool, 512 << 20, format=True, extra_flags=["--prefault_pool"] + args.master_flag) as m:
        if args.pin:
            cpus = sorted(os.sched_getaffinity(0))
            common.set_process_affinity(m.proc.pid, {cpus[-1]})
            os.sched_setaffinity(0, {cpus[0]})
        s = common.connect(m.address)
        common.settle_placement(s)
        for size in (4096, 1 << 20):
            value = os.urandom(size)
            for gap in GAPS_US:
                lat = []
                for i in range(args.puts):
                    spin(gap)
                    t0 = pc()
                    rc = s.put(f"gap/{i}", value)
                    lat.append(pc() - t0)
                    assert rc == 0, rc
                    s.remove(f"gap/{i}", force=True)
                med, p99 = common.percentiles(lat)
                print(f"{size:>8} B after a {gap:>3} µs gap: median {med:7.1f} µs, p99 {p99:7.1f} µs")
        s.close()


if __name__ == "__main__":
    main()
