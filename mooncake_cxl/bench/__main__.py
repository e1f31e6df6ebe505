"""The benchmark's command line.

Sections: data (put/get/zero-copy latency beside a memcpy of the same size,
writer and reader in separate processes), control (CXL RPC rings against
TCP), eviction (throughput at the watermark, master memory per object),
tiering (the SSD tier, only with --only tiering). Each
starts its own master over a pool in /dev/shm. --compare mooncake runs the
same workloads on Mooncake's own store instead (see mooncake_cxl/bench/compare.py).
--only pd (not in the default run: it needs vLLM) is prefill/decode: the KV hand-off
(pd_handoff.py) and TTFT in vLLM (pd_ttft.py); it runs under `unshare -n` (re-executing
itself) so that Mooncake's rows can bind 0.0.0.0 in a loopback-only namespace.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

from . import common

_PD_NETNS_ENV = "MCXL_PD_NETNS"
SECTIONS = ("data", "control", "eviction", "tiering", "pd")
DEFAULT_SECTIONS = ("data", "control", "eviction")  # tiering (needs a disk directory) and pd: --only
PD_PARTS = (("pd_handoff", "hand-off"), ("pd_ttft", "TTFT in vLLM"))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m mooncake_cxl.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few iterations: a smoke run, not a measurement")
    ap.add_argument("--no-prefault", action="store_true",
                    help="data/eviction: let pool pages fault in on first touch (default: master "
                         "--prefault_pool and clients MC_CXL_PREFAULT=1)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--only", default=",".join(DEFAULT_SECTIONS),
                    help="comma-separated sections: data (put/get/zero-copy), control (rings vs TCP), "
                         "eviction (throughput at the watermark, master memory per object), "
                         "tiering (SSD tier: pool vs tier reads, staged reads, demotion under puts; "
                         "tier directory: MC_CXL_BENCH_TIER_DIR, default /var/tmp); "
                         "pd (prefill/decode: KV hand-off and TTFT in vLLM; needs the vllm extra)")
    ap.add_argument("--pd-parts", default="handoff,ttft",
                    help="with --only pd: which parts (handoff: the KV hand-off, ~5 min; ttft: TTFT in "
                         "vLLM, ~25 min on 2 cores)")
    ap.add_argument("--pd-tokens", metavar="N,N,...",
                    help="with --only pd: TTFT prompt lengths (default 2048,8192; 30720 is the issue's 30k "
                         "row: one 30k prefill takes ~5 min on 2 cores and the part runs four)")
    ap.add_argument("--pd-rows", metavar="ROW,...",
                    help="with --only pd: TTFT rows (default all: recompute, vllm-on-ours, ours, "
                         "vllm-on-mooncake)")
    ap.add_argument("--pd-no-parallel", action="store_true", help="with --only pd: skip the parallel-load pair")
    ap.add_argument("--compare", choices=["mooncake"],
                    help="run the same workloads on Mooncake's own store too (needs the oracle extra)")
    ap.add_argument("--out", default="bench_out", metavar="DIR",
                    help="with --compare: where compare.{md,json,png} go (default: ./bench_out)")
    ap.add_argument("--no-progress", action="store_true", help="with --compare: no progress bar")
    ap.add_argument("--no-reexec", action="store_true",
                    help="with --compare: fail instead of re-running under `unshare -n` when not in a "
                         "loopback-only network namespace")
    args = ap.parse_args(argv)
    if args.compare:
        from . import compare
        return compare.main(out=args.out, quick=args.quick, progress=not args.no_progress,
                            reexec=not args.no_reexec, argv=argv)
    sections = [x for x in args.only.split(",") if x]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    if "pd" in sections:
        from . import compare
        if not compare.loopback_only() and os.environ.get(_PD_NETNS_ENV) != "1" and shutil.which("unshare") \
                and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
            env = dict(os.environ, **{_PD_NETNS_ENV: "1"})
            return subprocess.call(["unshare", "-n", "--", sys.executable, "-m", "mooncake_cxl.bench", *argv],
                                   env=env)
        if compare.loopback_only():
            compare._bring_loopback_up()  # a fresh `unshare -n` namespace has lo down
    pool_dir = common.default_pool_dir()
    results = {}
    if "data" in sections:
        from . import data
        results["data"] = data.run(quick=args.quick, pool_dir=pool_dir, prefault=not args.no_prefault)
        print("## Data path\n\n" + data.markdown(results["data"]) + "\n", flush=True)
    if "control" in sections:
        from . import control
        results["control"] = control.run(quick=args.quick, pool_dir=pool_dir)
        print("## Control path: CXL RPC rings vs TCP\n\n" + control.markdown(results["control"]) + "\n",
              flush=True)
    if "eviction" in sections:
        from . import eviction
        results["eviction"] = eviction.run(quick=args.quick, pool_dir=pool_dir, prefault=not args.no_prefault)
        print("## Eviction and master memory\n\n" + eviction.markdown(results["eviction"]) + "\n",
              flush=True)
    if "pd" in sections:
        import importlib
        import importlib.util
        results["pd"] = {}
        wanted = {"pd_" + x.strip() for x in args.pd_parts.split(",") if x.strip()}
        for name, title in PD_PARTS:
            if name not in wanted:
                continue
            if importlib.util.find_spec(f"{__package__}.{name}") is None:
                continue
            mod = importlib.import_module(f".{name}", __package__)
            kw = {}
            if name == "pd_ttft":
                if args.pd_tokens:
                    kw["tokens"] = [int(x) for x in args.pd_tokens.split(",") if x.strip()]
                if args.pd_rows:
                    kw["rows"] = [x.strip() for x in args.pd_rows.split(",") if x.strip()]
                if args.pd_no_parallel:
                    kw["parallel"] = False
            results["pd"][name] = mod.run(quick=args.quick, pool_dir=pool_dir, **kw)
            print(f"## Prefill/decode: {title}\n\n" + mod.markdown(results["pd"][name]) + "\n", flush=True)
    if "tiering" in sections:
        from . import tiering
        results["tiering"] = tiering.run(quick=args.quick, pool_dir=pool_dir)
        print("## SSD tier\n\n" + tiering.markdown(results["tiering"]) + "\n", flush=True)
    from . import summary
    text = summary.markdown(results)
    if text:
        print("## Issue 14's figures, each beside its same-run baseline\n\n" + text + "\n", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
