"""The engines section (--only engines): SGLang's HiCache Mooncake backend
(its MooncakeStore.batch_set_v1/batch_get_v1 over its MHA page_first host
pool, 64 KiB and 1 MiB pages, batches of 32) and LMCache's mooncakestore://
connector (batched_put/batched_get of 256-token chunks), on our store and on
Mooncake 0.3.13 over TCP, in the same run, each row beside its bound: a
memcpy of the same parts from or into the same engine memory (one copy per
byte, no store).

The engine code runs in engines_worker.py under MCXL_ENGINES_PYTHON (an
interpreter with SGLang 0.5.23 and LMCache 0.5.6; default: this one), one
worker per store, and the rounds alternate ours and Mooncake's. Timing
starts once the master and our worker have the whole pool mapped (the
prefault default populates it in the background, as in the data section).
Mooncake's client binds 0.0.0.0, so the section re-runs itself under `unshare -n`.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from . import common, pages

MIB, KIB = 1 << 20, 1 << 10
POOL = 1536 * MIB
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engines_worker.py")
# (label, command, how many iterations in a round: quick, full)
CASES = (("SGLang HiCache, 64 KiB pages", {"op": "sglang", "page_bytes": 64 * KIB, "batch": 32}, (2, 16)),
         ("SGLang HiCache, 1 MiB pages", {"op": "sglang", "page_bytes": MIB, "batch": 32}, (1, 4)),
         ("LMCache mooncakestore, 256-token chunks", {"op": "lmcache", "batch": 8}, (2, 8)))


def engines_python():
    return os.environ.get("MCXL_ENGINES_PYTHON") or sys.executable


class _Worker:
    def __init__(self, python, master, impl, log_path, prefault=True, pool=None):
        env = dict(os.environ)
        env.pop("MOONCAKE_CXL_COMPAT", None)
        if impl == "ours":
            env["MOONCAKE_CXL_COMPAT"] = "1"
            env["MC_CXL_PREFAULT"] = "1" if prefault else "0"  # the default is on, as in the data section
            if prefault:  # the worker waits for its own mapping after its first setup
                env["MCXL_BENCH_POOL"] = f"{pool[0]}:{pool[1]}"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([python, WORKER, master, impl], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd="/")
        self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engines worker exited; see {self.log.name}")
        return json.loads(line)

    def run(self, cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        self.proc.stdin.close()
        common.wait_or_kill(self.proc, 30)
        self.log.close()


def run(quick=False, pool_dir=None, prefault=True, rounds=None):
    from ..launch import MasterProcess
    from . import reference
    rounds = rounds or (1 if quick else 3)
    python = engines_python()
    out_dir = tempfile.gettempdir()  # the workers' and Mooncake master's logs
    results = {"rounds": rounds, "python": python, "cases": {}}
    with common.temp_pool("mcxl_bench_engines", pool_dir) as pool, \
            MasterProcess(pool, POOL, format=True,
                          extra_flags=[] if prefault else ["--prefault_pool=false"]) as ours_master, \
            reference.ReferenceMaster(os.path.join(out_dir, "mcxl_bench_engines_ref.log")) as ref_master:
        workers = {"ours": _Worker(python, ours_master.address, "ours",
                                   os.path.join(out_dir, "mcxl_bench_engines_ours.log"), prefault, (pool, POOL)),
                   "mooncake": _Worker(python, ref_master.address, "reference",
                                       os.path.join(out_dir, "mcxl_bench_engines_mooncake.log"))}
        try:
            if prefault:  # a put that reaches a page the master has not mapped pays its fault
                results["master_populate_wait_s"] = pages.wait_resident(ours_master.proc.pid, pool, POOL)
            for label, cmd, iters in CASES:
                cmd = dict(cmd, iters=iters[0] if quick else iters[1])
                per = {"ours": [], "mooncake": []}
                for _ in range(rounds):  # alternate A and B
                    for impl in ("ours", "mooncake"):
                        per[impl].append(workers[impl].run(cmd))
                results["cases"][label] = per
        finally:
            for w in workers.values():
                w.close()
    return results


def _median(rows, field):
    return statistics.median(r[field] for r in rows)


def markdown(results):
    lines = ["| workload | op | ours GB/s | Mooncake 0.3.13 GB/s | ours / Mooncake | memcpy GB/s | "
             "ours / memcpy | ours: in store calls | byte-exact |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, per in results["cases"].items():
        fields = ("set_gbps", "get_gbps") if "set_gbps" in per["ours"][0] else ("put_gbps", "get_gbps")
        for field in fields:
            a, b = _median(per["ours"], field), _median(per["mooncake"], field)
            floor = _median(per["ours"], field.replace("_gbps", "_memcpy_gbps"))
            exact = all(r["exact"] for r in per["ours"] + per["mooncake"])
            share = _median(per["ours"], field.replace("_gbps", "_in_store"))
            lines.append(f"| {label} | {field.split('_')[0]} | {a:.2f} | {b:.2f} | {a / b:.1f}x | {floor:.2f} | "
                         f"{a / floor:.2f} | {share:.0%} | {'yes' if exact else 'NO'} |")
    lines.append("")
    lines.append(f"A batch's bytes over its median time in a round, median of {results['rounds']} "
                 "rounds alternating the stores; each batch is the engine's own call path end to end "
                 "(SGLang's batch_set_v1 includes its batch_is_exist); Mooncake over TCP on loopback. "
                 "memcpy: the row's bound, timed between our batches in the same worker: the same "
                 "parts, one memcpy each, between the same engine memory (a set's or put's source, a "
                 "get's destination) and a cycled /dev/shm working set, the pool's medium (no store "
                 "moves a byte faster than one copy of it). Mooncake's get here is a copy within its "
                 "own process, so ours / Mooncake on a get cannot exceed memcpy / Mooncake. "
                 "In store calls: the share of our batch's time inside the store's own calls "
                 "(SGLang's batch_is_exist + batch_put_from, batch_get_into; LMCache's "
                 "batch_put_from / batch_get_into, which it runs through asyncio.to_thread); the rest "
                 "is the engine's code around them, which no store can shorten.")
    return "\n".join(lines)
