"""The benchmark's command line.

Sections: data (put/get/zero-copy latency beside a memcpy of the same size,
writer and reader in separate processes), cold (first puts into a fresh pool,
master start and client setup, prefault on and off), control (CXL RPC rings against
TCP), eviction (throughput at the watermark, master memory per object),
index (small values: put batches from empty to 3x the index, probe lengths),
tiering (the SSD tier, only with --only tiering), ha (elected masters' takeover
time and HA's put cost, only with --only ha; needs etcd), coherence (the
coherent, real non-coherent and simulated builds of the publish primitives,
alternating, only with --only coherence). Each
starts its own master over a pool in /dev/shm. --compare mooncake runs the
same workloads on Mooncake's own store instead (see mooncake_cxl/bench/compare.py).
--only pd (not in the default run: it needs vLLM) is prefill/decode: the KV hand-off
(pd_handoff.py) and TTFT in vLLM (pd_ttft.py); it runs under `unshare -n` (re-executing
itself) so that Mooncake's rows can bind 0.0.0.0 in a loopback-only namespace.
--only engines (needs SGLang and LMCache, MCXL_ENGINES_PYTHON) times their Mooncake
backends on ours and on Mooncake's store (engines.py), under `unshare -n` likewise.

--report [PATH] rewrites the sections that ran in the performance document
(default docs/performance.md of the source checkout, see report.py); without
it nothing is written into the source tree.
"""
import argparse
import json
import os
import sys

from .. import extras
from . import common, reference, report

PROG = "python -m mooncake_cxl.bench"
_PD_NETNS_ENV = "MCXL_PD_NETNS"
SECTIONS = ("data", "cold", "control", "eviction", "index", "tiering", "pd", "engines", "ha", "remote",
            "coherence")
DEFAULT_SECTIONS = ("data", "cold", "control", "eviction", "index")  # tiering (needs a disk directory), pd, engines, ha (etcd), remote: --only
PD_PARTS = ("pd_handoff", "pd_ttft")
NEEDS_NUMPY = ("data", "tiering", "pd", "coherence")


def _parser():
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few iterations: a smoke run, not a measurement")
    ap.add_argument("--no-prefault", action="store_true",
                    help="data/eviction: let pool pages fault in on first touch (master "
                         "--prefault_pool=false, clients MC_CXL_PREFAULT=0; default: prefault on)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--report", nargs="?", const="", metavar="PATH",
                    help="rewrite this run's sections of the performance document at PATH (default: "
                         "docs/performance.md of the source checkout, else one under "
                         "~/.cache/mooncake_cxl/bench); its other sections stay as they are")
    ap.add_argument("--only", default=",".join(DEFAULT_SECTIONS),
                    help="comma-separated sections: data (put/get/zero-copy), control (rings vs TCP), "
                         "eviction (throughput at the watermark, master memory per object), "
                         "index (small values filling the index: time per put batch, probe lengths), "
                         "tiering (SSD tier: pool vs tier reads, staged reads, demotion under puts; "
                         "tier directory: MC_CXL_BENCH_TIER_DIR, default /var/tmp); "
                         "pd (prefill/decode: KV hand-off and TTFT in vLLM; needs the vllm extra); "
                         "engines (SGLang's and LMCache's Mooncake backends, ours vs Mooncake; "
                         "their interpreter: MCXL_ENGINES_PYTHON); "
                         "ha (takeover time of elected masters, HA's put cost; needs etcd); "
                         "remote (a client outside the pod over TE-TCP against Mooncake's store, raw TE "
                         "and a local client; needs the oracle extra and `unshare -n`); "
                         "coherence (coherent vs real non-coherent vs simulated primitives, alternating)")
    ap.add_argument("--coherence", choices=["coherent", "noncoherent", "simulated"], default="coherent",
                    help="data, control: the pool's mode (--coherence at format) and, for simulated, every "
                         "process on simulated host 0 (MC_CXL_SIM_HOST, churn off); the coherence section "
                         "runs the three alternating")
    ap.add_argument("--pd-parts", default="handoff,ttft",
                    help="with --only pd: which parts (handoff: the KV hand-off, ~5 min; ttft: TTFT in "
                         "vLLM, ~25 min on 2 cores)")
    ap.add_argument("--pd-tokens", metavar="N,N,...",
                    help="with --only pd: TTFT prompt lengths (default 2048,8192; 30720 adds the 30k-token "
                         "row: one 30k prefill takes ~5 min on 2 cores and the part runs four)")
    ap.add_argument("--pd-rows", metavar="ROW,...",
                    help="with --only pd: TTFT rows (default all: recompute, vllm-on-ours, ours, "
                         "vllm-on-mooncake)")
    ap.add_argument("--pd-no-parallel", action="store_true", help="with --only pd: skip the parallel-load pair")
    ap.add_argument("--compare", choices=["mooncake"],
                    help="run the same workloads on Mooncake's own store too (needs the oracle and "
                         "compare extras)")
    ap.add_argument("--out", metavar="DIR",
                    help="with --compare: where compare.{md,json,png} go (default: ~/.cache/mooncake_cxl/bench)")
    ap.add_argument("--no-progress", action="store_true", help="with --compare: no progress bar")
    ap.add_argument("--no-reexec", action="store_true",
                    help="with --compare: fail instead of re-running under `unshare -n` when not in a "
                         "loopback-only network namespace")
    return ap


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    args = ap.parse_args(argv)
    sections = [x for x in args.only.split(",") if x]
    unknown = set(sections) - set(SECTIONS)
    if unknown and not args.compare:
        ap.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    pd_parts = [p for p in PD_PARTS if p[3:] in {x.strip() for x in args.pd_parts.split(",")}]
    try:
        _require_extras(args, sections, pd_parts)
    except extras.MissingExtra as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return extras.EXIT_MISSING
    report_path = None
    if args.report is not None:
        report_path = os.path.abspath(args.report or report.default_report_path())
    if args.compare:
        from . import compare
        out = args.out or report.output_dir()
        return compare.main(out=out, quick=args.quick, progress=not args.no_progress,
                            reexec=not args.no_reexec, argv=argv, report_path=report_path)
    if "pd" in sections or "engines" in sections:
        if not reference.loopback_only() and os.environ.get(_PD_NETNS_ENV) != "1" \
                and reference.netns_unavailable() is None:
            return reference.rerun_in_netns(argv, _PD_NETNS_ENV)
        if reference.loopback_only():
            reference.bring_loopback_up()  # a fresh `unshare -n` namespace has lo down
    pool_dir = common.default_pool_dir()
    print(f"Machine: {common.machine()}\nPool: {report.pool_pages(pool_dir)}\n", flush=True)
    results, bodies = _run_sections(args, sections, pd_parts, pool_dir)
    from . import summary
    text = summary.markdown(results)
    if text:
        _show(bodies, "summary", text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.json}")
    if report_path:
        report.update(report_path, bodies, report.run_context(argv, pool_dir))
        print(f"wrote the {', '.join(bodies)} section(s) of {report_path}")
    return 0


def _require_extras(args, sections, pd_parts):
    """Raises MissingExtra, before anything runs, when this run needs an extra that is missing."""
    if args.compare:
        from . import compare
        compare.require_extras(progress=not args.no_progress)
        return
    for name in sections:
        if name in NEEDS_NUMPY:
            extras.require(f"--only {name}", "bench")
    if "pd" in sections and "pd_ttft" in pd_parts:
        from . import pd_ttft
        pd_ttft.require_vllm(pd_ttft.vllm_python())


def _show(bodies, key, text):
    bodies[key] = text
    print(f"## {report.TITLES[key]}\n\n{text}\n", flush=True)


# (section, module, whether it takes prefault=), in the order they run; pd runs after "index".
_SECTIONS_BEFORE_PD = (("data", "data", True), ("cold", "cold", False), ("control", "control", False),
                       ("eviction", "eviction", True), ("index", "index_fill", False))
_SECTIONS_AFTER_PD = (("engines", "engines", True), ("ha", "ha", False), ("remote", "remote", False),
                      ("tiering", "tiering", False), ("coherence", "coherence", False))


def _run_section(args, key, module, takes_prefault, pool_dir, results, bodies):
    import importlib
    mod = importlib.import_module(f".{module}", __package__)
    kw = {"prefault": not args.no_prefault} if takes_prefault else {}
    if key in ("data", "control"):
        kw["coherence"] = args.coherence
    results[key] = mod.run(quick=args.quick, pool_dir=pool_dir, **kw)
    _show(bodies, key, mod.markdown(results[key]))


def _run_pd(args, pd_parts, pool_dir, results, bodies):
    import importlib
    results["pd"] = {}
    for name in pd_parts:
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
        _show(bodies, name, mod.markdown(results["pd"][name]))


def _run_sections(args, sections, pd_parts, pool_dir):
    """Runs the sections asked for, in this order, printing each; (results, {key: markdown})."""
    results, bodies = {}, {}
    for key, module, takes_prefault in _SECTIONS_BEFORE_PD:
        if key in sections:
            _run_section(args, key, module, takes_prefault, pool_dir, results, bodies)
    if "pd" in sections:
        _run_pd(args, pd_parts, pool_dir, results, bodies)
    for key, module, takes_prefault in _SECTIONS_AFTER_PD:
        if key in sections:
            _run_section(args, key, module, takes_prefault, pool_dir, results, bodies)
    return results, bodies


if __name__ == "__main__":
    sys.exit(main())
