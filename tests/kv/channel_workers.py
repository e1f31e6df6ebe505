"""Child-process bodies for tests/kv/test_kv_channels.py: one client (of a
tenant) per process holding announcement channels, driven over the Child
pipe. Each command is a tuple (op, *args); the reply is what it did."""
from mooncake_cxl import MooncakeDistributedStore
from mooncake_cxl.kv.announce import Announcer, Listener
from mooncake_cxl.kv.cache import KVCacheError


def channel_client(conn, address, tenant_id="default"):
    """Serves channel commands until "stop" (which closes the store)."""
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address, tenant_id=tenant_id)
    conn.send(("ready", rc))
    producers, listeners = {}, {}
    while True:
        op, *args = conn.recv()
        try:
            if op == "stop":
                s.close()
                return "stopped"
            if op == "announce":
                producers[args[0]] = Announcer(s, args[0])
                conn.send(0)
            elif op == "publish":
                name, request, first, end = args
                conn.send(producers[name].blocks_ready(request, first, end))
            elif op == "listen":
                listeners[args[0]] = Listener(s, args[0], from_start=True)
                conn.send(0)
            elif op == "poll":
                lis = listeners[args[0]]
                conn.send(([(a.request, a.first, a.end) for a in lis.poll()], lis.channel_lost))
            elif op == "open_many":  # until one fails: (how many opened, its code or 0)
                prefix, n = args
                conn.send(_open_many(s, listeners, prefix, n))
            else:
                conn.send(("unknown op", op))
        except KVCacheError as e:
            conn.send(e.code)


def _open_many(store, listeners, prefix, n):
    for i in range(n):
        try:
            listeners[f"{prefix}{i}"] = Listener(store, f"{prefix}{i}")
        except KVCacheError as e:
            return i, e.code
    return n, 0
