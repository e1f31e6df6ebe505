"""A master and clients on simulated hosts of a --coherence=noncoherent pool
(MC_CXL_SIM_HOST, cpp/pool/include/mooncake_cxl/pool/coherence_sim.h): every
process logs its simulated host and seed, a coherent pool refuses a simulated
host, and a put on one host is read on another only through what the
master and the putter write back and the reader invalidates. The checker's
counters are the header of `<pool>.simlines`."""
import json
import os
import subprocess
import sys

import pytest

from conftest import CALL_TIMEOUT, SIM_SEED, sim_counters, wait_for_log

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sim_workers.py")
SEED = SIM_SEED


def run_client(master, host, op, key, size=4096, churn=0):
    """One client process on simulated host `host`: (its JSON result, its stderr)."""
    env = dict(os.environ, MC_CXL_SIM_HOST=str(host), MC_CXL_SIM_SEED=str(SEED + host),
               MC_CXL_SIM_CHURN=str(churn))
    p = subprocess.run([sys.executable, WORKER, master.address, op, key, str(size)], env=env,
                       capture_output=True, text=True, timeout=CALL_TIMEOUT)
    assert p.returncode == 0, f"client on host {host} exited {p.returncode}: {p.stderr[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_each_process_logs_its_simulated_host_and_seed(sim_master):
    wait_for_log(sim_master, rf"simulated host 0: pool .* \(seed {SEED},", "the master's simulated-host line")
    result, err = run_client(sim_master, 1, "exists", "nothing-here")
    assert f"simulated host 1: pool {sim_master.pool_path} through host copy" in err, err
    assert f"(seed {SEED + 1}," in err, err
    assert result["rc"] == 0, result  # setup worked: the master's format reached the pool
    assert os.path.exists(sim_master.pool_path + ".simhost-1")


def test_a_coherent_pool_refuses_a_simulated_host(master_factory):
    master = master_factory(extra_flags=["--coherence=coherent"])  # also under MCXL_TEST_COHERENCE=noncoherent
    env = dict(os.environ, MC_CXL_SIM_HOST="1", MC_CXL_SIM_CHURN="0")
    p = subprocess.run([sys.executable, WORKER, master.address, "exists", "k"], env=env,
                       capture_output=True, text=True, timeout=CALL_TIMEOUT)
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["stage"] == "setup" and result["rc"] != 0, result
    assert "format it with --coherence=noncoherent" in p.stderr, p.stderr


def test_one_simulated_host_behaves_as_a_coherent_machine(sim_master):
    """Master and clients on host 0 share one host copy: everything works
    as on one machine, with the churn moving lines to the pool and back."""
    put, _ = run_client(sim_master, 0, "put", "one-host", churn=20000)
    assert put["ok"], put
    got, _ = run_client(sim_master, 0, "get", "one-host", churn=20000)
    assert got["ok"], got
    exists, _ = run_client(sim_master, 0, "exists", "one-host", churn=20000)
    assert exists["ok"], exists
    assert sim_counters(sim_master.pool_path) == (0, 0, 0)


# The non-coherent discipline at the call sites (docs/architecture.md §7):
# the putter's publish goes through the master, the only writer of the entry.
@pytest.mark.parametrize("reader_host", [1, 2], ids=["putters-host", "third-host"])
def test_a_put_on_host_1_is_read_with_the_master_on_host_0(sim_master, reader_host):
    key = f"put-on-1-read-on-{reader_host}"
    put, _ = run_client(sim_master, 1, "put", key)
    assert put["ok"], put
    exists, _ = run_client(sim_master, reader_host, "exists", key)
    assert exists["ok"], exists
    got, _ = run_client(sim_master, reader_host, "get", key)
    assert got["ok"], got
    assert sim_counters(sim_master.pool_path) == (0, 0, 0)
