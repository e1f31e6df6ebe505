"""Child processes of test_tiering.py (spawned: importable by name)."""
import os

from conftest import open_store, value_for


def put_many(conn, address, prefix, count, size):
    """Puts `count` checksummed values; returns the return codes."""
    s = open_store(address)
    rcs = [s.put(f"{prefix}{i}", value_for(f"{prefix}{i}", size)) for i in range(count)]
    s.close()
    return rcs


def read_all(conn, address, prefix, count, size, env=None):
    """Reads every key back: (missing, wrong bytes, reads served from the tier)."""
    if env:
        os.environ.update(env)
    s = open_store(address)
    missing = bad = 0
    for i in range(count):
        k = f"{prefix}{i}"
        v = s.get(k)
        if not v:
            missing += 1
        elif v != value_for(k, size):
            bad += 1
    n = s.get_offload_rpc_read_count()
    s.close()
    return missing, bad, n
