"""Remote-host children of test_remote.py, run as a script inside a private
mount namespace whose /dev/shm is an empty tmpfs (`unshare -m`), so the pool
file really cannot be opened: setup() must choose the remote client itself.
Each command prints JSON lines on stdout (flushed) for the test to wait on.

    remote_workers.py <command> <master address> [args...]
"""
import json
import os
import struct
import sys
import time
import zlib

from mooncake_cxl import MooncakeDistributedStore


def emit(**kw):
    print(json.dumps(kw), flush=True)


def checked_value(key, seq, size):
    """A value that says which key and version it is, with a crc over all of it."""
    head = struct.pack("<Q", seq) + key.encode().ljust(24, b"\0")[:24]
    body = (head * (size // len(head) + 1))[:size - len(head) - 4]
    v = head + body
    return v + struct.pack("<I", zlib.crc32(v))


def check_value(key, v):
    """(seq, None) or (None, why) for bytes read back."""
    if len(v) < 36 or struct.unpack("<I", v[-4:])[0] != zlib.crc32(v[:-4]):
        return None, "torn"
    if v[8:32].rstrip(b"\0") != key.encode()[:24]:
        return None, "foreign"
    return struct.unpack("<Q", v[:8])[0], None


def setup(master, hostname="127.0.0.1:0"):
    s = MooncakeDistributedStore()
    rc = s.setup(hostname, "P2PHANDSHAKE", 0, 0, "tcp", "", master)
    return s, rc


def roundtrip(master, nkeys):
    s, rc = setup(master)
    emit(setup=rc, remote=type(s).__name__ == "RemoteDistributedStore",
         pool_visible=os.path.exists(os.environ.get("MCXL_TEST_POOL", "/nonexistent")))
    if rc != 0:
        return
    n = int(nkeys)
    local = [s.get(f"local-{i}") == checked_value(f"local-{i}", 1, 4096 + i) for i in range(n)]
    keys = [f"remote-{i}" for i in range(n)]
    rc_put = s.put_batch(keys, [checked_value(k, 1, 70000) for k in keys])
    big = checked_value("big", 1, 3 << 20)
    rc_big = s.put("big", big)
    (desc,) = s.get_replica_desc("big")
    emit(local_ok=all(local), put=rc_put, big=rc_big, big_back=s.get("big") == big,
         read_by=desc.read_by, te_session=desc.te_session,
         batch_back=[check_value(k, v)[0] for k, v in zip(keys, s.get_batch(keys))])
    s.close()


def compat_engine(master):
    """Under MOONCAKE_CXL_COMPAT=1: setup, whether the program may import
    mooncake.engine, then a put and a get over the engine."""
    s, rc = setup(master)
    try:
        import mooncake.engine  # noqa: F401
        imported = "imported"
    except ModuleNotFoundError:
        imported = "refused"
    emit(setup=rc, program_import=imported)
    if rc == 0:
        v = checked_value("compat", 1, 70000)
        emit(put=s.put("compat", v), back=s.get("compat") == v)
        s.close()


def record_words(n):
    """The payload producer and reader agree on for record n (a torn copy mixes two)."""
    return [n] + [(n * 1000003 + k) & ((1 << 64) - 1) for k in range(1, 7)]


def listen(master, channel, count):
    """Follows `channel` from its start until record count-1 is read (or
    the channel is lost, or 120 s pass), checking every record's words."""
    s, rc = setup(master)
    refused = s._announce_open(channel, True)
    r = s._announce_open(channel, False, True)
    emit(setup=rc, producer=refused if isinstance(refused, int) else "opened",
         reader=r if isinstance(r, int) else "opened")
    if isinstance(r, int):
        return
    seen = {"ok": 0, "lapped": 0, "bad": 0, "last": -1, "lost": False}
    deadline = time.monotonic() + 120
    while seen["last"] < int(count) - 1 and time.monotonic() < deadline:
        got = r.next()
        if got is None:
            r.wait(1.0)
        elif got[0] == "lapped":
            seen["lapped"] += got[1]
        elif got[0] == "lost":
            seen["lost"] = True
            break
        else:
            n, words = got
            seen["ok"] += 1
            seen["bad"] += words != record_words(n) or n <= seen["last"]
            seen["last"] = n
    r.close()
    emit(done=seen)
    s.close()


def no_secret(master):
    # Without a secret a host is remote only when told (else the local setup
    # reports the pool it cannot open).
    os.environ.pop("MC_CXL_AUTH_TOKEN_FILE", None)
    os.environ["MC_CXL_REMOTE"] = "1"
    s, rc = setup(master)
    emit(setup=rc)


def reader(master, keys, seconds):
    """Reads `keys` (comma-separated) in batches and singly until `seconds`
    pass or the parent closes stdin; counts what it saw."""
    s, rc = setup(master)
    emit(setup=rc)
    if rc != 0:
        return
    keys = keys.split(",")
    last = {k: 0 for k in keys}
    seen = {"ok": 0, "miss": 0, "torn": 0, "foreign": 0, "stale": 0, "errors": 0}
    deadline = time.monotonic() + float(seconds)
    rounds = 0
    while time.monotonic() < deadline:
        values = s.get_batch(keys) if rounds % 2 else [s.get(k) for k in keys]
        for k, v in zip(keys, values):
            if not v:
                seen["miss"] += 1
                continue
            seq, why = check_value(k, v)
            if why:
                seen[why] += 1
            elif seq < last[k]:
                seen["stale"] += 1
            else:
                last[k] = seq
                seen["ok"] += 1
        rounds += 1
        if rounds % 20 == 0:
            emit(progress=seen["ok"])
    emit(done=seen, rounds=rounds)
    s.close()


def survive(master, key):
    """Reads `key` in a loop, reporting each outcome change, until told to
    stop by a line on stdin... or 120 s pass (a hang guard)."""
    s, rc = setup(master)
    emit(setup=rc)
    if rc != 0:
        return
    import select
    state = None
    deadline = time.monotonic() + 120
    oks = errors = 0
    while time.monotonic() < deadline:
        v = s.get(key)
        if v:
            seq, why = check_value(key, v)
            outcome = "ok" if why is None else why
        else:
            outcome = "error"
        oks += outcome == "ok"
        errors += outcome == "error"
        if outcome != state:
            state = outcome
            emit(outcome=outcome, oks=oks, errors=errors)
        if select.select([sys.stdin], [], [], 0)[0]:
            break
    emit(done=True, oks=oks, errors=errors, torn=state in ("torn", "foreign"))
    s.close()


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"roundtrip": roundtrip, "no_secret": no_secret, "reader": reader, "survive": survive,
     "compat_engine": compat_engine, "listen": listen}[cmd](*args)
