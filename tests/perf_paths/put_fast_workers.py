"""Workers of test_put_fast.py (spawned: importable at top level)."""
import os


def small_put_worker(addr, w, n, q):
    """n small puts + upserts over the rings (the single-key fast path), each
    read back at once; reports mismatches and return codes."""
    os.environ["MC_CXL_RPC"] = "ring"
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", addr) == 0
    bad = []
    for i in range(n):
        key = f"fast/{w}/{i}" if i % 2 else f"fast/{w}/{i}".encode()
        v = bytes([(w * 31 + i) % 251]) * (1 + (i * 97) % 8192)
        rc = s.put(key, v)
        if rc != 0 or s.get(key) != v:
            bad.append(("put", i, rc))
        v2 = v[::-1] + b"u"
        rc = s.upsert(key, v2)
        if rc != 0 or s.get(key) != v2:
            bad.append(("upsert", i, rc))
    # A shared key everyone upserts: whatever wins must be one whole value.
    for i in range(n // 4):
        s.upsert("fast/shared", bytes([w]) * (4096 + w))
    s.close()
    q.put((w, bad))
