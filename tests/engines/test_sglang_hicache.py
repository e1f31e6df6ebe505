"""SGLang 0.5.23's own HiCache Mooncake backend (MooncakeStore, with SGLang's
CPU device and host KV pools) on our store through MOONCAKE_CXL_COMPAT=1: MHA
page_first and page_first_direct, MLA page_first and layer_first (multi-buffer),
and the standalone_storage mode, byte-exact; a second process, configured by
another route, reads what the first wrote. The same writer runs against Mooncake 0.3.13 as the oracle."""
import json
import os

from engines_common import reference_master, run_engine_worker

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_workers.py")
CASES = [["mha_page_first", False, "page_first"], ["mha_page_first_direct", False, "page_first_direct"],
         ["mla_page_first", True, "page_first"], ["mla_layer_first", True, "layer_first"]]
NAMES = [c[0] for c in CASES]
STANDALONE = ["mha_standalone_storage", False, "page_first"]


def _run(python, tmp_path, name, spec, compat):
    (tmp_path / f"{name}.spec.json").write_text(json.dumps(spec))
    return run_engine_worker(python, WORKER, tmp_path / f"{name}.spec.json", tmp_path / f"{name}.out.json",
                             tmp_path / f"{name}.log", compat=compat)


def _assert_exact(out, impl, write, names=NAMES):
    assert out["impl"] == impl
    assert sorted(out["cases"]) == sorted(names)
    for name, r in out["cases"].items():
        if write:
            assert r["set"] == [True] * 8, (name, r)
        assert r["exists"] == 8, (name, r)
        assert r["get"] == [True] * 8, (name, r)
        assert r["exact"] is True, name


def test_sglang_mooncake_store_second_process_reads_byte_exact(engines_python, master, tmp_path):
    """Every layout through extra_config, plus SGLang's standalone_storage mode (its host
    pool from MooncakeHostMemAllocator, setup_dummy through mooncake_cxl_client); the
    reader finds the store by SGLang's two other routes: its config file, MOONCAKE_* variables."""
    from mooncake_cxl.launch import StandaloneClientProcess
    client = StandaloneClientProcess(master.address, log_path=str(tmp_path / "standalone.log")).start()
    try:
        spec = {"mode": "write", "master": master.address, "standalone": client.address, "seed": 7,
                "cases": [c + ["extra"] for c in CASES] + [STANDALONE + ["standalone"]]}
        out = _run(engines_python, tmp_path, "write", spec, compat=True)
        _assert_exact(out, "ours", write=True, names=NAMES + [STANDALONE[0]])
        assert out["cases"]["mha_page_first"]["legacy"] is True  # set/get, batch_set/batch_get
        r = out["cases"][STANDALONE[0]]
        assert r["allocator"] == "MooncakeHostTensorAllocator" and r["setup_dummy"] is True, r
    finally:
        client.stop()  # the pages stay: the dummy client wrote them into the pool
    routes = ["file", "env", "file", "env", "env"]
    spec = dict(spec, mode="read", cases=[c + [r] for c, r in zip(CASES + [STANDALONE], routes)])
    _assert_exact(_run(engines_python, tmp_path, "read", spec, compat=True), "ours", write=False,
                  names=NAMES + [STANDALONE[0]])


def test_sglang_mooncake_store_on_reference_mooncake(engines_python, tmp_path):
    with reference_master(tmp_path) as m:
        spec = {"mode": "write", "master": m.address, "seed": 7, "cases": [c + ["extra"] for c in CASES]}
        out = _run(engines_python, tmp_path, "ref_write", spec, compat=False)
        _assert_exact(out, "reference", write=True)
        assert out["cases"]["mha_page_first"]["legacy"] is True
