"""The entry points a user runs: the master command, the demo, the benchmark
(a quick smoke run: it must work; its figures are not judged here)."""
import subprocess
import sys

from mooncake_cxl import bench


def test_master_help_lists_mooncake_flags():
    out = subprocess.run(["mooncake_cxl_master", "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for flag in ("--rpc_port", "--rpc_address", "--enable_cxl", "--cxl_path", "--cxl_size",
                 "--default_kv_lease_ttl", "--format", "--eviction_high_watermark_ratio"):
        assert flag in out.stdout


def test_master_rejects_unknown_flag_and_bad_value(tmp_path):
    out = subprocess.run(["mooncake_cxl_master", "--no_such_flag=1"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "unknown flag --no_such_flag" in out.stderr
    out = subprocess.run(["mooncake_cxl_master", "--rpc_port=abc"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "invalid value" in out.stderr
    out = subprocess.run(["mooncake_cxl_master", f"--cxl_path={tmp_path}/missing", "--rpc_address=127.0.0.1",
                          "--rpc_port=0"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "cannot open pool" in out.stderr


def test_demo_runs():
    out = subprocess.run([sys.executable, "-m", "mooncake_cxl.demo"], capture_output=True, text=True,
                         timeout=120, cwd="/tmp")
    assert out.returncode == 0, out.stderr
    assert "content OK" in out.stdout and "WRONG" not in out.stdout


def test_bench_quick_run_produces_every_row():
    result = bench.run(quick=True)
    ops = {(r["op"], r["size"]) for r in result["rows"]}
    for op in ("put", "get", "get_into", "get_buffer", "is_exist"):
        assert {(op, size) for size, *_ in bench.PLAN} <= ops
    assert all(r["median_us"] > 0 and r["memcpy_median_us"] > 0 for r in result["rows"])
    assert "| get | 16 MiB |" in bench.markdown(result)


def test_bench_control_and_eviction_quick_runs():
    from mooncake_cxl import bench_control, bench_eviction
    ctl = bench.run_control(quick=True)
    assert {r["op"] for r in ctl["rows"]} == {"remove_missing", "ping", "put_4k"}
    assert ctl["idle_cpu_percent"] >= 0
    assert "rings median" in bench_control.markdown(ctl)
    ev = bench_eviction.run("/dev/shm", quick=True)
    assert ev["put_64k_half_empty_gbps"] > 0 and ev["put_64k_at_watermark_gbps"] > 0
    assert ev["master_anon_bytes_per_object"] > 0
    assert "bytes/object" in bench_eviction.markdown(ev)
