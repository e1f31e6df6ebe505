"""A vLLM process for tests/vllm/test_vllm_connector.py, driven over stdin/stdout:
prints READY after the engine is up, then for each JSON line
{"prompt": [ids], "max_tokens": n, "params": {kv_transfer_params}} prints
RESULT {"tokens": [...], "cached": num_cached_tokens, "s": seconds}.
One process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so killing it kills its producer.
`build DIR LAYERS VOCAB MAX_POS` writes the tiny random Llama (scripts/vllm_pd_demo.py)
and exits: the test process itself needs neither torch nor vLLM."""
import argparse
import json
import os
import sys
import time


def build(path, layers, vocab, max_pos):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, os.pardir, os.pardir, "scripts"))  # tests/vllm/ -> the repository
    from vllm_pd_demo import build_model
    build_model(path, int(layers), int(vocab), int(max_pos))


def main():
    if sys.argv[1:2] == ["build"]:
        return build(*sys.argv[2:6])
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--role", default="none")  # none: no connector (recompute)
    p.add_argument("--master", default="")
    p.add_argument("--channel", default="mcxl-test")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-batched", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=32)
    a = p.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {}
    if a.role != "none":
        kw["kv_transfer_config"] = {
            "kv_connector": "MooncakeCXLConnector", "kv_connector_module_path": "mooncake_cxl.vllm",
            "kv_role": a.role, "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"master_server_address": a.master, "channel": a.channel,
                                          "wait_timeout_s": 60}}
    llm = LLM(model=a.model, dtype="bfloat16", max_model_len=a.max_model_len, block_size=a.block_size,
              enable_prefix_caching=True, max_num_batched_tokens=a.max_batched, max_num_seqs=4,
              enforce_eager=True, compilation_config={"mode": 0}, **kw)
    print("READY", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        extra = {"kv_transfer_params": cmd["params"]} if cmd.get("params") else None
        sp = SamplingParams(temperature=0, max_tokens=cmd.get("max_tokens", 8), ignore_eos=True, extra_args=extra)
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=cmd["prompt"])], sp, use_tqdm=False)[0]
        res = {"tokens": list(out.outputs[0].token_ids), "cached": out.num_cached_tokens,
               "s": time.perf_counter() - t0}
        print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
