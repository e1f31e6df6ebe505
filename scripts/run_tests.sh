#!/usr/bin/env bash
# Install mooncake_cxl with its C++ unit tests, then run ctest and pytest.
# Needs googletest (Debian: libgtest-dev); installs it with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -e /usr/include/gtest/gtest.h ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libgtest-dev >/dev/null
fi
python3 -m pip install -q scikit-build-core pybind11 pytest numpy
# One build serves both: the wheel's CMake build dir also holds the C++ tests.
python3 -m pip install -q --no-build-isolation . -C build-dir=build/ci \
  -C cmake.define.MCXL_BUILD_TESTS=ON
ctest --test-dir build/ci --output-on-failure
python3 -m pytest -q tests "$@"
