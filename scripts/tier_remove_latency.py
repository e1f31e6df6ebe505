"""Remove latency with the SSD tier: disk-resident keys (the client waits
for its tombstone to be written) vs pool-only keys (no ticket, no wait),
and one batch_remove of 100 disk-resident keys (group commit).
Usage: python scripts/tier_remove_latency.py [tier parent dir, default /dev/shm]"""
import os
import shutil
import statistics
import sys
import time
import uuid

from mooncake_cxl import MooncakeDistributedStore
from mooncake_cxl.launch import MasterProcess


def value_for(key, size):
    return (key.encode() * (size // max(1, len(key)) + 1))[:size]


def connect(m):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", m.address) == 0
    return s


SIZE = 64 << 10
POOL = 32 << 20
parent = sys.argv[1] if len(sys.argv) > 1 else "/dev/shm"
d = os.path.join(parent, f"mcxl_tier_{uuid.uuid4().hex}")
p = f"/dev/shm/mcxl_test_{uuid.uuid4().hex}"
m = MasterProcess(p, POOL, format=True, extra_flags=["--enable_offload", f"--root_fs_dir={d}", "--offload_on_evict"], log_path=os.devnull).start()
s = connect(m)
n = 3 * POOL // SIZE
for i in range(n):
    s.put(f"k{i}", value_for(f"k{i}", SIZE))
time.sleep(2)
disk, pool = [], []
for i in range(n):
    dd = s.get_replica_desc(f"k{i}")
    (disk if dd and dd[0].is_disk_replica() else pool).append(f"k{i}")
def lat(keys):
    out = []
    for k in keys:
        t = time.perf_counter(); rc = s.remove(k, True); out.append((time.perf_counter() - t) * 1e6)
        assert rc == 0
    out.sort()
    return len(out), statistics.median(out), out[int(0.99 * len(out))], statistics.mean(out)
print("disk-resident remove: n=%d p50=%.1f us p99=%.1f us mean=%.1f us" % lat(disk[:300]))
print("pool-only remove:     n=%d p50=%.1f us p99=%.1f us mean=%.1f us" % lat(pool[:300]))
b = disk[300:400]
t = time.perf_counter(); r = s.batch_remove(b, True); dt = (time.perf_counter() - t) * 1e6
print("batch_remove of %d disk-resident keys: %.1f us (%.1f us/key)" % (len(b), dt, dt / len(b)))
m.stop(); os.unlink(p); shutil.rmtree(d)
