"""Zero-copy across processes: a prefill-like writer gathers K/V of many layers
with batch_put_from_multi_buffers; a decode-like reader scatters them with
batch_get_into_multi_buffers and views them with get_buffer. Pins held in
one process protect bytes against removal from another, and die with it."""
import multiprocessing as mp

import numpy as np

from conftest import connect, lease_remaining_ms, metric, poll, wait_until
from zc_workers import BLOCK, LAYERS, holder, holder_then_hang, kv_arrays, prefill_writer

CTX = mp.get_context("spawn")


def _run(target, *args, timeout=120):
    q = CTX.Queue()
    p = CTX.Process(target=target, args=args + (q,))
    p.start()
    result = q.get(timeout=timeout)
    p.join(timeout)
    assert p.exitcode == 0
    return result


def test_prefill_writes_decode_reads_every_byte(master):
    requests = 6
    assert _run(prefill_writer, master.address, requests) == [0] * requests
    s = connect(master)
    try:
        keys = [f"req{r}" for r in range(requests)]
        outs = {(r, l): (np.zeros(BLOCK, np.uint8), np.zeros(BLOCK, np.uint8))
                for r in range(requests) for l in range(LAYERS)}
        ptrs = [[x.ctypes.data for l in range(LAYERS) for x in outs[(r, l)]] for r in range(requests)]
        sizes = [[BLOCK] * (2 * LAYERS)] * requests
        assert s.batch_get_into_multi_buffers(keys, ptrs, sizes) == [2 * LAYERS * BLOCK] * requests
        for (r, l), (k, v) in outs.items():
            want_k, want_v = kv_arrays(r, l)
            assert np.array_equal(k, want_k) and np.array_equal(v, want_v), (r, l)
        for r, h in enumerate(s.batch_get_buffer(keys)):
            view = np.frombuffer(h, dtype=np.uint8).reshape(LAYERS, 2, BLOCK)
            for l in range(LAYERS):
                want_k, want_v = kv_arrays(r, l)
                assert np.array_equal(view[l, 0], want_k) and np.array_equal(view[l, 1], want_v)
    finally:
        s.close()


def test_pin_in_one_process_survives_remove_in_another(master):
    s = connect(master)
    value = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    assert s.put("shared", value) == 0
    q, release = CTX.Queue(), CTX.Event()
    p = CTX.Process(target=holder, args=(master.address, "shared", q, release))
    p.start()
    try:
        assert q.get(timeout=60) == value
        # The other process's read lease (on a non-coherent pool it reaches
        # the master from that process's lease thread, a moment later).
        wait_until(lambda: lease_remaining_ms(master, "shared") > 0, "the holder's read lease", master=master)
        assert s.remove("shared") == -706
        assert s.remove("shared", force=True) == 0
        for i in range(120):  # reuse the space hard
            assert s.put(f"churn{i}", bytes([i % 256]) * (1 << 20)) == 0
            if i >= 40:
                assert s.remove(f"churn{i - 40}", force=True) == 0
        release.set()
        assert q.get(timeout=60) == value
    finally:
        release.set()
        p.join(60)
        s.close()


def _removed_but_viewed(master):
    return metric(master, "master_objects", state="removed_but_viewed")


def test_pins_of_a_killed_process_are_released(master_factory):
    # A short lease, so that only the pin is left. A pin does not refuse an
    # unforced remove (Mooncake returns 0: its handles are private copies):
    # the key goes at once, the extent waits for the view and is freed when
    # the viewing process dies.
    master = master_factory(extra_flags=["--default_kv_lease_ttl=50"])
    s = connect(master)
    assert s.put("victim", bytes(4 << 20)) == 0
    q = CTX.Queue()
    p = CTX.Process(target=holder_then_hang, args=(master.address, "victim", q))
    p.start()
    try:
        assert q.get(timeout=60) is True
        assert poll(lambda: s.remove("victim"), done=lambda rc: rc != -706) == 0  # the lease lapses in 50 ms
        assert s.is_exist("victim") == 0
        assert _removed_but_viewed(master) == 1  # the extent is still the viewer's
        p.kill()
        p.join(30)
        # The master reclaims the dead client's slot and with it the pin.
        wait_until(lambda: _removed_but_viewed(master) == 0, "the dead viewer's pin to be released", master=master)
    finally:
        if p.is_alive():
            p.kill()
        s.close()
