"""LMCache 0.5.6's own `mooncakestore://` connector (CreateConnector over a
LocalCPUBackend) on our store through MOONCAKE_CXL_COMPAT=1, configured with
LMCache's legacy extra_config keys (master_server_address, string sizes), in
both save_chunk_meta modes: a second process reads every 256-token chunk the
first wrote, byte-exact; and LMCacheEngine itself stores in one process and
retrieves in another. The connector's writer also runs against Mooncake 0.3.13."""
import json
import os

from engines_common import reference_master, run_engine_worker

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lmcache_workers.py")
CHUNKS = 6


def _run(python, tmp_path, name, spec, compat):
    (tmp_path / f"{name}.spec.json").write_text(json.dumps(spec))
    return run_engine_worker(python, WORKER, tmp_path / f"{name}.spec.json", tmp_path / f"{name}.out.json",
                             tmp_path / f"{name}.log", compat=compat)


def test_lmcache_second_process_reads_byte_exact(engines_python, master, tmp_path):
    """The connector in both modes, then LMCacheEngine: store() of a prompt's KV
    (4 full chunks and a partial one) in the writer; in the reader lookup() and
    retrieve() bring back every full chunk, byte-exact, and nothing else."""
    spec = {"mode": "write", "master": master.address, "seed": 11, "chunks": CHUNKS,
            "engine_tokens": 4 * 256 + 100}
    every = {"exists": [1] * CHUNKS, "exact": [True] * CHUNKS}
    both = {"impl": "ours", "batch_put_from": every, "put_parts": every}  # save_chunk_meta False, True
    w = _run(engines_python, tmp_path, "write", spec, compat=True)
    assert w == dict(both, engine={"lookup": 4 * 256}), w
    r = _run(engines_python, tmp_path, "read", dict(spec, mode="read"), compat=True)
    assert r == dict(both, engine={"lookup": 4 * 256, "retrieved": 4 * 256, "exact": True,
                                   "rest_untouched": True}), r
    log = open(tmp_path / "write.log").read()
    assert "unknown key" not in log  # every key LMCache sends is one setup(config) knows


def test_lmcache_connector_on_reference_mooncake(engines_python, tmp_path):
    with reference_master(tmp_path) as m:
        spec = {"mode": "write", "master": m.address, "seed": 11, "chunks": CHUNKS, "reference": True}
        every = {"exists": [1] * CHUNKS, "exact": [True] * CHUNKS}
        w = _run(engines_python, tmp_path, "ref_write", spec, compat=False)
        assert w == {"impl": "reference", "batch_put_from": every, "put_parts": every}, w
