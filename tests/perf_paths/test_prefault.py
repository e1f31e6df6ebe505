"""Pool prefault: master --prefault_pool allocates and maps every
pool page at start, a client with MC_CXL_PREFAULT=1 maps them at attach, so
a large put into never-touched space takes no page faults (without it, a
16 MiB put into fresh pages faulted ~4096 times and took ~17x a warm one).
Fault counts (ru_minflt), not timings, are asserted. Writer and reader are
separate processes."""
import resource

import pytest

from conftest import open_store, value_for

SIZE = 16 << 20


def _put_faults(conn, address, prefault, n):
    import os
    if prefault:
        os.environ["MC_CXL_PREFAULT"] = "1"
    else:
        os.environ.pop("MC_CXL_PREFAULT", None)
    s = open_store(address)
    out = []
    for i in range(n):
        v = value_for(f"pf/{prefault}/{i}", SIZE)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rc = s.put(f"pf/{prefault}/{i}", v)
        out.append((rc, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0))
    s.close()
    return out


def _read_back(conn, address, prefault, n):
    import os
    if prefault:
        os.environ["MC_CXL_PREFAULT"] = "1"
    s = open_store(address)
    ok = [s.get(f"pf/{prefault}/{i}") == value_for(f"pf/{prefault}/{i}", SIZE) for i in range(n)]
    s.close()
    return ok


@pytest.mark.parametrize("prefault", [True, False])
def test_put_into_fresh_pages_faults_only_without_prefault(master_factory, children, prefault):
    m = master_factory(pool_size=256 << 20, extra_flags=["--prefault_pool"] if prefault else [])
    n = 3
    res = children(_put_faults, m.address, prefault, n).result()
    assert [rc for rc, _ in res] == [0] * n
    faults = [f for _, f in res]
    # The value's own bytes (a Python bytes object built before the timing)
    # fault nothing here; what is counted is the pool's pages the copy writes.
    if prefault:
        assert max(faults) < 64, faults  # 4096 pages per put otherwise
    else:
        assert max(faults) >= SIZE // 4096 // 2, faults  # confirms what the flag avoids
    assert children(_read_back, m.address, prefault, n).result() == [True] * n
    if prefault:
        assert "prefaulted the pool" in m.log_tail(1 << 20)
