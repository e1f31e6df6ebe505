"""A feature whose pip extra is missing says so: the command fails before it
starts with one line naming the extra to install and a non-zero exit, not a
traceback. Each case runs in a fresh interpreter whose sys.meta_path refuses
the extra's modules, as if they were not installed."""
import os
import subprocess
import sys
import textwrap

import pytest

from mooncake_cxl import extras

BLOCKER = textwrap.dedent("""\
    import importlib.abc, sys

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by the test)", name=name)
            return None

    sys.meta_path.insert(0, Missing())
    """)


def _run(blocked, code, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MCXL_VLLM_PYTHON"}
    return subprocess.run([sys.executable, "-c", BLOCKER.format(blocked=set(blocked)) + code],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)


def _command(blocked, module, args, tmp_path):
    code = f"import runpy; sys.argv = [{module!r}] + {list(args)!r}; runpy.run_module({module!r}, run_name='__main__')"
    return _run(blocked, code, tmp_path)


def _one_line(r):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == extras.EXIT_MISSING, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize("blocked, args, extra, module", [
    (["tqdm"], ["--compare", "mooncake", "--no-reexec"], "compare", "tqdm"),
    (["matplotlib"], ["--compare", "mooncake", "--no-progress"], "compare", "matplotlib"),
    (["mooncake"], ["--compare", "mooncake"], "oracle", "mooncake"),
    (["numpy"], ["--only", "data"], "bench", "numpy"),
    (["vllm"], ["--only", "pd", "--pd-parts", "ttft"], "vllm", "vllm"),
])
def test_bench_without_an_extra_names_it(tmp_path, blocked, args, extra, module):
    line = _one_line(_command(blocked, "mooncake_cxl.bench", args, tmp_path))
    assert line.startswith("python -m mooncake_cxl.bench: ")
    assert f"'{extra}' extra (no module {module})" in line
    assert f"pip install 'mooncake-cxl[{extra}]'" in line


def test_ttft_bench_without_vllm_names_it(tmp_path):
    line = _one_line(_command(["vllm"], "mooncake_cxl.bench.pd_ttft", ["--quick"], tmp_path))
    assert "'vllm' extra" in line and "pip install 'mooncake-cxl[vllm]'" in line


def test_vllm_connector_without_vllm_names_the_extra(tmp_path):
    r = _run(["vllm"], "import mooncake_cxl.vllm", tmp_path)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("mooncake_cxl.extras.MissingExtra: mooncake_cxl.vllm ")
    assert "pip install 'mooncake-cxl[vllm]'" in r.stderr


def test_tensor_methods_without_torch_log_the_extra(tmp_path):
    """The package imports without torch or numpy; a tensor method then logs
    one line naming the extra and returns Mooncake's error code."""
    r = _run(["torch", "numpy"], textwrap.dedent("""\
        from mooncake_cxl import ErrorCode, MooncakeDistributedStore
        s = MooncakeDistributedStore()
        print(s.put_tensor("k", object()) == ErrorCode.INVALID_PARAMS, s.get_tensor_into_cuda("k", None) != 0)
        """), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True"]
    lines = [line for line in r.stderr.splitlines() if "torch" in line and "extra" in line]
    assert len(lines) == 1 and "pip install 'mooncake-cxl[torch]'" in lines[0], r.stderr


def test_install_hint_names_the_checkout_when_run_from_one(tmp_path, monkeypatch):
    from mooncake_cxl import checkout
    pkg = tmp_path / "mooncake_cxl"
    pkg.mkdir()
    monkeypatch.setattr(checkout, "__file__", str(pkg / "checkout.py"))
    assert extras.install_hint("compare") == "pip install 'mooncake-cxl[compare]'"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mooncake-cxl"\n')
    assert extras.install_hint("compare") == "pip install '.[compare]'"
