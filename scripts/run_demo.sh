#!/usr/bin/env bash
# Install mooncake_cxl and run the demo (master + writer + reader processes).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q .
cd /tmp && python3 -m mooncake_cxl.demo
