"""Client processes of test_ha.py: a steady put/get load against an etcd://
address that follows the elected master across takeovers."""
import os
import time

from conftest import open_store, value_for

VALUE_BYTES = 1024


def put_get_load(conn, address, prefix, stop_path):
    """Puts prefix-0, prefix-1, ... until `stop_path` exists, re-reading the
    previous acknowledged key after each put. Returns the acknowledged keys
    with the wall-clock time of each acknowledgement, the failed keys with
    their codes, and the reads of acknowledged keys that did not return the
    value."""
    s = open_store(address)
    conn.send("ready")
    acked, failed, bad_reads = [], [], []
    last = None
    i = 0
    while not os.path.exists(stop_path):
        key = f"{prefix}-{i}"
        rc = s.put(key, value_for(key, VALUE_BYTES))
        if rc == 0:
            acked.append((key, time.time()))
            last = key
        else:
            failed.append((key, rc))
        if last is not None:
            got = s.get(last)  # one-sided: needs no master
            if got != value_for(last, VALUE_BYTES):
                bad_reads.append((last, len(got)))
        i += 1
        time.sleep(0.002)  # paces the load generator; not a synchronisation
    s.close()
    return {"acked": acked, "failed": failed, "bad_reads": bad_reads}


def attach_and_wait(conn, address):
    """Attaches, says so, and stays attached until killed."""
    s = open_store(address)
    assert s.put("held-by-victim", b"x" * 64) == 0
    conn.send("attached")
    while True:
        time.sleep(1)  # idles until the test kills it
