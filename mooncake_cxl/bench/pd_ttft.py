"""TTFT in vLLM, the `pd` section's TTFT part: python -m mooncake_cxl.bench --only pd.

A prompt's KV is written to a store by one vLLM process (the prefill side,
"store") and a second, fresh vLLM process (the decode side, "load") answers
the same prompt with max_tokens=1; its TTFT is that generate call's wall time.
Rows:
  recompute        a vLLM process without a connector (computes every token)
  vllm-on-ours     vLLM's own MooncakeStoreConnector, MOONCAKE_CXL_COMPAT=1, our pool
  ours             our connector (mooncake_cxl.vllm, "MooncakeCXLConnector"), when importable
  vllm-on-mooncake vLLM's MooncakeStoreConnector on Mooncake 0.3.13 (the oracle wheel),
                   standalone-store mode: mooncake_master plus a segment-holding client
                   process (its embedded mode loses the prefill segment when prefill exits);
                   protocol tcp on loopback, so this section runs under `unshare -n`
The model is a random Llama built locally (no hub) whose KV is realistic in
bytes per token: 16 layers x 8 KV heads x 64 dims x K,V x bf16 = 32 KiB/token,
with small hidden/MLP widths so that 2 cores can compute it. Each vLLM process
runs its engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the store's
methods can be timed there: "store s" is the time spent inside store calls
during the timed generate (vLLM's connector loads in a thread, so that is the
share of the TTFT the store holds). One process per role serves every prompt
length (distinct prompts per length). Our pool's rows map its pages at start
(master --prefault_pool, MC_CXL_PREFAULT=1), as the other sections do.

30k-token prompts are not in the default run: on 2 cores one 30k prefill of
this model takes ~5 minutes and the section needs four of them; run
`python -m mooncake_cxl.bench --only pd --pd-parts ttft --pd-tokens 2048,8192,30720`
(or `python -m mooncake_cxl.bench.pd_ttft --tokens ...`) for them. The model's
max_position_embeddings, vLLM's max_model_len, its CPU KV cache
(VLLM_CPU_KVCACHE_SPACE) and the pool are sized for the longest prompt; the
parallel-load pair runs at min(longest, 8192) tokens (PARALLEL_MAX) unless told. The child side (`child_main`) is
also what tests/vllm/test_vllm_mooncake_connector.py runs.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from .. import extras
from . import reference
from .common import wait_or_kill

LAYERS, KV_HEADS, HEAD_DIM = 16, 8, 64
KV_BYTES_PER_TOKEN = LAYERS * KV_HEADS * HEAD_DIM * 2 * 2  # K and V, bf16
TOKENS = (2048, 8192)
QUICK_TOKENS = (512,)
PARALLEL_MAX = 8192  # the parallel-load pair's default prompt: two more prefills of this length
BLOCK = 128  # vLLM CPU's block size; the connector stores one key per full block

VLLM_ENV = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
_TIMED_PREFIXES = ("batch_", "get", "put", "is_exist", "remove", "exist")


def vllm_python():
    """The Python that runs vLLM: MCXL_VLLM_PYTHON (a vLLM venv), else this one."""
    return os.environ.get("MCXL_VLLM_PYTHON") or sys.executable


def require_vllm(python):
    """Raises MissingExtra when `python` cannot import vllm."""
    if python == sys.executable:
        extras.require("TTFT in vLLM (--only pd)", "vllm")
        return
    probe = subprocess.run([python, "-c", "import importlib.util, sys; "
                            "sys.exit(importlib.util.find_spec('vllm') is None)"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        raise extras.MissingExtra(f"TTFT in vLLM (--only pd) needs vLLM in {python} (MCXL_VLLM_PYTHON): "
                                  f"{extras.install_hint('vllm')} there")


# ---------------------------------------------------------------- the model

def build_model(path, layers=LAYERS, hidden=256, intermediate=512, vocab=1000, max_pos=8448):
    """A random Llama (8 KV heads x head_dim 64, bf16) and a WordLevel tokenizer,
    saved in `path`. Needs torch, transformers, tokenizers (vLLM's own deps)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(vocab_size=vocab,
                                        special_tokens=["<unk>", "<s>", "</s>", "<pad>"])
    tok.train_from_iterator([" ".join(f"w{i}" for i in range(vocab - 8))] * 2, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.model_max_length = max_pos
    fast.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=KV_HEADS, num_key_value_heads=KV_HEADS,
                      head_dim=HEAD_DIM, max_position_embeddings=max_pos,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                      pad_token_id=fast.pad_token_id, torch_dtype="bfloat16")
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


def prompt_ids(n, vocab, seed):
    rng = random.Random(seed)
    return [rng.randrange(8, vocab) for _ in range(n)]


# ---------------------------------------------------------------- the child (one vLLM process)

class _Timer:
    """Wraps a store class so every data-path method call is timed (summed per name)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.spent = {}
        self.in_flight = 0
        self.last_activity = time.monotonic()

    def drain(self, quiet_s=3.0, limit_s=900.0):
        """Waits until no timed call is running and none started for quiet_s: vLLM's
        connectors save from a background thread after the request has answered (a 30k-token
        put into Mooncake's TCP store takes seconds), and exiting earlier loses the blocks."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            with self.lock:
                idle = self.in_flight == 0 and time.monotonic() - self.last_activity >= quiet_s
            if idle:
                return True
            time.sleep(0.1)
        return False

    def take(self):
        with self.lock:
            out, self.spent = self.spent, {}
        return out

    def wrap_class(self, module, name):
        real = getattr(module, name)
        timer = self

        class Timed:
            def __init__(self, *a, **k):
                self._real = real(*a, **k)

            def __getattr__(self, attr):
                f = getattr(self._real, attr)
                if not callable(f) or not attr.startswith(_TIMED_PREFIXES):
                    return f

                def timed(*a, **k):
                    with timer.lock:
                        timer.in_flight += 1
                    t0 = time.perf_counter()
                    try:
                        return f(*a, **k)
                    finally:
                        dt = time.perf_counter() - t0
                        with timer.lock:
                            n, s = timer.spent.get(attr, (0, 0.0))
                            timer.spent[attr] = (n + 1, s + dt)
                            timer.in_flight -= 1
                            timer.last_activity = time.monotonic()
                return timed

        Timed.__name__ = name
        setattr(module, name, Timed)


def _kv_config(connector, role):
    if connector == "mooncake":
        return {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
    if connector == "ours":
        return {"kv_connector": "MooncakeCXLConnector", "kv_connector_module_path": "mooncake_cxl.vllm",
                "kv_role": {"store": "kv_producer", "load": "kv_consumer"}.get(role, "kv_both"),
                "kv_load_failure_policy": "recompute",
                # a consumer may wait for a whole 8k prefill on 2 busy cores
                "kv_connector_extra_config": {"master_server_address": os.environ.get("MCXL_MASTER", ""),
                                              "channel": os.environ.get("MCXL_PD_CHANNEL", "mcxl-vllm-pd"),
                                              "wait_timeout_s": 900}}
    return None


def child_main(argv=None):
    """One vLLM process. Prints one line `RESULT {json}`: per prompt length its
    TTFT, cached tokens, greedy tokens and time inside store calls."""
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", default="2048", help="comma-separated prompt lengths")
    p.add_argument("--max-len", type=int, default=8448)
    p.add_argument("--connector", choices=("none", "mooncake", "ours"), default="none")
    p.add_argument("--role", default="both", help="store | load | both (our connector's kv_role)")
    p.add_argument("--gen", type=int, default=0, help="also generate this many greedy tokens")
    p.add_argument("--reset", action="store_true",
                   help="then reset_prefix_cache(reset_connector=True) and run each prompt again")
    p.add_argument("--eager", action="store_true",
                   help="no torch.compile (tests: a much faster start; the benchmark compiles)")
    p.add_argument("--serve", action="store_true",
                   help="after the warm-up print READY, then answer stdin lines {\"tokens\": n, \"seed\": s} "
                        "with RESULT lines (the parallel-load run drives two processes so)")
    args = p.parse_args(argv)
    timer = _Timer()
    if args.connector == "mooncake":
        import mooncake.store  # ours when MOONCAKE_CXL_COMPAT=1, else the real wheel
        timer.wrap_class(mooncake.store, "MooncakeDistributedStore")
    elif args.connector == "ours":
        import mooncake_cxl
        import mooncake_cxl.store
        for mod in (mooncake_cxl, mooncake_cxl.store):
            timer.wrap_class(mod, "MooncakeDistributedStore")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {}
    kvc = _kv_config(args.connector, args.role)
    if kvc:
        kw["kv_transfer_config"] = kvc
    if args.eager:
        kw.update(enforce_eager=True, compilation_config={"mode": 0})
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=args.max_len, enable_prefix_caching=True,
              max_num_batched_tokens=args.max_len, **kw)
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    one = SamplingParams(temperature=0, max_tokens=1)
    # Warm-up: one short partial block (never stored), so the timed call pays no first-call costs.
    llm.generate([TokensPrompt(prompt_token_ids=prompt_ids(64, vocab, 7))], one, use_tqdm=False)

    def once(n, seed=None, params=None):
        ids = prompt_ids(n, vocab, n if seed is None else seed)
        sp = SamplingParams(temperature=0, max_tokens=1,
                            extra_args={"kv_transfer_params": params} if params else None)
        timer.take()
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)
        ttft = time.perf_counter() - t0
        spent = timer.take()
        r = {"ttft_s": ttft, "num_cached_tokens": out[0].num_cached_tokens,
             "first": list(out[0].outputs[0].token_ids),
             "store_s": sum(s for _, s in spent.values()),
             "store_calls": {k: [c, round(s, 6)] for k, (c, s) in spent.items()}}
        if args.gen:
            many = llm.generate([TokensPrompt(prompt_token_ids=ids)],
                                SamplingParams(temperature=0, max_tokens=args.gen), use_tqdm=False)
            r["tokens"] = list(many[0].outputs[0].token_ids)
        return r

    if args.serve:
        print("READY", flush=True)
        for line in sys.stdin:
            if line.strip():
                cmd = json.loads(line)
                print("RESULT " + json.dumps(once(int(cmd["tokens"]), cmd.get("seed"), cmd.get("params"))),
                      flush=True)
        os._exit(0)
    res = {"runs": {}}
    for n in (int(x) for x in args.tokens.split(",")):
        r = res["runs"][str(n)] = once(n)
        if args.connector != "none":
            # The connector saves from a background thread after answering: wait for it (so the
            # next prompt's window holds only its own calls and nothing is lost at exit).
            r["drained"] = timer.drain()
            r["after_calls"] = {k: [c, round(s, 6)] for k, (c, s) in timer.take().items()}
    if args.reset:
        res["reset_ok"] = llm.reset_prefix_cache(reset_connector=True)
        res["after_reset"] = {str(n): once(int(n)) for n in res["runs"]}
    print("RESULT " + json.dumps(res), flush=True)
    os._exit(0)  # vLLM's shutdown can hang on a 2-core machine; the result is out


def run_child(python, args, env, log_path, timeout=1800, argv_prefix=None):
    """Runs child_main in a fresh `python` (optionally behind argv_prefix, e.g. the
    compat runner) in the log's directory (never a source tree, whose mooncake_cxl/
    has no built _core); returns its RESULT dict, or raises with the log's tail."""
    cmd = list(argv_prefix or [python, "-m", "mooncake_cxl.bench.pd_ttft"]) + ["child"] + list(args)
    with open(log_path, "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                            stdin=subprocess.DEVNULL, cwd=os.path.dirname(os.path.abspath(log_path))).returncode
    text = open(log_path).read()
    lines = [l for l in text.splitlines() if l.startswith("RESULT ")]
    if rc != 0 or not lines:
        raise RuntimeError(f"vLLM child failed (rc={rc}); {log_path}:\n{text[-3000:]}")
    return json.loads(lines[-1][7:])


def vllm_env(**extra):
    """os.environ with VLLM_ENV, without the compat switch unless `extra` sets it."""
    env = dict(os.environ, **VLLM_ENV)
    env.pop("MOONCAKE_CXL_COMPAT", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


_vllm_env = vllm_env


# ---------------------------------------------------------------- the benchmark

def _ours_available(python):
    return subprocess.run([python, "-c", "import mooncake_cxl.vllm as m; m.MooncakeCXLConnector"],
                          capture_output=True, cwd=tempfile.gettempdir()).returncode == 0


class _MooncakeSegmentHolder:
    """A real Mooncake client that mounts the global segment and stays up
    (standalone-store mode: the vLLM processes mount nothing)."""

    CODE = r"""
import socket, sys, time
from mooncake.store import MooncakeDistributedStore
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
st = MooncakeDistributedStore()
rc = st.setup(f"127.0.0.1:{port}", "P2PHANDSHAKE", int(sys.argv[2]), 64 << 20, "tcp", "", sys.argv[1])
print("READY", rc, flush=True)
if rc == 0:
    sys.stdin.read()
"""

    def __init__(self, python, address, segment, log_path):
        self.proc = subprocess.Popen([python, "-c", self.CODE, address, str(segment)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(log_path, "w"), text=True, env=vllm_env(),
                                     cwd=os.path.dirname(log_path))
        line = self.proc.stdout.readline().split()
        if line[:2] != ["READY", "0"]:
            self.stop()
            raise RuntimeError(f"Mooncake segment holder failed: {line}; see {log_path}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.terminate()
            self.proc.wait(30)


ROWS = ("recompute", "vllm-on-ours", "ours", "vllm-on-mooncake")


class _Served:
    """A child in --serve mode: READY once warmed up, then one RESULT per request."""

    def __init__(self, python, args, env, log_path):
        import queue
        self.lines = queue.Queue()
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([python, "-m", "mooncake_cxl.bench.pd_ttft", "child", *args, "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, cwd=os.path.dirname(os.path.abspath(log_path)))
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            if line.startswith(("READY", "RESULT ")):
                self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout=1800):
        line = self.lines.get(timeout=timeout)
        if line is None:
            raise RuntimeError(f"vLLM child exited (rc={self.proc.wait()}); see {self.log.name}")
        return json.loads(line[7:]) if line.startswith("RESULT ") else line.strip()

    def send(self, tokens, seed, params=None):
        self.proc.stdin.write(json.dumps({"tokens": tokens, "seed": seed, "params": params}) + "\n")
        self.proc.stdin.flush()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            wait_or_kill(self.proc, 60)
        self.log.close()


def parallel_load(python, model, n, max_len, env, log_dir):
    """Our connector, a producer (prefill) and a consumer (decode) process, both
    warmed up. "parallel": the same new prompt goes to both at once, the consumer
    waiting on the producer's announcements; "after": another new prompt goes to
    the consumer once the producer has answered it. Decode TTFT counts from the
    moment the prompt was sent to it."""
    args = ["--model", model, "--max-len", str(max_len), "--connector", "ours"]
    prod = _Served(python, args + ["--role", "store"], env, os.path.join(log_dir, "parallel_producer.log"))
    cons = _Served(python, args + ["--role", "load"], env, os.path.join(log_dir, "parallel_consumer.log"))
    try:
        assert prod.next() == "READY" and cons.next() == "READY"
        t0 = time.perf_counter()
        prod.send(n, 10_001)
        cons.send(n, 10_001, {"mcxl_wait_s": 900})  # wait for this request's producer, not yet announced
        rp, rc = prod.next(), cons.next()
        par = {"decode_ttft_s": rc["ttft_s"], "end_to_end_s": time.perf_counter() - t0,
               "prefill_ttft_s": rp["ttft_s"], "cached": rc["num_cached_tokens"], "store_s": rc["store_s"],
               "same_first": rp["first"] == rc["first"]}
        t0 = time.perf_counter()
        prod.send(n, 10_002)
        rp = prod.next()
        cons.send(n, 10_002)
        rc = cons.next()
        after = {"decode_ttft_s": rc["ttft_s"], "end_to_end_s": time.perf_counter() - t0,
                 "prefill_ttft_s": rp["ttft_s"], "cached": rc["num_cached_tokens"], "store_s": rc["store_s"],
                 "same_first": rp["first"] == rc["first"]}
        return {"tokens": n, "parallel": par, "after": after}
    finally:
        prod.stop()
        cons.stop()


def _attempt(res, name, fn):
    try:
        fn()
    except Exception as e:  # a row that fails says why; the others still run
        res["rows"][name] = {"error": f"{type(e).__name__}: {str(e)[-600:]}"}


def run(quick=False, pool_dir="/dev/shm", python=None, tokens=None, log_dir=None, rows=ROWS,
        parallel=True, parallel_tokens=None):
    """The TTFT rows (and the parallel-load pair); returns a dict for markdown()."""
    from mooncake_cxl.launch import MasterProcess

    python = python or vllm_python()
    tokens = tuple(tokens or (QUICK_TOKENS if quick else TOKENS))
    toks = ",".join(map(str, tokens))
    max_len = max(tokens) + 256
    work = tempfile.mkdtemp(prefix="mcxl_pd_ttft_")
    log_dir = log_dir or work
    model = os.path.join(work, "model")
    # vLLM's CPU KV cache (GiB): room for two prompts of the longest length (1 up to 8k tokens)
    kv_space = max(1, -(-2 * max_len * KV_BYTES_PER_TOKEN // (1 << 30)))

    def vllm_env(**extra):  # noqa: F811 (this run's KV cache size)
        return _vllm_env(VLLM_CPU_KVCACHE_SPACE=kv_space, **extra)
    res = {"tokens": list(tokens), "kv_bytes_per_token": KV_BYTES_PER_TOKEN, "model": {
        "layers": LAYERS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "hidden": 256, "intermediate": 512},
        "rows": {}, "log_dir": log_dir, "python": python}
    subprocess.run([python, "-c", "import sys; from mooncake_cxl.bench.pd_ttft import build_model; "
                    "build_model(sys.argv[1], max_pos=int(sys.argv[2]))", model, str(max_len)],
                   check=True, env=vllm_env(), cwd=work)
    t_start = time.monotonic()

    def record(name, a, b):
        res["rows"][name] = {str(n): {"ttft_s": b["runs"][str(n)]["ttft_s"],
                                      "store_s": b["runs"][str(n)]["store_s"],
                                      "cached": b["runs"][str(n)]["num_cached_tokens"],
                                      "store_calls": b["runs"][str(n)]["store_calls"],
                                      "prefill_ttft_s": a["runs"][str(n)]["ttft_s"] if a else None,
                                      "first": b["runs"][str(n)]["first"]} for n in tokens}

    def pair(name, connector, env):
        common_args = ["--model", model, "--tokens", toks, "--max-len", str(max_len), "--connector", connector]
        a = run_child(python, common_args + ["--role", "store"], env, os.path.join(log_dir, f"{name}_store.log"))
        b = run_child(python, common_args + ["--role", "load"], env, os.path.join(log_dir, f"{name}_load.log"))
        record(name, a, b)

    if "recompute" in rows:
        _attempt(res, "recompute", lambda: record("recompute", None, run_child(
            python, ["--model", model, "--tokens", toks, "--max-len", str(max_len)], vllm_env(),
            os.path.join(log_dir, "recompute.log"))))
    # vLLM's connector and ours, on our pool
    pool = os.path.join(pool_dir, f"mcxl_pd_ttft_{os.getpid()}.pool")
    ours_ok = _ours_available(python)
    par_n = parallel_tokens or min(max(tokens), max(PARALLEL_MAX, min(tokens)))
    # Both rows on our pool store every prompt once, the parallel pair two more prompts.
    pool_size = (2 * sum(tokens) + 2 * par_n) * KV_BYTES_PER_TOKEN * 5 // 4 + (512 << 20)
    if {"vllm-on-ours", "ours"} & set(rows) or parallel:
        # Pool pages mapped at start (master --prefault_pool, clients MC_CXL_PREFAULT=1), as a
        # serving process has them after its first requests and as the other sections run.
        master = MasterProcess(pool, pool_size, log_path=os.path.join(log_dir, "master.log"),
                               extra_flags=["--prefault_pool"])
        try:
            master.start()
            cfg_path = os.path.join(work, "mooncake_cxl.json")
            json.dump({"metadata_server": "P2PHANDSHAKE", "master_server_address": master.address,
                       "protocol": "cxl", "device_name": "", "mode": "standalone-store",
                       "global_segment_size": 0, "local_buffer_size": "64MB"}, open(cfg_path, "w"))
            if "vllm-on-ours" in rows:
                _attempt(res, "vllm-on-ours", lambda: pair("vllm-on-ours", "mooncake", vllm_env(
                    MOONCAKE_CXL_COMPAT=1, MOONCAKE_CONFIG_PATH=cfg_path, MC_CXL_PREFAULT=1)))
            if "ours" in rows:
                if ours_ok:
                    _attempt(res, "ours", lambda: pair("ours", "ours", vllm_env(
                        MCXL_MASTER=master.address, MCXL_PD_CHANNEL="ttft", MC_CXL_PREFAULT=1)))
                else:
                    res["rows"]["ours"] = {"error": "not available (mooncake_cxl.vllm.MooncakeCXLConnector "
                                                    "not importable)"}
            if parallel and ours_ok:
                n = par_n
                try:
                    res["parallel"] = parallel_load(python, model, n, max_len, vllm_env(
                        MCXL_MASTER=master.address, MCXL_PD_CHANNEL="parallel", MC_CXL_PREFAULT=1), log_dir)
                except Exception as e:
                    res["parallel"] = {"error": f"{type(e).__name__}: {str(e)[-600:]}"}
            elif parallel:
                res["parallel"] = {"error": "not available: our connector (mooncake_cxl.vllm) is not importable"}
        finally:
            master.stop()
            if os.path.exists(pool):
                os.unlink(pool)
    # vLLM's connector on Mooncake 0.3.13, standalone-store
    if "vllm-on-mooncake" in rows:
        if not reference.loopback_only():
            res["rows"]["vllm-on-mooncake"] = {"error": "not run: needs a loopback-only network namespace "
                                                        "(python -m mooncake_cxl.bench --only pd re-executes "
                                                        "itself under `unshare -n`)"}
        else:
            # Mooncake's TCP transport queues a bounded number of transfers per peer; a 30k-token
            # prompt's put (240 keys x 16 layer slices) overflows the default ("TCP lane queue-full
            # rejection") and the put fails: raise the bound (the reference's own knob).
            os.environ.setdefault("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "32768")  # 65536 is rejected

            def reference():
                with reference.ReferenceMaster(os.path.join(log_dir, "mooncake_master.log")) as ref:
                    holder = _MooncakeSegmentHolder(python, ref.address, pool_size,
                                                    os.path.join(log_dir, "mooncake_holder.log"))
                    try:
                        cfg_path = os.path.join(work, "mooncake.json")
                        json.dump({"metadata_server": "P2PHANDSHAKE", "master_server_address": ref.address,
                                   "protocol": "tcp", "device_name": "", "mode": "standalone-store",
                                   "global_segment_size": 0, "local_buffer_size": "64MB"}, open(cfg_path, "w"))
                        pair("vllm-on-mooncake", "mooncake", vllm_env(MOONCAKE_CONFIG_PATH=cfg_path))
                    finally:
                        holder.stop()
            _attempt(res, "vllm-on-mooncake", reference)
    res["wall_seconds"] = round(time.monotonic() - t_start, 1)
    shutil.rmtree(model, ignore_errors=True)
    return res


ROW_NAMES = {"recompute": "recompute (no connector)",
             "vllm-on-ours": "vLLM MooncakeStoreConnector on mooncake_cxl (compat)",
             "ours": "our connector (mooncake_cxl.vllm)",
             "vllm-on-mooncake": "vLLM MooncakeStoreConnector on Mooncake 0.3.13 (standalone-store, tcp)"}


def markdown(res):
    toks = res["tokens"]
    m = res["model"]
    lines = [f"TTFT of a second vLLM process (max_tokens=1), random Llama {m['layers']} layers x "
             f"{m['kv_heads']} KV heads x {m['head_dim']} (bf16, {res['kv_bytes_per_token'] // 1024} KiB "
             f"KV/token); store = time inside store calls during that request; hits = external "
             "prefix-cache hits (tokens).", ""]
    head = "| row | " + " | ".join(f"{n:,} tok: TTFT (store, hits)" for n in toks) + " |"
    lines += [head, "|---|" + "---|" * len(toks)]
    for key, name in ROW_NAMES.items():
        row = res["rows"].get(key)
        if row is None:
            continue
        if "error" in row:
            lines.append(f"| {name} | " + " | ".join([row["error"].splitlines()[0][:120]] * 1 +
                                                     ["—"] * (len(toks) - 1)) + " |")
            continue
        cells = []
        for n in toks:
            r = row[str(n)]
            if key == "recompute":
                cells.append(f"{r['ttft_s']:.3f} s")
            else:
                share = 100 * r["store_s"] / r["ttft_s"] if r["ttft_s"] else 0
                cells.append(f"{r['ttft_s']:.3f} s ({r['store_s'] * 1e3:.1f} ms = {share:.0f}%, "
                             f"{r['cached']})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    par = res.get("parallel")
    if par is not None:
        lines += ["", "Parallel load (our connector): decode TTFT when the decode process gets the prompt "
                  "at the same time as the prefill process (it waits on the prefill's announcements) vs "
                  "once the prefill has answered it. Both processes warmed up and running.", ""]
        if "error" in par:
            lines.append(f"parallel load: {par['error'].splitlines()[0][:200]}")
        else:
            lines += [f"| {par['tokens']:,}-token prompt, decode starts | decode TTFT (store) | prompt sent → "
                      "first decode token | prefill TTFT | decode's external hits | same first token |",
                      "|---|---|---|---|---|---|"]
            for key, name in (("parallel", "with the prefill"), ("after", "after the prefill")):
                r = par[key]
                lines.append(f"| {name} | {r['decode_ttft_s']:.3f} s ({r['store_s'] * 1e3:.1f} ms) | "
                             f"{r['end_to_end_s']:.3f} s | {r['prefill_ttft_s']:.3f} s | {r['cached']} | "
                             f"{'yes' if r['same_first'] else 'NO'} |")
    lines.append("")
    lines.append(f"({res.get('wall_seconds', 0):.0f} s; logs in {res.get('log_dir')})")
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "child":
        return child_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m mooncake_cxl.bench.pd_ttft")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokens", help="comma-separated prompt lengths")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated: " + ", ".join(ROWS))
    ap.add_argument("--no-parallel", action="store_true", help="skip the parallel-load pair")
    ap.add_argument("--parallel-tokens", type=int, help=f"its prompt length (default min(longest, {PARALLEL_MAX}))")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        require_vllm(vllm_python())
    except extras.MissingExtra as e:
        print(f"{ap.prog}: {e}", file=sys.stderr)
        return extras.EXIT_MISSING
    if reference.loopback_only():
        reference.bring_loopback_up()
    res = run(quick=args.quick, tokens=[int(x) for x in args.tokens.split(",")] if args.tokens else None,
              rows=args.rows.split(","), parallel=not args.no_parallel, parallel_tokens=args.parallel_tokens)
    print(markdown(res))
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
