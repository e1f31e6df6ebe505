"""Demo: python -m mooncake_cxl.demo

Starts a master over a pool file in /dev/shm, a writer process that puts a
few KV blocks, and a reader process that reads them straight from the pool
(no master round trip), then prints what each did.
"""
import multiprocessing as mp
import os
import uuid

from .launch import MasterProcess


def _store(address, who):
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup(f"127.0.0.1:{who}", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
    assert rc == 0, f"setup failed: {rc}"
    return s


def writer(address, q):
    s = _store(address, "prefill")
    for layer in range(4):
        key = f"request-42/layer-{layer}"
        value = bytes([layer]) * (256 << 10)
        q.put(f"[writer pid {os.getpid()}] put {key!r} ({len(value) >> 10} KiB) -> {s.put(key, value)}")
    q.put(f"[writer pid {os.getpid()}] put 'request-42/layer-0' again -> {s.put('request-42/layer-0', b'x')} "
          "(an existing key keeps its first value)")
    s.close()


def reader(address, q):
    s = _store(address, "decode")
    keys = [f"request-42/layer-{layer}" for layer in range(5)]
    q.put(f"[reader pid {os.getpid()}] batch_is_exist {keys} -> {s.batch_is_exist(keys)}")
    for layer, v in enumerate(s.get_batch(keys[:4])):
        ok = v == bytes([layer]) * (256 << 10)
        q.put(f"[reader pid {os.getpid()}] get {keys[layer]!r} -> {len(v) >> 10} KiB, content {'OK' if ok else 'WRONG'}")
    q.put(f"[reader pid {os.getpid()}] remove_all(force=True) -> {s.remove_all(force=True)} objects removed")
    s.close()


def main():
    pool = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", f"mcxl_demo_{uuid.uuid4().hex}")
    ctx = mp.get_context("spawn")
    try:
        with MasterProcess(pool, 64 << 20, format=True) as m:
            print(f"[master] listening on {m.address}, pool {pool} (64 MiB), uuid {m.uuid}")
            q = ctx.Queue()
            for target in (writer, reader):
                p = ctx.Process(target=target, args=(m.address, q))
                p.start()
                p.join(120)
                while not q.empty():
                    print(q.get())
                if p.exitcode != 0:
                    raise SystemExit(f"{target.__name__} failed with exit code {p.exitcode}")
        print("[master] stopped; demo done")
    finally:
        if os.path.exists(pool):
            os.unlink(pool)


if __name__ == "__main__":
    main()
