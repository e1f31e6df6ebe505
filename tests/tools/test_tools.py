"""The entry points a user runs: the master command and the demo (the
benchmark's are in test_bench.py)."""
import subprocess
import sys


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
