"""Pool prefault, on by default: the master allocates the pool file's pages
in the background after start (on /dev/shm: fallocate, no mapping of its
own touched), and a client maps them in the background after setup, so once that is done a large
put into never-touched space takes no page faults (without it, a 16 MiB put
into fresh pages faulted ~4096 times). `--prefault_pool=false` and
MC_CXL_PREFAULT=0 turn it off. Fault counts (ru_minflt), the file's
allocated blocks and a client's resident pages (/proc/<pid>/smaps), not
timings, are asserted. Writer and reader are
separate processes."""
import os
import resource

import pytest

from conftest import open_store, value_for, wait_for_log, wait_until

SIZE = 16 << 20
POOL = 256 << 20


def pool_rss(pid, path):
    """Bytes of `path`'s mapping resident in process `pid` (smaps Rss)."""
    real = os.path.realpath(path)
    rss, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                inside = len(head) >= 6 and head[5] == real
            elif inside and head[:1] == ["Rss:"]:
                rss += int(head[1]) << 10
    return rss


def _put_faults(conn, address, pool_path, prefault, n):
    if prefault:
        os.environ.pop("MC_CXL_PREFAULT", None)  # the default
    else:
        os.environ["MC_CXL_PREFAULT"] = "0"
    s = open_store(address)
    if prefault:  # setup did not wait: wait for the background population here
        wait_until(lambda: pool_rss(os.getpid(), pool_path) >= POOL, "the client's mapping to be populated")
    out = []
    for i in range(n):
        v = value_for(f"pf/{prefault}/{i}", SIZE)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rc = s.put(f"pf/{prefault}/{i}", v)
        out.append((rc, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0))
    s.close()
    return out


def _read_back(conn, address, prefault, n):
    if not prefault:
        os.environ["MC_CXL_PREFAULT"] = "0"
    s = open_store(address)
    ok = [s.get(f"pf/{prefault}/{i}") == value_for(f"pf/{prefault}/{i}", SIZE) for i in range(n)]
    s.close()
    return ok


@pytest.mark.parametrize("prefault", [True, False])
def test_put_into_fresh_pages_faults_only_without_prefault(master_factory, children, pool_path, prefault):
    m = master_factory(pool_size=POOL, extra_flags=[] if prefault else ["--prefault_pool=false"])
    if prefault:
        wait_for_log(m, r"\[master\] populated the pool \(256 of 256 MiB, data included, allocated\)", start=0)
        assert os.stat(pool_path).st_blocks * 512 >= POOL
    else:
        assert os.stat(pool_path).st_blocks * 512 < POOL // 2
    n = 3
    res = children(_put_faults, m.address, pool_path, prefault, n).result()
    assert [rc for rc, _ in res] == [0] * n
    faults = [f for _, f in res]
    # The value's own bytes (a Python bytes object built before the count)
    # fault nothing here; what is counted is the pool's pages the copy writes.
    if prefault:
        assert max(faults) < 64, faults  # 4096 pages per put otherwise
    else:
        assert max(faults) >= SIZE // 4096 // 2, faults  # confirms what the default avoids
    assert children(_read_back, m.address, prefault, n).result() == [True] * n
    if not prefault:
        assert "populated the pool" not in m.log_tail(1 << 20)
