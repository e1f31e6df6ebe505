"""Shared fixtures and helpers of every test area: a master on 127.0.0.1 over
a pool file in /dev/shm, stores attached to it (over rings and TCP), waits on
a condition (wait_until, wait_for_log, metrics, ...), values any process can
check, pool fills that measure leaks, and spawned client processes
(`children`). Every pool file is removed afterwards."""
import contextlib
import glob
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid
import weakref

import pytest

# The repository's root (scripts/, README.md). Test the installed package,
# not the source tree (which has no built _core): `python -m pytest` puts
# the repository root on sys.path.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != REPO]

from mooncake_cxl import MooncakeDistributedStore, ReplicateConfig
from mooncake_cxl.launch import MasterProcess, RemoteServedMaster

POOL_SIZE = 64 << 20
# MCXL_TEST_COHERENCE=noncoherent: every pool a master of the run formats is
# formatted --coherence=noncoherent (unless the test names a mode), so whole
# areas run on the non-coherent discipline (docs/architecture.md section 7).
TEST_COHERENCE = os.environ.get("MCXL_TEST_COHERENCE", "")
assert TEST_COHERENCE in ("", "coherent", "noncoherent"), \
    f"MCXL_TEST_COHERENCE={TEST_COHERENCE!r}: coherent or noncoherent"
NONCOHERENT_RUN = TEST_COHERENCE == "noncoherent"


def _start_with_coherence(start):
    def wrapped(self):
        if not any(f.startswith("--coherence") for f in self.extra_flags):
            self.extra_flags.append(f"--coherence={TEST_COHERENCE}")
        return start(self)
    return wrapped


if TEST_COHERENCE:
    MasterProcess.start = _start_with_coherence(MasterProcess.start)
# MCXL_TEST_REMOTE=1 MC_CXL_REMOTE=1 (inside unshare -n): the suite's masters
# also serve their pool over the Transfer Engine and stores are remote clients.
REMOTE_RUN = os.environ.get("MCXL_TEST_REMOTE", "") == "1"
# MCXL_TEST_SIM_HOSTS=N (N >= 2): the run on N simulated non-coherent hosts
# (cpp/pool/include/mooncake_cxl/pool/coherence_sim.h): master_factory's
# masters format --coherence=noncoherent on host 0, this process's stores are
# on host 1, and each Child on hosts 1..N-1 in turn. sim_counters() is the
# checker's verdict on a pool.
SIM_HOSTS = int(os.environ.get("MCXL_TEST_SIM_HOSTS", "0") or 0)
NONCOHERENT_RUN = NONCOHERENT_RUN or SIM_HOSTS >= 2  # its pools are non-coherent too
if SIM_HOSTS >= 2:
    os.environ["MC_CXL_SIM_HOST"] = "1"
_sim_children = [0]


def sim_counters(pool_path):
    """(conflicts, lost_updates, false_sharing) the simulator's checker counted on
    `pool_path` (the header of `<pool>.simlines`; zeros when no simulated host
    attached it)."""
    try:
        with open(pool_path + ".simlines", "rb") as f:
            return struct.unpack("<3Q", f.read(24))
    except FileNotFoundError:
        return (0, 0, 0)


@contextlib.contextmanager
def _sim_host(host):
    """MC_CXL_SIM_HOST=host for the processes started in the block (a simulated run only)."""
    saved = os.environ.get("MC_CXL_SIM_HOST")
    if SIM_HOSTS >= 2:
        os.environ["MC_CXL_SIM_HOST"] = str(host)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MC_CXL_SIM_HOST", None)
        else:
            os.environ["MC_CXL_SIM_HOST"] = saved

# --------------------------------------------------------------------------
# Waiting on a condition. A test waits for what it needs (a log line, a
# metric, a lease's end, a message from a child), never for a time; the
# timeout is a hang guard, generous enough that a loaded 2-core machine never
# trips it, and never what a test asserts.

WAIT_TIMEOUT = 60


def poll(call, timeout=WAIT_TIMEOUT, interval=0.05, done=bool):
    """Calls `call` until `done(its value)` or `timeout` seconds pass; its last
    value. A retry: poll(lambda: s.put(k, v), done=lambda rc: rc == 0)."""
    deadline = time.monotonic() + timeout
    while True:
        value = call()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def wait_until(predicate, what, timeout=WAIT_TIMEOUT, master=None, interval=0.05):
    """`predicate`'s first true value; past `timeout` an AssertionError naming
    `what` (a string, or a callable giving one then) and, with `master`, the
    tail of its log."""
    value = poll(predicate, timeout, interval)
    if not value:
        text = what() if callable(what) else what
        tail = f"; master log:\n{master.log_tail(3000)}" if master is not None else ""
        raise AssertionError(f"timed out after {timeout} s waiting for {text}{tail}")
    return value


def log_size(master):
    """The master log's length: a mark for wait_for_log(start=...)."""
    return len(master.log_tail(1 << 30))


def wait_for_log(master, pattern, what=None, start=0, timeout=WAIT_TIMEOUT):
    """The first match of the regex `pattern` in the master log after byte
    `start`."""
    return wait_until(lambda: re.search(pattern, master.log_tail(1 << 30)[start:]),
                      what or f"/{pattern}/ in the master log", timeout, master)


def http_get(master, path, timeout=10):
    """The body of a GET on the master's monitoring port."""
    with urllib.request.urlopen(master.metrics_url + path, timeout=timeout) as r:
        return r.read().decode()


_SAMPLE = re.compile(r"([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metrics(master):
    """The master's /metrics samples under the names it prints: {name: value},
    and {(name, sorted label items): value} for labelled ones."""
    out = {}
    for line in http_get(master, "/metrics").splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            name, labels, value = m.groups()
            key = (name, tuple(sorted(_LABEL.findall(labels)))) if labels else name
            out[key] = float(value)
    return out


def metric(master, name, **labels):
    """One sample of /metrics; an AssertionError if the master has none."""
    key = (name, tuple(sorted(labels.items()))) if labels else name
    found = metrics(master)
    assert key in found, f"no metric {key} on the master"
    return found[key]


def counter(samples, name):
    """A counter from a metrics() dict, under its name with or without _total."""
    return samples.get(name, samples.get(name + "_total", 0))


def lease_remaining_ms(master, key):
    """What /query_key says is left of `key`'s lease (0 when it is not stored)."""
    try:
        return json.loads(http_get(master, "/query_key?key=" + urllib.parse.quote(key, safe="")))[
            "data"][0]["lease_remaining_ms"]
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return 0
        raise


# Every store this process makes: wait_for_leases_to_lapse sends their queued
# leases first (on a non-coherent pool a read's lease waits in its client's
# queue for the lease thread; this client's next remove sends it, so a lease
# not yet at the master when the wait ended would refuse that remove).
_stores = weakref.WeakSet()


def _registered(init):
    def wrapped(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _stores.add(self)
    return wrapped


MooncakeDistributedStore.__init__ = _registered(MooncakeDistributedStore.__init__)


def wait_for_leases_to_lapse(master, keys=None, timeout=WAIT_TIMEOUT):
    """Until the leases of `keys` (read leases and kv holds) are over, or with
    no keys until the master counts no leased object at all: what a test needs
    before a remove or an eviction that a lease would refuse. The leases this
    process's stores still queue are sent first, so the master's lease words
    are the whole truth (a child process's store flushes its own)."""
    for s in list(_stores):
        s._flush_leases()
    if keys is None:
        wait_until(lambda: metric(master, "master_objects", state="leased") == 0,
                   "every lease to lapse (master_objects{state=\"leased\"} == 0)", timeout, master)
    else:
        wait_until(lambda: all(lease_remaining_ms(master, k) == 0 for k in keys),
                   f"the leases of {len(keys)} keys to lapse, e.g. {list(keys)[:3]}", timeout, master)


def fill_fs(path):
    """Another program takes every free byte of the filesystem holding path."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (b"x" * (1 << 20), b"x" * 4096):
            try:
                while os.write(fd, chunk) > 0:
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


def tcp_connections(port, states=("01", "08")):
    """How many IPv4 sockets with local port `port` are in `states` (hex codes of
    /proc/net/tcp: 01 ESTABLISHED, 08 CLOSE_WAIT): the master's side of its
    RPC connections, as the kernel sees them."""
    n = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] in states:
                n += 1
    return n


def _pool_dir():
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


@pytest.fixture
def pool_path():
    path = os.path.join(_pool_dir() or "/tmp", f"mcxl_test_{uuid.uuid4().hex}")
    yield path
    # A simulated run (MCXL_TEST_SIM_HOSTS): the checker flagged nothing.
    flagged = sim_counters(path) if SIM_HOSTS >= 2 else (0, 0, 0)
    # The pool, the session file a killed Transfer Engine process left, and
    # the non-coherent simulator's files.
    for p in [path, path + ".te"] + glob.glob(glob.escape(path) + ".sim*"):
        if os.path.exists(p):
            os.unlink(p)
    assert flagged == (0, 0, 0), f"the simulator's checker flagged write-backs (conflicts, lost, false sharing): {flagged}"


@pytest.fixture
def tier_dir():
    """A directory for an SSD tier (the master creates it), removed afterwards."""
    d = os.path.join(_pool_dir() or "/tmp", f"mcxl_tier_{uuid.uuid4().hex}")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def master_factory(pool_path, tmp_path):
    """Starts masters on `pool_path`; all are stopped at teardown."""
    started = []

    def start(pool_size=POOL_SIZE, format=True, extra_flags=(), path=None):
        log_path = str(tmp_path / f"master{len(started)}.log")
        if REMOTE_RUN:
            # Every store of the run is a remote client (MC_CXL_REMOTE=1) of
            # this master's pool served over the Transfer Engine.
            secret = str(tmp_path / f"secret{len(started)}")
            os.environ["MC_CXL_AUTH_TOKEN_FILE"] = secret
            m = RemoteServedMaster(path or pool_path, secret, pool_size=pool_size, format=format,
                                   extra_flags=extra_flags, log_path=log_path)
        else:
            if SIM_HOSTS >= 2 and not any(f.startswith("--coherence") for f in extra_flags):
                extra_flags = ["--coherence=noncoherent", *extra_flags]
            m = MasterProcess(path or pool_path, pool_size, format=format, extra_flags=extra_flags,
                              log_path=log_path)
        started.append(m)
        with _sim_host(0):
            return m.start()

    yield start
    for m in started:
        m.stop()


# The coherence simulator (coherence_sim.h): a master on simulated host 0.
SIM_SEED = 11


@pytest.fixture
def sim_master(master_factory, monkeypatch):
    """A master on simulated host 0 of a fresh non-coherent pool (seed SIM_SEED)."""
    monkeypatch.setenv("MC_CXL_SIM_HOST", "0")
    monkeypatch.setenv("MC_CXL_SIM_SEED", str(SIM_SEED))
    m = master_factory(extra_flags=["--coherence=noncoherent"])
    monkeypatch.delenv("MC_CXL_SIM_HOST")
    return m


@pytest.fixture
def master(master_factory):
    return master_factory()


@pytest.fixture
def etcd(tmp_path):
    """A real etcd on 127.0.0.1 (free ports, data in tmp_path), stopped at teardown."""
    from mooncake_cxl.launch_ha import EtcdProcess
    if not EtcdProcess.available():
        pytest.skip("etcd is not installed (apt-get install etcd-server; scripts/run_tests.sh does)")
    e = EtcdProcess(str(tmp_path / "etcd-data"), log_path=str(tmp_path / "etcd.log")).start()
    yield e
    e.kill()


@pytest.fixture
def ha_master_factory(etcd, pool_path, tmp_path):
    """Starts elected masters (--enable_ha) on `pool_path` and `etcd`; all are
    stopped at teardown. start() returns once the master campaigns."""
    from mooncake_cxl.launch_ha import HaMasterProcess
    started = []

    def start(ttl_s=2, extra_flags=(), pool_size=256 << 20, cluster_id="mooncake"):
        m = HaMasterProcess(etcd.endpoint, pool_path, pool_size, cluster_id=cluster_id, ttl_s=ttl_s,
                            extra_flags=extra_flags, log_path=str(tmp_path / f"ha_master{len(started)}.log"))
        started.append(m)
        return m.start()

    yield start
    for m in started:
        if m.proc and m.proc.poll() is None:
            os.kill(m.proc.pid, signal.SIGCONT)
        m.stop()


def connect(master, hostname="127.0.0.1:0", protocol="cxl"):
    """A store set up against `master`; asserts setup succeeded."""
    s = MooncakeDistributedStore()
    rc = s.setup(hostname, "P2PHANDSHAKE", 0, 0, protocol, "", master.address)
    assert rc == 0, f"setup failed with {rc}; master log: {master.log_tail()}"
    return s


@pytest.fixture(params=["ring", "tcp"])
def transport(request, monkeypatch):
    """The control path to the master: CXL RPC rings (the default) or TCP.
    Every test using `store` runs once over each."""
    monkeypatch.setenv("MC_CXL_RPC", request.param)
    return request.param


@pytest.fixture
def store(master, transport):
    s = connect(master)
    yield s
    s.close()


@pytest.fixture
def no_put_wait(monkeypatch):
    """A put refused for space returns -200 at once instead of retrying while
    eviction catches up (MC_CXL_PUT_WAIT_MS, read at setup; spawned children
    inherit it): fills that hard-pin their objects stop at their first -200,
    and waiting could free nothing."""
    monkeypatch.setenv("MC_CXL_PUT_WAIT_MS", "0")


def value_for(key, size):
    """Bytes derived from the key, so that any process can check them."""
    return random.Random(key).randbytes(size)


def fill(store, prefix, size=1 << 20, limit=100_000):
    """Puts hard-pinned values (eviction must not make room) until the first
    failure, which must be -200. Returns the keys stored; their values are
    value_for(key, size)."""
    cfg = ReplicateConfig()
    cfg.with_hard_pin = True
    keys = []
    for n in range(limit):
        key = f"{prefix}{n}"
        rc = store.put(key, value_for(key, size), cfg)
        if rc != 0:
            assert rc == -200, f"fill: put #{n} of {size} bytes returned {rc}, expected -200"
            return keys
        keys.append(key)
    raise AssertionError(f"fill: {limit} puts of {size} bytes never ran out of space")


def wait_for_space_back(store, baseline, master, what, tolerance=1):
    """remove_all + fill, repeated until an emptied pool holds `baseline` 1 MiB
    objects again (less `tolerance`): freed space may come back a Tick later."""
    held = [None]

    def space_back():
        store.remove_all(force=True)
        held[0] = len(fill(store, "fill-back/"))
        store.remove_all(force=True)
        return held[0] >= baseline - tolerance

    wait_until(space_back, lambda: f"space back ({what}): an emptied pool holds {held[0]} objects of "
               f"1 MiB, the fresh pool held {baseline}", master=master, interval=0.3)


def fill_count(store, prefix, size=1 << 20):
    """How many hard-pinned objects of `size` fit (hard pins keep eviction, if
    the master ever evicts on a failed allocation, from hiding the capacity)."""
    return len(fill(store, prefix, size))


def baseline_fill(store):
    """Fill count of the freshly formatted pool; leaves the pool empty again."""
    n = fill_count(store, "fill0/")
    assert n > 0
    assert store.remove_all(force=True) == n
    return n


def assert_no_leak(store, baseline, what):
    store.remove_all(force=True)
    n = fill_count(store, "fill1/")
    assert abs(n - baseline) <= 1, (
        f"space leak after {what}: a fill of 1 MiB objects reached {n} objects, "
        f"the fresh pool held {baseline}")
    store.remove_all(force=True)


# --------------------------------------------------------------------------
# Client processes (spawned: a fresh interpreter, no inherited mapping of the
# pool). A child's target must be a module-level function of an importable
# module (a test file or a *_workers.py), so that the child can import it.

SPAWN = mp.get_context("spawn")

# Hang guards (seconds). Generous: a noisy 2-core machine must never trip them.
CHILD_START_TIMEOUT = 60
CALL_TIMEOUT = 120


def open_store(address, hostname="127.0.0.1:0"):
    s = MooncakeDistributedStore()
    rc = s.setup(hostname, "P2PHANDSHAKE", 0, 0, "cxl", "", address)
    if rc != 0:
        raise RuntimeError(f"setup in child pid {os.getpid()} returned {rc}")
    return s


def _child_entry(conn, target, args):
    """Runs target(conn, *args) in the child; sends ("ok", result) or ("err", traceback)."""
    try:
        result = target(conn, *args)
        conn.send(("ok", result))
    except BaseException:
        try:
            conn.send(("err", traceback.format_exc()))
        except Exception:
            pass
    finally:
        conn.close()


class Child:
    """A spawned child running `target(conn, *args)`; its return value comes back
    through the pipe. `target` may also send intermediate messages on `conn`."""

    def __init__(self, target, *args):
        self.conn, child_conn = SPAWN.Pipe()
        self.proc = SPAWN.Process(target=_child_entry, args=(child_conn, target, args), daemon=True)
        _sim_children[0] += 1
        with _sim_host(1 + _sim_children[0] % max(1, SIM_HOSTS - 1)):
            self.proc.start()
        child_conn.close()

    def recv(self, timeout=CALL_TIMEOUT):
        if not self.conn.poll(timeout):
            raise AssertionError(f"child pid {self.proc.pid} sent nothing within {timeout}s (hung?)")
        return self.conn.recv()

    def result(self, timeout=CALL_TIMEOUT):
        """The child's return value; intermediate messages are skipped."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"child pid {self.proc.pid} did not finish within {timeout}s")
            msg = self.recv(left)
            if isinstance(msg, tuple) and len(msg) == 2 and msg[0] in ("ok", "err"):
                status, value = msg
                if status == "err":
                    raise AssertionError(f"child pid {self.proc.pid} failed:\n{value}")
                self.proc.join(30)
                return value

    def kill(self):
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(30)

    def cleanup(self):
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        if self.proc.is_alive():
            self.kill()
        self.conn.close()


@pytest.fixture
def children():
    """Starts children; every one still alive at teardown is terminated/killed."""
    started = []

    def start(target, *args):
        c = Child(target, *args)
        started.append(c)
        return c

    yield start
    for c in started:
        c.cleanup()


@pytest.fixture(scope="session")
def vllm_python():
    """An interpreter with vLLM and this package: scripts/run_tests.sh installs the vllm
    extra in its own venv and exports MCXL_VLLM_PYTHON; without it, this interpreter if it
    has vLLM. Tests run vLLM in subprocesses of it, never in the test process."""
    exe = os.environ.get("MCXL_VLLM_PYTHON") or sys.executable
    probe = subprocess.run([exe, "-c", "import vllm, mooncake_cxl"], capture_output=True, text=True,
                           cwd="/")  # not the source tree, whose mooncake_cxl/ has no built _core
    if probe.returncode != 0:
        pytest.skip(f"vLLM is not importable by {exe} (pip install '.[vllm]', or set MCXL_VLLM_PYTHON): "
                    f"{probe.stderr.strip().splitlines()[-1:]}")
    return exe


@pytest.fixture(scope="session")
def engines_python():
    """An interpreter with SGLang and LMCache (MCXL_ENGINES_PYTHON, from
    scripts/run_tests.sh); engine code runs in subprocesses of it."""
    from engines_common import engines_python_or_skip
    return engines_python_or_skip()
