"""vLLM child processes for tests/vllm/test_vllm_*.py, run with the vLLM interpreter
(conftest's vllm_python): `build DIR MAX_LEN` writes a tiny random Llama and its
tokenizer; `child ARGS` is one vLLM process (mooncake_cxl.bench.pd_ttft's child:
prints `RESULT {json}` with per-prompt cached tokens and greedy tokens)."""
import sys

from mooncake_cxl.bench import pd_ttft

if __name__ == "__main__":
    if sys.argv[1] == "build":
        pd_ttft.build_model(sys.argv[2], layers=2, hidden=128, intermediate=256, max_pos=int(sys.argv[3]))
    else:
        sys.exit(pd_ttft.main(sys.argv[1:]))
