"""Child-process bodies for tests/api/test_tensor.py (spawned: importable by name)."""
from conftest import connect


class _Master:
    def __init__(self, address):
        self.address = address

    def log_tail(self):
        return ""


def put_tensors(conn, address, specs):
    """Puts torch tensors built from (key, dtype name, shape) specs; returns the put results."""
    import torch
    s = connect(_Master(address))
    out = []
    for key, dtype, shape in specs:
        n = 1
        for d in shape:
            n *= d
        t = (torch.arange(n, dtype=torch.float64) % 7).to(getattr(torch, dtype)).reshape(shape)
        out.append(s.put_tensor(key, t))
    s.close()
    return out


def put_bytes(conn, address, hostname, items):
    """Puts (key, value) pairs as a client named `hostname`; returns the results."""
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.setup(hostname, "P2PHANDSHAKE", 0, 0, "cxl", "", address) == 0
    out = [s.put(k, v) for k, v in items]
    s.close()
    return out
