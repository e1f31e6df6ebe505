"""Shared by the engine tests: the interpreter that has SGLang and LMCache
(scripts/run_tests.sh installs them in .venv-engines and exports
MCXL_ENGINES_PYTHON), and how a worker script runs in it."""
import contextlib
import os
import subprocess
import sys

import pytest

# SGLang imports torchvision unconditionally; PyPI's does not load beside the CPU torch here.
NO_TORCHVISION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_torchvision")
WANTED = {"sglang": "0.5.23", "lmcache": "0.5.6"}
# Finding the packages and their versions is enough here (importing them takes ~20 s);
# the workers import them and fail loudly if they do not load.
PROBE = ("import importlib.metadata as m, importlib.util as u\n"
         "assert u.find_spec('mooncake_cxl'), 'mooncake_cxl is not installed'\n"
         f"want = {WANTED!r}\n"
         "have = {}\n"
         "for name in want:\n"
         "    try:\n"
         "        have[name] = m.version(name)\n"
         "    except m.PackageNotFoundError:\n"
         "        have[name] = None\n"
         "assert have == want, f'found {have}, want {want}'\n")


def engines_env(compat):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MOONCAKE_", "SGLANG_", "LMCACHE_")) and k != "MC_CXL_RPC"}
    env["PYTHONPATH"] = NO_TORCHVISION
    if compat:
        env["MOONCAKE_CXL_COMPAT"] = "1"
    return env


def engines_python_or_skip():
    """The interpreter to run engine workers in; skips (naming why) when it lacks them."""
    exe = os.environ.get("MCXL_ENGINES_PYTHON") or sys.executable
    probe = subprocess.run([exe, "-c", PROBE], capture_output=True, text=True, cwd="/",
                           env=engines_env(compat=True), timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"SGLang 0.5.23 / LMCache 0.5.6 are not importable by {exe} (scripts/run_tests.sh "
                    f"installs them and sets MCXL_ENGINES_PYTHON): "
                    f"{probe.stderr.strip().splitlines()[-1:]}")
    return exe


def run_engine_worker(python, worker, spec_path, out_path, log_path, compat, timeout=300):
    """Run `python worker spec out` (cwd /, not the source tree); the parsed out.json."""
    import json
    with open(log_path, "w") as log:
        rc = subprocess.run([python, worker, str(spec_path), str(out_path)], stdout=log,
                            stderr=subprocess.STDOUT, env=engines_env(compat), cwd="/",
                            timeout=timeout).returncode
    text = open(log_path).read()
    assert rc == 0, f"{os.path.basename(worker)} exited {rc}:\n{text[-4000:]}"
    return json.load(open(out_path))


@contextlib.contextmanager
def reference_master(tmp_path):
    """Mooncake 0.3.13's master for an oracle run, stopped after; skips,
    naming why, where the reference cannot run (outside `unshare -n`)."""
    import oracle
    why = oracle.reference_skip_reason()
    if why:
        pytest.skip(why)
    m = oracle.ReferenceMaster(log_path=str(tmp_path / "ref_master.log")).start()
    try:
        yield m
    finally:
        m.stop()
