"""The PD hand-off's failure and reuse paths (mooncake_cxl.kv.receive /
Listener.follow): a consumer of a SIGKILLed producer, of a silent one and of
an aborted request gets RequestIncomplete naming the request, the blocks
that arrived (loaded, every byte checked) and why, not a hang; a consumer
started after the producer died learns it at once. Decode write-back: a
third process finds the prefill's and the decode's blocks as one prefix."""
import kv_hold_workers as H

N = 16  # blocks: 4 runs of 4


def test_consumer_of_a_killed_producer_gets_a_clear_result(master, children):
    dec = children(H.decode, master.address, 5, N, "dead-ch", 120.0)
    assert dec.recv() == "listening"
    pre = children(H.prefill, master.address, 5, N, 60.0, "dead-ch", 2, "sleep")
    assert pre.recv() == ("stopped", 8)
    pre.kill()
    d = dec.result()
    # -1010 "... exited": the death was noticed (the 120 s timeout gives RPC_TIMEOUT "not done after").
    assert d["code"] == -1010 and "exited" in d["reason"] and "'req-5'" in d["error"], d
    assert d["blocks"] == 8 and d["loaded"] == 8 and d["bad"] == 0, d
    # A consumer that starts after the death is told at once, from the records.
    late = children(H.decode, master.address, 5, N, "dead-ch", 120.0).result()
    assert late["code"] == -1010 and late["blocks"] == 8 and late["loaded"] == 8 and late["bad"] == 0, late


def test_silent_and_aborting_producers(master, children):
    dec = children(H.decode, master.address, 6, N, "quiet-ch", 120.0, 1.0)
    assert dec.recv() == "listening"
    pre = children(H.prefill, master.address, 6, N, 60.0, "quiet-ch", 1, "sleep")
    assert pre.recv() == ("stopped", 4)
    d = dec.result()
    assert d["code"] == -901 and "no announcement for 1 s" in d["reason"], d
    assert d["blocks"] == 4 and d["loaded"] == 4 and d["bad"] == 0, d
    assert pre.proc.is_alive()
    dec = children(H.decode, master.address, 7, N, "abort-ch", 120.0)
    assert dec.recv() == "listening"
    ab = children(H.prefill, master.address, 7, N, 60.0, "abort-ch", 3, "abort")
    assert ab.recv() == ("stopped", 12)
    d = dec.result()
    assert d["code"] == -1010 and "aborted" in d["reason"] and d["loaded"] == 12 and d["bad"] == 0, d


def test_decode_write_back_continues_the_prefix(master, children):
    """Prefill stores 10 blocks (+3 tokens); decode loads them, generates 80
    tokens (5 more full blocks) and saves them with the chain continued; a
    third process finds all 15 as one prefix and loads every byte."""
    children(H.prefill, master.address, 9, 10, None).result()
    wb = children(H.write_back, master.address, 9, 10, 80).result()
    assert wb == {"loaded": 10, "bad": 0, "saved_blocks": 5, "written": 2}, wb  # runs 8..11, 12..14
    t = children(H.third, master.address, 9, 10, 80).result()
    assert t["blocks"] == t["prefix"] == t["loaded"] == 15 and t["bad"] == 0, t
    assert t["objects"] == [(0, 4), (4, 4), (8, 4), (12, 3)], t


def test_done_alone_loads_everything_and_other_requests_wait_their_turn(master):
    """A producer whose blocks were all stored before announces only
    REQUEST_DONE: receive() loads them all. Records of another request on the
    same channel are kept for that request's follow()."""
    import kv_workers as W
    from conftest import connect
    from mooncake_cxl.kv import Announcer, Listener, receive
    s = connect(master)
    cache = H.make_cache(s)
    hashes = cache.block_hashes(H.request(cache, 11, 6))
    src = cache.layout.allocate(8)
    cache.register(src)
    W.fill_engine(cache, src, hashes, range(6), model="hold")
    cache.save(hashes, range(6))
    lis = Listener(s, "done-ch")
    ann = Announcer(s, "done-ch")
    ann.blocks_ready("other", 0, 2)
    ann.request_done("req-11", 6)
    ann.request_done("other", 2)
    cache.unregister()
    dst = cache.layout.allocate(8)
    cache.register(dst)
    assert receive(cache, lis, "req-11", hashes, [7, 6, 5, 4, 3, 2], timeout=30) == 6
    assert W.check_engine(cache, dst, hashes, [7, 6, 5, 4, 3, 2], model="hold") == 0
    assert [(a.kind, a.end) for a in lis.follow("other", timeout=30)] == [(1, 2), (2, 2)]
    ann.close()
    s.close()
