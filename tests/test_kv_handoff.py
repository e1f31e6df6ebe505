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
    assert d["code"] == -1010 and "exited" in d["reason"] and "'req-5'" in d["error"], d
    assert d["blocks"] == 8 and d["loaded"] == 8 and d["bad"] == 0, d
    assert d["seconds"] < 100  # the death was noticed, not the 120 s timeout
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
