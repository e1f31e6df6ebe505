"""mooncake_cxl.bench: --quick runs of every section (smoke runs: they must
work and report every row; their figures are not judged), the comparison
against the reference store, and its report writers on a made-up result."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import oracle
from mooncake_cxl.bench import coherence, compare, control, data, eviction, index_fill, paced


# ---------------------------------------------------------------- our sections

def test_bench_quick_run_produces_every_row():
    result = data.run(quick=True)
    ops = {(r["op"], r["size"]) for r in result["rows"]}
    for op in ("put", "get", "get_into", "get_buffer", "is_exist"):
        assert {(op, size) for size, *_ in data.PLAN} <= ops
    assert all(r["median_us"] > 0 and r["memcpy_median_us"] > 0 for r in result["rows"])
    assert "| get | 16 MiB |" in data.markdown(result)


def test_bench_control_and_eviction_quick_runs():
    ctl = control.run(quick=True)
    assert {r["op"] for r in ctl["rows"]} == {"remove_missing", "ping", "put_4k"}
    assert ctl["idle_cpu_percent"] >= 0
    assert "rings median" in control.markdown(ctl)
    paced_rows = ctl["paced"]["rows"]
    assert [r["pace_us"] for r in paced_rows] == list(paced.PACES_US)
    assert all(r[name]["median_us"] > 0 and r[name]["master_cpu_percent"] >= 0
               for r in paced_rows for name, _ in paced.CONFIGS)
    assert "adaptive" in control.markdown(ctl)
    ev = eviction.run(quick=True, pool_dir="/dev/shm")
    assert ev["put_64k_half_empty_gbps"] > 0 and ev["put_64k_at_watermark_gbps"] > 0
    assert ev["master_anon_bytes_per_object"] > 0
    assert "bytes/object" in eviction.markdown(ev)


def test_bench_coherence_quick_run_times_every_build():
    r = coherence.run(quick=True)
    assert [row["op"] for row in r["rows"]] == list(coherence.OPS)
    assert all(row[f"{b}_median_us"] > 0 for row in r["rows"] for b in coherence.BUILDS)
    assert r["values_checked"] == {b: True for b in coherence.BUILDS}
    assert "| get_into 4 MiB |" in coherence.markdown(r)


def test_bench_index_quick_run_fills_to_3x_and_reports_probes():
    r = index_fill.run(quick=True, pool_dir="/dev/shm")
    assert [f["value_bytes"] for f in r["fills"]] == [64, 4096]
    for f in r["fills"]:
        assert len(f["batch_s"]) == -(-3 * f["index_capacity"] // index_fill.BATCH)
        assert f["index_evicted"] > 0 and f["empty_batch_s"] > 0
        # Every fill level has its distribution (median <= p99 <= worst).
        assert [(lv["from"], lv["to"]) for lv in f["levels"]] == list(index_fill.LEVELS)
        assert all(0 < lv["median"] <= lv["p99"] <= lv["worst"] for lv in f["levels"])
    loads = [p["load"] for p in r["probes"]]
    # A put into a full probe window evicts one object of it: the last levels lag a little.
    assert loads == sorted(loads) and loads[0] == pytest.approx(0.5, abs=0.01) and loads[-1] > 0.9
    assert all(p["put_lookup"] and p["hit"] for p in r["probes"])
    text = index_fill.markdown(r)
    assert "| 64 B |" in text and "| 4096 B |" in text and "at the watermark after 3x" in text
    assert "Batch time by fill level" in text


# ---------------------------------------------------------------- against Mooncake (--compare mooncake)


def _unshare_works():
    unshare = shutil.which("unshare")
    if unshare is None:
        return "`unshare` (util-linux) is not installed"
    r = subprocess.run([unshare, "-n", "--", "true"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return f"`unshare -n` does not work here (needs root or user namespaces): {r.stderr.strip()}"
    return None


def _skip_reason():
    if not oracle.reference_importable():
        return f"reference Mooncake store not importable: pip install {oracle.REFERENCE_PACKAGE}"
    if oracle.reference_master_binary() is None:
        return "the reference wheel has no mooncake_master"
    for module in ("matplotlib", "tqdm"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install 'mooncake-cxl[compare]')"
    if oracle.loopback_only_netns()[0]:
        return None  # already in a private namespace: no re-exec needed
    return _unshare_works()


def test_quick_compare_run(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "mooncake_cxl.bench", "--compare", "mooncake", "--quick",
                        "--no-progress", "--out", str(out)], cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=300)  # a hang guard
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    result = json.loads((out / "compare.json").read_text())
    rows = {(row["op"], row["size"]) for row in result["rows"]}
    assert rows == {(op, size) for op in compare.OPS for size in compare.SIZES}
    for row in result["rows"]:
        for store in compare.STORES:
            assert row[store]["median_us"] > 0 and row[store]["samples"] > 0
        assert row["ratio_median"] > 0
    table = (out / "compare.md").read_text()
    assert "| get | 16 MiB |" in table and "| batch_get_into | 4 KiB ×32 |" in table
    assert table.strip() in r.stdout
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _fake_result():
    rows = []
    for op in compare.OPS:
        for size in compare.SIZES:
            row = {"op": op, "size": size, "bytes_per_call": size}
            if op in compare.BATCH_OPS:
                row["batch"] = compare.batch_size(size)
                row["bytes_per_call"] *= row["batch"]
            for i, store in enumerate(compare.STORES):
                med = (1 + i) * size / 1e3 + 1
                row[store] = {"median_us": med, "p99_us": 2 * med, "samples": 10,
                              "gbps": row["bytes_per_call"] / (med * 1e3)}
            row["ratio_median"] = row["ratio_p99"] = 0.5
            rows.append(row)
    return {"machine": "test machine", "quick": True, "rounds": 1, "sizes": compare.SIZES,
            "ops": compare.OPS, "rows": rows}


def test_markdown_and_chart_of_a_result(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'mooncake-cxl[compare]')")
    result = _fake_result()
    table = compare.markdown(result)
    lines = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(lines) == 1 + len(compare.OPS) * len(compare.SIZES)
    assert "| is_exist | 4 KiB |" in table and "| 0.500 |" in table
    path = tmp_path / "chart.png"
    compare.chart(result, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 10_000


def test_batch_sizes_and_read_sets_fit():
    for size in compare.SIZES:
        b = compare.batch_size(size)
        assert 2 <= b <= 32 and compare.read_set_len(size) >= b
        # Mooncake's writer segment holds the read set plus the largest batch in flight.
        assert (compare.read_set_len(size) + b) * size <= compare.REFERENCE_SEGMENT
    assert compare.QUICK_PLAN.keys() == compare.PLAN.keys() == set(compare.SIZES)
