#!/usr/bin/env bash
# Install mooncake_cxl with its C++ unit tests, then run ctest and pytest.
#
# System packages (apt-get, when missing): googletest for the C++ tests, RE2
# (libre2-dev) for remove_by_regex, liburing-dev (+ pkg-config) for the SSD
# tier's io_uring reads, libcurl4-openssl-dev and nlohmann-json3-dev for the etcd
# client of --enable_ha, etcd-server and etcd-client for the HA tests (each starts its
# own etcd on 127.0.0.1),
# libibverbs1 for the reference Mooncake wheel (the oracle of the conformance
# suite). The reference client listens on 0.0.0.0, so pytest runs inside a
# private loopback-only network namespace (unshare -n) when that is possible;
# elsewhere the reference half of the conformance suite is skipped, with the
# reason. vLLM CPU (the vllm extra) goes into its own venv, .venv-vllm
# (python3-venv), for the tests that run real vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
[ -e /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
[ -e /usr/include/re2/re2.h ] || missing+=(libre2-dev)
[ -e /usr/include/liburing.h ] || missing+=(liburing-dev)
[ -e /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json3-dev)
[ -e /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -e /usr/include/curl/curl.h ] || missing+=(libcurl4-openssl-dev)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
command -v pkg-config >/dev/null || missing+=(pkg-config)
ldconfig -p | grep -q libibverbs.so.1 || missing+=(libibverbs1)
# The Transfer Engine (remote clients, tests/remote) also loads libnuma and libcurl.
ldconfig -p | grep -q libnuma.so.1 || missing+=(libnuma1)
ldconfig -p | grep -q libcurl.so.4 || missing+=(libcurl4)
command -v unshare >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
python3 -m pip install -q scikit-build-core pybind11 "cmake>=3.22" ninja
# One build serves both: the wheel's CMake build dir also holds the C++ tests.
python3 -m pip install -q --no-build-isolation ".[test,compare]" -C build-dir=build/ci \
  -C cmake.define.MCXL_BUILD_TESTS=ON
python3 -m pip install -q "mooncake-transfer-engine-non-cuda==0.3.13.post1" \
  || echo "note: the reference Mooncake wheel could not be installed; its tests will be skipped"
# The tensor methods' optional extra (.[torch]), pinned: an unpinned torch pulls a multi-GB CUDA build.
python3 -m pip install -q "torch==2.13.0" safetensors \
  || echo "note: torch could not be installed; the tensor tests will be skipped"
# vLLM CPU (the vllm extra) in a venv of its own on top of this interpreter's packages (torch,
# mooncake_cxl, ...), so vLLM's dependency pins cannot change the main test environment. The vLLM
# tests run vLLM in subprocesses of MCXL_VLLM_PYTHON; without it they are skipped, with the reason.
vllm_venv="$PWD/.venv-vllm"
vllm_reqs=$(python3 -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["vllm"]))')
if python3 -m venv --system-site-packages "$vllm_venv" \
    && "$vllm_venv/bin/pip" install -q $vllm_reqs \
    && "$vllm_venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec \
    && (cd / && "$vllm_venv/bin/python" -c "import vllm, mooncake_cxl"); then
  export MCXL_VLLM_PYTHON="$vllm_venv/bin/python"
else
  echo "note: vLLM ($vllm_reqs) could not be installed; the vLLM tests will be skipped"
fi
# SGLang and LMCache (their Mooncake backends, tests/engines) in a venv of their own on top of this
# interpreter's packages, with --no-deps and only what those backends' import chains need: their
# full requirements are CUDA builds and pins (transformers, numba, ...) that would change the main
# environment. SGLang's unconditional torchvision import is met by a stub on the tests' PYTHONPATH
# (tests/engines/no_torchvision). Without this venv the engine tests are skipped, with the reason.
engines_venv="$PWD/.venv-engines"
if python3 -m venv --system-site-packages "$engines_venv" \
    && "$engines_venv/bin/pip" install -q --no-deps sglang==0.5.23 lmcache==0.5.6 \
      aiofile==3.12.3 anyio==4.16.0 apache-tvm-ffi==0.1.15.post2 cachetools==8.0.2 caio==0.12.10 \
      compressed-tensors==0.20.1 dill==0.4.1 gguf==0.19.0 h11==0.16.0 httpcore2==2.16.2 \
      httpx2==2.16.2 huggingface_hub==2.4.0 llvmlite==0.50.0 loguru==0.7.3 msgspec==0.23.0 \
      numba==0.68.1 psutil==7.2.2 pybase64==1.5.1 pyzmq==27.3.0 sentencepiece==0.2.3 \
      starlette==1.10.0 tokenizers==0.23.3 transformers==5.25.0 triton==3.9.0 truststore==0.10.5; then
  export MCXL_ENGINES_PYTHON="$engines_venv/bin/python"
else
  echo "note: SGLang/LMCache could not be installed; the engine tests will be skipped"
fi
ctest --test-dir build/ci --output-on-failure
if [ "$(id -u)" = 0 ] && unshare -n true 2>/dev/null; then
  # Then the conformance suite and vLLM's MooncakeStoreConnector once more, every store a
  # remote client (over the Transfer Engine).
  exec unshare -n -- bash -c 'ip link set lo up && MCXL_ORACLE_NETNS=1 python3 -m pytest -q tests "$@" &&
    MCXL_TEST_REMOTE=1 MC_CXL_REMOTE=1 python3 -m pytest -q tests/compat/test_conformance.py -k mooncake_cxl &&
    MCXL_TEST_REMOTE=1 MC_CXL_REMOTE=1 python3 -m pytest -q tests/vllm/test_vllm_mooncake_connector.py' _ "$@"
fi
python3 -m pytest -q tests "$@"
