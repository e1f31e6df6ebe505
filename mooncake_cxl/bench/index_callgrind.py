"""Probe: the master's instructions per put, empty pool against 3x the index
(python -m mooncake_cxl.bench.index_callgrind [value_bytes] [--binary PATH]).

The master runs under valgrind's callgrind with instrumentation off; one
client puts new keys with put_batch, 1,000 a call, into a 64 MiB pool (the
default index of 16,384 entries; --pool_mib for another). Instrumentation is
on for 5,000 puts at 2k-7k objects (below the index's watermark), for 5,000
from the watermark on (0.8x: eviction starts) and for the last 5,000 of 3x
the capacity (every put pays an eviction for its slot). Prints instructions
per put of the whole master (all its threads: the put path and the idle
eviction) for each phase and their ratio to the first; counts repeat run to run, unlike
times on a shared machine. Needs valgrind; --binary names an unstripped
master (the installed one is stripped: totals only, no function names in
the callgrind files left in --out)."""
import argparse
import os
import re
import subprocess
import tempfile
import urllib.request

from . import common

BATCH = 1000
POOL = 64 << 20
MEASURED = 5000


def _total(path):
    out = subprocess.run(["callgrind_annotate", path], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"^([\d,]+) \S*\s*PROGRAM TOTALS", out, re.M).group(1).replace(",", ""))


def run(size=64, binary=None, out=None, pool=POOL):
    from .. import launch
    out = out or tempfile.mkdtemp(prefix="mcxl_index_cg_")
    os.makedirs(out, exist_ok=True)
    real = binary or launch.binary_path()
    wrap = os.path.join(out, "master.sh")
    with open(wrap, "w") as f:
        f.write(f"#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no "
                f"--callgrind-out-file={out}/cg.%p.out {real} \"$@\"\n")
    os.chmod(wrap, 0o755)
    saved = launch.binary_path
    launch.binary_path = lambda: wrap
    try:
        with common.temp_pool("mcxl_index_cg", "/dev/shm") as path, \
                launch.MasterProcess(path, pool, format=True, start_timeout=120) as m:
            text = urllib.request.urlopen(m.metrics_url + "/metrics", timeout=60).read().decode()
            cap = int(float(re.search(r"^master_index_capacity (\S+)", text, re.M).group(1)))
            s = common.connect(m.address)
            value, n = b"v" * size, 0

            def put(count):
                nonlocal n
                for _ in range(count // BATCH):
                    rc = s.put_batch([f"cg/{n + i}" for i in range(BATCH)], [value] * BATCH)
                    if rc != 0:
                        raise RuntimeError(f"put_batch at {n} objects returned {rc}")
                    n += BATCH

            def measured(tag):
                ctl = ["callgrind_control"]
                subprocess.run(ctl + ["-i", "on", str(m.proc.pid)], check=True, capture_output=True)
                put(MEASURED)
                subprocess.run(ctl + ["-i", "off", str(m.proc.pid)], check=True, capture_output=True)
                subprocess.run(ctl + ["-d", tag, str(m.proc.pid)], check=True, capture_output=True)
            try:
                put(2000)
                measured("empty")
                put(int(0.8 * cap) // BATCH * BATCH - n)
                measured("at08x")
                put(3 * cap - n - MEASURED)
                measured("at3x")
            finally:
                s.close()
    finally:
        launch.binary_path = saved
    dumps = sorted(f for f in os.listdir(out) if re.search(r"\.out\.\d+$", f))
    empty, watermark, full = (_total(os.path.join(out, f)) / MEASURED for f in dumps[:3])
    return {"value_bytes": size, "index_capacity": cap, "empty_per_put": empty, "at_watermark_per_put": watermark,
            "at_3x_per_put": full, "ratio": full / empty, "out": out}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("value_bytes", nargs="?", type=int, default=64)
    p.add_argument("--binary", help="the master to run (an unstripped build names functions)")
    p.add_argument("--out", help="directory for the callgrind files")
    p.add_argument("--pool_mib", type=int, default=POOL >> 20, help="pool size (the index: one entry per 4 KiB)")
    a = p.parse_args()
    r = run(a.value_bytes, a.binary, a.out, a.pool_mib << 20)
    print(f"{r['value_bytes']} B values, index {r['index_capacity']:,} entries: master instructions per put "
          f"{r['empty_per_put']:,.0f} empty, {r['at_watermark_per_put']:,.0f} from its watermark on "
          f"({r['at_watermark_per_put'] / r['empty_per_put']:.2f}x), {r['at_3x_per_put']:,.0f} at 3x the index "
          f"({r['ratio']:.2f}x); "
          f"callgrind files in {r['out']}")


if __name__ == "__main__":
    main()
