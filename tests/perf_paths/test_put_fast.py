"""The single-key put path (Client::PutOne, per-thread request/reply buffers,
ring frames pushed as header + payload): several processes put and upsert
small values over the rings at once and read each one back; str and bytes
keys name the same key; keys of other types are refused with TypeError."""
import multiprocessing as mp

import pytest

from conftest import connect
from put_fast_workers import small_put_worker

CTX = mp.get_context("spawn")


def test_processes_put_and_upsert_small_values_and_read_them_back(master, monkeypatch):
    monkeypatch.setenv("MC_CXL_RPC", "ring")
    n, workers = 120, 4
    q = CTX.Queue()
    procs = [CTX.Process(target=small_put_worker, args=(master.address, w, n, q)) for w in range(workers)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert all(results[w] == [] for w in range(workers)), results
    s = connect(master)
    try:
        for w in range(workers):  # every process's last values, seen from another
            i = n - 1
            v = bytes([(w * 31 + i) % 251]) * (1 + (i * 97) % 8192)
            assert s.get(f"fast/{w}/{i}") == v[::-1] + b"u"
        shared = s.get("fast/shared")
        assert shared in {bytes([w]) * (4096 + w) for w in range(workers)}
    finally:
        s.close()


def test_key_forms(store):
    assert store.put("k/str", b"a") == 0
    assert store.get(b"k/str") == b"a"  # bytes and str name the same key
    assert store.put(b"k/bytes", b"b") == 0
    assert store.get("k/bytes") == b"b"
    assert store.put("ключ", b"c") == 0 and store.get("ключ") == b"c"
    assert store.put("k/str", b"other") == 0  # exists: first value kept
    assert store.get("k/str") == b"a"
    assert store.upsert("k/str", b"new") == 0 and store.get("k/str") == b"new"
    for bad in (123, None, 1.5):
        with pytest.raises(TypeError):
            store.put(bad, b"x")
    assert store.put("", b"x") < 0 and store.put("e", b"") < 0
    assert store.put("k/after", b"ok") == 0  # the store stays usable
