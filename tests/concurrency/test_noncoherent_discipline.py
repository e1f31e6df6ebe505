"""The non-coherent discipline (docs/architecture.md section 7) on simulated
hosts (coherence_sim.h): a master on host 0 and clients on hosts 1-3 of a
--coherence=noncoherent pool, spontaneous write-back and refetch on, the
checker counting nothing. Then the mutation check: MC_CXL_SIM_MUTATE drops one
write-back in the put publish path, one invalidate in the read path or one in
the ring path, and the same steps fail; unmutated they pass."""
import json
import os
import subprocess
import sys

import pytest

from conftest import CALL_TIMEOUT, SIM_SEED, sim_counters

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nc_sim_workers.py")
SEED = SIM_SEED
N = 40


def run(master, host, op, prefix, tag="a", n=N, size=4096, churn=20000, mutate=None, rpc="ring"):
    """One client process on simulated host `host`: its JSON result."""
    env = dict(os.environ, MC_CXL_SIM_HOST=str(host), MC_CXL_SIM_SEED=str(SEED + host),
               MC_CXL_SIM_CHURN=str(churn), MC_CXL_RPC=rpc)
    env.pop("MC_CXL_SIM_MUTATE", None)
    if mutate:
        env["MC_CXL_SIM_MUTATE"] = mutate
    try:
        p = subprocess.run([sys.executable, WORKER, master.address, op, prefix, str(n), str(size), tag], env=env,
                           capture_output=True, text=True, timeout=30 if mutate else CALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        assert mutate, f"client on host {host} hung"
        return {"ok": -1, "bad": [], "rc": [], "hung": True}  # a mutation may stall a ring call
    if mutate and p.returncode != 0:
        return {"ok": -1, "bad": [], "rc": [p.returncode]}
    assert p.returncode == 0, f"client on host {host} exited {p.returncode}: {p.stderr[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("rpc", ["ring", "tcp"])
def test_three_hosts_read_each_others_puts_and_upserts(sim_master, rpc):
    assert run(sim_master, 1, "put", "p", rpc=rpc)["ok"] == N
    for host in (2, 3):
        for op in ("get", "batch", "view", "exists"):
            r = run(sim_master, host, op, "p", rpc=rpc)
            assert r["ok"] == N, (host, op, r)
    # The newest value wins on every host, whoever wrote it.
    assert run(sim_master, 2, "upsert", "p", tag="b", rpc=rpc)["ok"] == N
    for host in (1, 3):
        assert run(sim_master, host, "get", "p", tag="b", rpc=rpc)["ok"] == N
    assert run(sim_master, 3, "upsert", "p", tag="c", size=9000, rpc=rpc)["ok"] == N
    for host in (1, 2):
        assert run(sim_master, host, "batch", "p", tag="c", size=9000, rpc=rpc)["ok"] == N
    assert sim_counters(sim_master.pool_path) == (0, 0, 0), "the checker flagged a line with two writer hosts"


# Each mutation with the steps that catch it. Churn off: a spontaneous
# write-back or refetch could hide the missing one.
def steps_publish(m, mutate):
    """Host 1 puts with its value's write-back dropped; host 2 reads."""
    return run(m, 1, "put", "w", churn=0, mutate=mutate)["ok"] == N and run(m, 2, "get", "w", churn=0)["ok"] == N


def steps_read(m, mutate):
    """Host 2 maps the pool first (its copy of the extents is old), host 1
    puts, host 2 reads with its value invalidate dropped."""
    run(m, 2, "exists", "r", churn=0)
    return run(m, 1, "put", "r", churn=0)["ok"] == N and run(m, 2, "get", "r", churn=0, mutate=mutate)["ok"] == N


def steps_ring(m, mutate):
    """Puts over the rings with the reply records' body invalidate dropped:
    enough traffic to wrap the rings, replies longer than one line."""
    r = run(m, 1, "put", "g", n=600, size=64, churn=0, mutate=mutate)
    return r["ok"] == 600 and run(m, 1, "get", "g", n=600, size=64, churn=0, mutate=mutate)["ok"] == 600


MUTATIONS = {"drop_publish_writeback": steps_publish, "drop_read_invalidate": steps_read,
             "drop_ring_invalidate": steps_ring}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_unmutated_steps_pass(sim_master, mutation):
    assert MUTATIONS[mutation](sim_master, None)
    assert sim_counters(sim_master.pool_path) == (0, 0, 0)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_each_mutation_is_caught(sim_master, mutation):
    assert not MUTATIONS[mutation](sim_master, mutation), f"{mutation} went unnoticed"
