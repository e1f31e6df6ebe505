#!/usr/bin/env bash
# Run Mooncake's own store test files (mooncake-wheel/tests/ of Mooncake's
# repository: test_distributed_object_store.py, test_distributed_object_store_cxl.py,
# test_put_get_tensor.py, test_batch_replica_clear.py, test_dummy_client.py) against
# mooncake_cxl through the compat shim (MOONCAKE_CXL_COMPAT=1), as a Mooncake user
# would: a master on 127.0.0.1:50051 (the files' MASTER_SERVER default), a standalone
# client on 127.0.0.1:50052 for the dummy-client file, each file with its own fresh master.
#
#   scripts/run_mooncake_tests.sh DIR [--reference] [-k EXPR] [FILE...]
#
# DIR holds the files (this script fetches nothing and the files are not part of this
# repository). FILE names restrict the run to those files of DIR. --reference runs the
# same files against the real Mooncake wheel (mooncake-transfer-engine-non-cuda
# 0.3.13.post1 must be importable by $REF_PYTHON) with its mooncake_master and
# mooncake_client instead. Everything runs inside a private network namespace
# (`unshare -n`, loopback only; needs root), because the reference client and the
# files' fixed ports (50051, 50052, 8080) must not meet anything else on the machine.
#
# Environment: PYTHON (ours; default: the python that imports mooncake_cxl),
# REF_PYTHON (default python3), DEFAULT_KV_LEASE_TTL (ms the files sleep before removes,
# default 5500: the masters run with a 5000 ms lease, the margin keeps a remove from
# racing the lease end), OUT (directory for logs and junit files; default a temp dir).
# Prints one line per test function and, per file, "FILE: N passed, N failed, N skipped".
set -uo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage;; esac

# Into a private network namespace first (once).
if [ "${MCXL_MCTESTS_NETNS:-}" != 1 ]; then
  command -v unshare >/dev/null || { echo "unshare not found (util-linux)" >&2; exit 2; }
  exec unshare -n -- bash -c 'ip link set lo up && MCXL_MCTESTS_NETNS=1 exec bash "$0" "$@"' "$0" "$@"
fi

dir=$(cd "$1" && pwd) || { echo "no directory $1" >&2; exit 2; }
shift
mode=ours
kexpr=()
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --reference) mode=reference;;
    -k) kexpr=(-k "$2"); shift;;
    *) files+=("$1");;
  esac
  shift
done
if [ ${#files[@]} -eq 0 ]; then
  files=(test_distributed_object_store.py test_distributed_object_store_cxl.py
         test_put_get_tensor.py test_batch_replica_clear.py test_dummy_client.py)
fi

py_ours="${PYTHON:-}"
if [ -z "$py_ours" ]; then
  for cand in python3 python; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import mooncake_cxl' 2>/dev/null; then
      py_ours=$(command -v "$cand"); break
    fi
  done
fi
py_ref="${REF_PYTHON:-python3}"
out="${OUT:-$(mktemp -d /tmp/mooncake_tests_run.XXXXXX)}"
mkdir -p "$out"
lease_ms=5000
export DEFAULT_KV_LEASE_TTL="${DEFAULT_KV_LEASE_TTL:-5500}"
# The files' defaults, spelled out (Mooncake's CI sets the same).
export MASTER_SERVER=127.0.0.1:50051
export MC_METADATA_SERVER=http://127.0.0.1:8080/metadata
export LOCAL_HOSTNAME=localhost

if [ "$mode" = ours ]; then
  [ -n "$py_ours" ] || { echo "no python imports mooncake_cxl; set PYTHON" >&2; exit 2; }
  py="$py_ours"
  bindir=$(dirname "$py")
  # The binaries installed beside that python (another install may be first on PATH).
  master_bin="$bindir/mooncake_cxl_master"; [ -x "$master_bin" ] || master_bin=$(command -v mooncake_cxl_master)
  client_bin="$bindir/mooncake_cxl_client"; [ -x "$client_bin" ] || client_bin=$(command -v mooncake_cxl_client)
  export MOONCAKE_CXL_COMPAT=1
else
  py="$py_ref"
  refdir=$("$py" -c 'import importlib.util as u, os; s = u.find_spec("mooncake"); print(next(l for l in s.submodule_search_locations if os.path.exists(os.path.join(l, "mooncake_master"))))') \
    || { echo "the reference wheel is not importable by $py" >&2; exit 2; }
  master_bin="$refdir/mooncake_master"
  client_bin="$refdir/mooncake_client"
  unset MOONCAKE_CXL_COMPAT
  # The transfer engine looks for a LAN address unless told where to bind (there is
  # none in a loopback-only namespace: setup would fail with -1).
  export MC_TCP_BIND_ADDRESS=127.0.0.1
fi
echo "mode=$mode python=$py master=$master_bin logs=$out"

pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  pids=()
}
trap stop_all EXIT

wait_port() {  # wait_port PORT PID: until something listens on 127.0.0.1:PORT
  for _ in $(seq 1 200); do
    kill -0 "$2" 2>/dev/null || return 1
    (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

total_fail=0
summary=()
for f in "${files[@]}"; do
  path="$dir/$f"
  name=$(basename "$f" .py)
  [ -f "$path" ] || { echo "missing $path" >&2; summary+=("$name: missing"); total_fail=1; continue; }
  work=$(mktemp -d /dev/shm/mctests_${name}.XXXXXX)
  chmod 700 "$work"
  pool="$work/pool"
  cxl=0
  case "$name" in *cxl*) cxl=1;; esac
  # The CXL file makes its pool file itself at $TMPDIR/tmp_dax_sim (8 GiB, sparse),
  # removes it after each test class and sets MC_CXL_DEV_PATH; the master is told the
  # same path before the file exists.
  [ $cxl = 1 ] && pool="$work/tmp_dax_sim"
  if [ "$mode" = ours ]; then
    if [ $cxl = 0 ]; then
      (umask 077 && truncate -s $((2 << 30)) "$pool")
      export MC_CXL_DEV_PATH="$pool"
    fi
    extra=()
    # The CXL file's pool does not exist yet: the master creates it at --cxl_size
    # (the reference master's default, and the size the file truncates it to).
    [ $cxl = 1 ] && extra=(--cxl_size=$((8 << 30)))
    "$master_bin" --rpc_address=127.0.0.1 --rpc_port=50051 --metrics_host=127.0.0.1 \
      --metrics_port=9003 --enable_cxl=true --cxl_path="$pool" \
      --default_kv_lease_ttl=$lease_ms "${extra[@]}" >"$out/$name.master.log" 2>&1 &
  else
    extra=()
    [ $cxl = 1 ] && extra=(--enable_cxl=true --cxl_path="$pool" --cxl_size=$((8 << 30)))
    "$master_bin" --rpc_address=127.0.0.1 --rpc_port=50051 --metrics_port=9003 \
      --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
      --http_metadata_server_port=8080 --default_kv_lease_ttl=$lease_ms --logtostderr \
      "${extra[@]}" >"$out/$name.master.log" 2>&1 &
  fi
  mpid=$!
  pids+=("$mpid")
  if ! wait_port 50051 "$mpid"; then
    echo "$name: master did not start (log $out/$name.master.log)"; tail -5 "$out/$name.master.log"
    summary+=("$name: master did not start"); total_fail=1; stop_all; rm -rf "$work"; continue
  fi
  if [ "$name" = test_dummy_client ]; then
    if [ "$mode" = ours ]; then
      "$client_bin" --port=50052 --master_server_address=127.0.0.1:50051 --protocol=cxl \
        >"$out/$name.client.log" 2>&1 &
    else
      "$client_bin" --port=50052 --host=127.0.0.1 --master_server_address=127.0.0.1:50051 \
        --metadata_server="$MC_METADATA_SERVER" --protocol=tcp --global_segment_size="1 GB" \
        --local_buffer_size="512 MB" >"$out/$name.client.log" 2>&1 &
    fi
    cpid=$!
    pids+=("$cpid")
    if ! wait_port 50052 "$cpid"; then
      echo "$name: standalone client did not start (log $out/$name.client.log)"
      tail -5 "$out/$name.client.log"
    fi
  fi
  # umask 077: the CXL file creates its pool file 0666 & ~umask; a world-readable
  # pool is refused by our master unless --allow_world_readable_pool.
  (cd "$work" && umask 077 && TMPDIR="$work" timeout 1800 "$py" -m pytest -v -p no:cacheprovider \
     -o junit_family=xunit1 --junitxml="$out/$name.junit.xml" "${kexpr[@]}" "$path") \
     >"$out/$name.pytest.log" 2>&1
  grep -E '::[^ ]+ (PASSED|FAILED|ERROR|SKIPPED)' "$out/$name.pytest.log" | sed -e 's/ *\[ *[0-9]*%\]$//' -e 's|^.*/||'
  counts=$("$py" - "$out/$name.junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception as e:
    print("no junit (%s)" % e); sys.exit()
suites = [root] if root.tag == "testsuite" else list(root)
n = f = e = s = 0
for t in suites:
    n += int(t.get("tests", 0)); f += int(t.get("failures", 0))
    e += int(t.get("errors", 0)); s += int(t.get("skipped", 0))
print(f"{n - f - e - s} passed, {f + e} failed, {s} skipped")
PY
)
  echo "$name: $counts"
  summary+=("$name: $counts")
  case "$counts" in *" 0 failed"*) ;; *) total_fail=1;; esac
  stop_all
  rm -rf "$work"
done
echo "=== $mode (logs in $out)"
printf '%s\n' "${summary[@]}"
exit $total_fail
