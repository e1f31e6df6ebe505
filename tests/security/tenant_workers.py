"""Child-process bodies for tests/security/test_tenants.py: one tenant's client per
process, driven over the Child pipe (conftest.children). Each command is a
tuple (op, *args); the reply is the store's answer."""
import numpy as np

from conftest import MooncakeDistributedStore


def tenant_client(conn, address, tenant_id):
    """Serves commands for one store set up with `tenant_id` until "stop"."""
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address, tenant_id=tenant_id)
    conn.send(("ready", rc))
    views = []
    while True:
        op, *args = conn.recv()
        if op == "stop":
            s.close()
            return "stopped"
        if op == "get_into":
            key, n = args
            buf = np.zeros(n, dtype=np.uint8)
            got = s.get_into(key, buf.ctypes.data, n)
            conn.send((got, buf[:max(got, 0)].tobytes()))
        elif op == "batch_get_into":
            keys, n = args
            bufs = [np.zeros(n, dtype=np.uint8) for _ in keys]
            got = s.batch_get_into(keys, [b.ctypes.data for b in bufs], [n] * len(keys))
            conn.send((got, [b[:max(g, 0)].tobytes() for b, g in zip(bufs, got)]))
        elif op == "put_from":
            key, value = args
            buf = np.frombuffer(value, dtype=np.uint8).copy()
            conn.send(s.put_from(key, buf.ctypes.data, len(value)))
        elif op == "get_buffer":
            h = s.get_buffer(args[0])
            if h is not None:
                views.append(h)
            conn.send(None if h is None else bytes(h))
        elif op == "drop_views":
            views.clear()
            conn.send(True)
        else:
            conn.send(getattr(s, op)(*args))
