"""Clients outside the pod: a master whose pool is also served over Mooncake's
Transfer Engine (the pool_te process), and remote clients that cannot open
the pool file. Each remote "host" is a child in a private mount namespace
with an empty /dev/shm (the pool lives in /dev/shm), inside the private
network namespace every Transfer Engine needs (the engine binds 0.0.0.0):

    unshare -n -- bash -c 'ip link set lo up && MCXL_ORACLE_NETNS=1 python -m pytest -q tests/remote'

The conformance suite runs against remote clients with MCXL_TEST_REMOTE=1
MC_CXL_REMOTE=1 (see tests/conftest.py)."""
import json
import os
import select
import subprocess
import sys
import threading
import time

import pytest

import oracle
from conftest import WAIT_TIMEOUT, connect, wait_until
from mooncake_cxl import ErrorCode
from mooncake_cxl.launch import PoolTEProcess, RemoteServedMaster

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from remote_workers import check_value, checked_value  # noqa: E402

_SKIP = oracle.reference_skip_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


def _can_unshare_mount():
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


class RemoteHost:
    """A worker command in its own mount namespace with an empty /dev/shm."""

    def __init__(self, *args, secret=None, pool=None, env_extra=None):
        env = dict(os.environ, **(env_extra or {}))
        env.pop("MC_CXL_REMOTE", None)  # it must decide by itself
        if secret:
            env["MC_CXL_AUTH_TOKEN_FILE"] = secret
        else:
            env.pop("MC_CXL_AUTH_TOKEN_FILE", None)
        env["MCXL_TEST_POOL"] = pool or ""
        script = " ".join(["exec", sys.executable, os.path.join(HERE, "remote_workers.py")] +
                          [f"'{a}'" for a in args])
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--", "bash", "-c", f"mount -t tmpfs tmpfs /dev/shm && {script}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.lines = []

    def next(self, timeout=WAIT_TIMEOUT):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"remote host said nothing for {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"remote host exited ({self.proc.wait()})"
        msg = json.loads(line)
        self.lines.append(msg)
        return msg

    def until(self, pred, timeout=WAIT_TIMEOUT):
        while True:
            msg = self.next(timeout)
            if pred(msg):
                return msg

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.flush()
            except OSError:
                pass

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def served(pool_path, tmp_path):
    if not _can_unshare_mount():
        pytest.skip("unshare -m is not permitted here (a remote host needs its own mount namespace)")
    m = RemoteServedMaster(pool_path, str(tmp_path / "secret"), pool_size=64 << 20, format=True,
                           log_path=str(tmp_path / "master.log"))
    m.start()
    yield m
    m.stop()


@pytest.fixture
def remote_hosts():
    started = []

    def start(*args, **kw):
        h = RemoteHost(*args, **kw)
        started.append(h)
        return h
    yield start
    for h in started:
        h.close()


def test_secret_file_is_created_owner_only(served):
    assert (os.stat(served.auth_token_file).st_mode & 0o777) == 0o600
    assert (os.stat(served.session_file).st_mode & 0o777) == 0o600


def test_remote_host_chooses_remote_and_every_byte_round_trips(served, remote_hosts):
    local = connect(served)
    for i in range(8):
        assert local.put(f"local-{i}", checked_value(f"local-{i}", 1, 4096 + i)) == 0
    h = remote_hosts("roundtrip", served.address, "8", secret=served.auth_token_file, pool=served.pool_path)
    first = h.next()
    assert first == {"setup": 0, "remote": True, "pool_visible": False}
    r = h.next()
    assert r["local_ok"] and r["put"] == 0 and r["big"] == 0 and r["big_back"]
    assert r["batch_back"] == [1] * 8
    assert (r["read_by"], r["te_session"]) == ("transfer_engine", served.te.session)
    assert local.get_replica_desc("big")[0].read_by == "pool"
    # What the remote host wrote, read here straight from the pool.
    for i in range(8):
        assert check_value(f"remote-{i}", local.get(f"remote-{i}")) == (1, None)
    assert local.get("big") == checked_value("big", 1, 3 << 20)
    local.close()


def test_remote_host_under_the_compat_switch(served, remote_hosts):
    """MOONCAKE_CXL_COMPAT=1 (vLLM's MooncakeStoreConnector on our store) makes
    `mooncake` the shim, which refuses mooncake.engine to the program; the
    remote client still gets its engine, and the program's import stays refused."""
    h = remote_hosts("compat_engine", served.address, secret=served.auth_token_file,
                     env_extra={"MOONCAKE_CXL_COMPAT": "1"})
    assert h.next() == {"setup": 0, "program_import": "refused"}
    r = h.next()
    assert r["put"] == 0 and r["back"]


def test_remote_reader_follows_a_local_producers_channel(served, remote_hosts):
    """A local producer publishes records while a remote host follows the
    channel over the engine: every record it accepts is whole and in order
    (a lapped stretch is counted, never returned torn), it reads up to the
    last one, and it may not produce."""
    from remote_workers import record_words
    local = connect(served)
    p = local._announce_open("pd", True)
    assert not isinstance(p, int), p
    total = 20000  # many laps of the channel's 512 slots while the reader reads
    for n in range(100):
        assert p.publish(record_words(n)) == n
    h = remote_hosts("listen", served.address, "pd", str(total), secret=served.auth_token_file)
    assert h.next() == {"setup": 0, "producer": int(ErrorCode.NOT_SUPPORTED), "reader": "opened"}
    for n in range(100, total):
        assert p.publish(record_words(n)) == n
        if n % 16 == 0:
            time.sleep(0.0001)  # paces the producer so that its writes overlap the reader's copies
    done = h.until(lambda m: "done" in m)["done"]
    assert done["bad"] == 0 and not done["lost"] and done["last"] == total - 1, done
    assert done["ok"] + done["lapped"] == total, done
    p.close()
    local.close()


def test_remote_attach_without_the_secret_is_refused_and_changes_nothing(served, remote_hosts):
    local = connect(served)
    assert local.put("k", b"v") == 0
    before = served.log_tail(100000).count("attached as slot")
    h = remote_hosts("no_secret", served.address, pool=served.pool_path)
    assert h.next() == {"setup": -601}
    log = served.log_tail(100000)
    assert log.count("attached as slot") == before and "without the pool's token" in log
    assert local.get("k") == b"v"
    local.close()


def test_remote_reader_never_sees_torn_stale_or_foreign_values(served, remote_hosts):
    """A local writer upserts checksummed versions, removes and refills a
    small pool (evictions) while a remote host reads the same keys."""
    keys = [f"hot-{i}" for i in range(6)]
    local = connect(served)
    seq = {k: 1 for k in keys}
    for k in keys:
        assert local.upsert(k, checked_value(k, 1, 200_000)) == 0
    h = remote_hosts("reader", served.address, ",".join(keys), "8", secret=served.auth_token_file)
    assert h.next() == {"setup": 0}
    stop = threading.Event()

    def write():
        n = 0
        while not stop.is_set():
            k = keys[n % len(keys)]
            seq[k] += 1
            if n % 7 == 3:
                local.remove(k, force=True)
            else:
                local.upsert(k, checked_value(k, seq[k], 200_000 + (n % 5) * 65536))
            if n % 11 == 5:  # fill: the pool evicts
                local.put(f"fill-{n}", b"f" * (4 << 20))
            n += 1
    t = threading.Thread(target=write, daemon=True)
    t.start()
    try:
        done = h.until(lambda m: "done" in m, timeout=120)["done"]
    finally:
        stop.set()
        t.join()
    assert done["torn"] == done["foreign"] == done["stale"] == 0, done
    assert done["ok"] > 0
    local.close()


def test_killed_serving_process_gives_errors_then_recovers(served, remote_hosts):
    local = connect(served)
    v = checked_value("k", 1, 1 << 20)
    assert local.put("k", v) == 0
    h = remote_hosts("survive", served.address, "k", secret=served.auth_token_file)
    assert h.next() == {"setup": 0}
    assert h.until(lambda m: m.get("outcome") == "ok")["outcome"] == "ok"
    served.te.kill()
    assert h.until(lambda m: "outcome" in m and m["outcome"] != "ok")["outcome"] == "error"
    served.te = PoolTEProcess(served.pool_path, served.session_file)
    served.te.start()
    assert h.until(lambda m: m.get("outcome") == "ok")["outcome"] == "ok"
    h.stop()
    end = h.until(lambda m: "done" in m)
    assert not end["torn"] and all(m.get("outcome") in (None, "ok", "error") for m in h.lines)
    local.close()
