"""Child-process bodies for the zero-copy multi-process tests (spawned, so
they live in an importable module)."""
import time

import numpy as np

LAYERS, BLOCK = 8, 16 << 10


def kv_arrays(req, layer):
    rng = np.random.default_rng(req * 1000 + layer)
    return (rng.integers(0, 256, BLOCK, dtype=np.uint8), rng.integers(0, 256, BLOCK, dtype=np.uint8))


def connect(address):
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address) == 0
    return s


def prefill_writer(address, requests, q):
    """Each request's key holds K and V of every layer, gathered from separate arrays."""
    s = connect(address)
    arrays = {(r, l): kv_arrays(r, l) for r in range(requests) for l in range(LAYERS)}
    for a, b in arrays.values():
        assert s.register_buffer(a.ctypes.data, a.nbytes) == 0
        assert s.register_buffer(b.ctypes.data, b.nbytes) == 0
    keys = [f"req{r}" for r in range(requests)]
    ptrs = [[x.ctypes.data for l in range(LAYERS) for x in arrays[(r, l)]] for r in range(requests)]
    sizes = [[BLOCK] * (2 * LAYERS) for _ in range(requests)]
    q.put(s.batch_put_from_multi_buffers(keys, ptrs, sizes))
    s.close()


def holder(address, key, q, release):
    """Holds a BufferHandle on `key` until `release` is set; reports its bytes."""
    s = connect(address)
    h = s.get_buffer(key)
    q.put(bytes(h) if h is not None else None)
    release.wait(60)
    q.put(bytes(h))
    del h
    s.close()


def holder_then_hang(address, key, q):
    """Takes a handle and waits to be killed."""
    s = connect(address)
    h = s.get_buffer(key)
    q.put(h is not None)
    time.sleep(120)
