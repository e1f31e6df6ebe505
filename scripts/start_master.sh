#!/usr/bin/env bash
# Start a mooncake_cxl master. Usage:
#   scripts/start_master.sh [POOL_PATH] [POOL_SIZE_BYTES] [extra master flags...]
# Without POOL_PATH a 1 GiB pool file is created in /dev/shm. Binds 127.0.0.1
# unless MC_RPC_ADDRESS says otherwise; port from MC_RPC_PORT (default 50051),
# monitoring port from MC_METRICS_PORT (default 9003). The pool file is
# created mode 0600 (owner only: whoever reads it reads every value), or 0660
# owned by group MC_POOL_GROUP when that is set.
set -euo pipefail
pool="${1:-/dev/shm/mooncake_cxl_pool}"
size="${2:-$((1 << 30))}"
shift $(( $# > 2 ? 2 : $# ))
addr="${MC_RPC_ADDRESS:-127.0.0.1}"
port="${MC_RPC_PORT:-50051}"
metrics_port="${MC_METRICS_PORT:-9003}"
group="${MC_POOL_GROUP:-}"
if [ ! -e "$pool" ]; then
  (umask 077 && truncate -s "$size" "$pool")
  if [ -n "$group" ]; then
    chgrp "$group" "$pool" && chmod 0660 "$pool"
  else
    chmod 0600 "$pool"
  fi
  echo "created pool file $pool ($size bytes, mode $(stat -c %a "$pool"))"
fi
cat <<MSG
Connect from Python:
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    s.setup("$(hostname):0", "P2PHANDSHAKE", 0, 0, "cxl", "", "$addr:$port")
Watch it: python -m mooncake_cxl.top --url http://$addr:$metrics_port
MSG
exec mooncake_cxl_master --rpc_address="$addr" --rpc_port="$port" --enable_cxl=true \
  --metrics_host="$addr" --metrics_port="$metrics_port" --cxl_path="$pool" --cxl_size="$size" \
  ${group:+--pool_group="$group"} "$@"
