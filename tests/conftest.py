"""Fixtures: a master on 127.0.0.1 over a pool file in /dev/shm, and stores
attached to it. Every pool file is removed afterwards."""
import os
import random
import sys
import time
import uuid

import pytest

# Test the installed package, not the source tree (which has no built _core):
# `python -m pytest` puts the repository root on sys.path.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _ROOT]

from mooncake_cxl import MooncakeDistributedStore, ReplicateConfig
from mooncake_cxl.launch import MasterProcess

POOL_SIZE = 64 << 20


def _pool_dir():
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


@pytest.fixture
def pool_path():
    path = os.path.join(_pool_dir() or "/tmp", f"mcxl_test_{uuid.uuid4().hex}")
    yield path
    if os.path.exists(path):
        os.unlink(path)


@pytest.fixture
def master_factory(pool_path, tmp_path):
    """Starts masters on `pool_path`; all are stopped at teardown."""
    started = []

    def start(pool_size=POOL_SIZE, format=True, extra_flags=(), path=None):
        m = MasterProcess(path or pool_path, pool_size, format=format, extra_flags=extra_flags,
                          log_path=str(tmp_path / f"master{len(started)}.log"))
        started.append(m)
        return m.start()

    yield start
    for m in started:
        m.stop()


@pytest.fixture
def master(master_factory):
    return master_factory()


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


def poll_fill_matches(s, baseline, master, what):
    """remove_all + fill, repeated (bounded: 15 s) until the pool holds as many
    1 MiB objects as the fresh one did."""
    deadline = time.monotonic() + 15
    while True:
        s.remove_all(force=True)
        n = len(fill(s, "fillx/"))
        s.remove_all(force=True)
        if abs(n - baseline) <= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert abs(n - baseline) <= 1, (
        f"space leak ({what}): an emptied pool holds {n} objects of 1 MiB, the fresh pool held "
        f"{baseline}; master log:\n{master.log_tail()}")
