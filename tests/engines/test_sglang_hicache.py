"""SGLang 0.5.23's own HiCache Mooncake backend (MooncakeStore, with SGLang's
CPU device and host KV pools) on our store through MOONCAKE_CXL_COMPAT=1: MHA
page_first and page_first_direct, MLA page_first and layer_first (multi-buffer),
byte-exact; a second process, configured by another route, reads what the
first wrote. The same writer runs against Mooncake 0.3.13 as the oracle."""
import json
import os

import pytest

import oracle
from engines_common import run_engine_worker

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_workers.py")
CASES = [["mha_page_first", False, "page_first"], ["mha_page_first_direct", False, "page_first_direct"],
         ["mla_page_first", True, "page_first"], ["mla_layer_first", True, "layer_first"]]


def _run(python, tmp_path, name, spec, compat):
    (tmp_path / f"{name}.spec.json").write_text(json.dumps(spec))
    return run_engine_worker(python, WORKER, tmp_path / f"{name}.spec.json", tmp_path / f"{name}.out.json",
                             tmp_path / f"{name}.log", compat=compat)


def _assert_exact(out, impl, write):
    assert out["impl"] == impl
    assert set(out["cases"]) == {c[0] for c in CASES}
    for name, r in out["cases"].items():
        if write:
            assert r["set"] == [True] * 8, (name, r)
        assert r["exists"] == 8, (name, r)
        assert r["get"] == [True] * 8, (name, r)
        assert r["exact"] is True, name


def test_sglang_mooncake_store_second_process_reads_byte_exact(engines_python, master, tmp_path):
    spec = {"mode": "write", "master": master.address, "seed": 7,
            "cases": [c + ["extra"] for c in CASES]}
    _assert_exact(_run(engines_python, tmp_path, "write", spec, compat=True), "ours", write=True)
    # The reader finds the store by SGLang's two other routes: its config file, MOONCAKE_* variables.
    routes = ["file", "env", "file", "env"]
    spec = dict(spec, mode="read", cases=[c + [r] for c, r in zip(CASES, routes)])
    _assert_exact(_run(engines_python, tmp_path, "read", spec, compat=True), "ours", write=False)


def test_sglang_mooncake_store_on_reference_mooncake(engines_python, tmp_path):
    why = oracle.reference_skip_reason()
    if why:
        pytest.skip(why)
    m = oracle.ReferenceMaster(log_path=str(tmp_path / "ref_master.log")).start()
    try:
        spec = {"mode": "write", "master": m.address, "seed": 7, "cases": [c + ["extra"] for c in CASES]}
        _assert_exact(_run(engines_python, tmp_path, "ref_write", spec, compat=False), "reference",
                      write=True)
    finally:
        m.stop()
