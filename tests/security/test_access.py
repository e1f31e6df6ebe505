"""Access control: the master's RPC is for
processes that can read the pool, and the pool file is not world-readable.

A raw TCP peer here speaks the frame format of the control library's
message.h and rpc_protocol.h by hand. The real client it attacks is another
process (spawn context), so the attack and the victim are separate
processes. Nothing asserts on time; waits are hang guards only.
"""
import grp
import multiprocessing as mp
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import REPO
from mooncake_cxl import MooncakeDistributedStore, _core
from mooncake_cxl._master import binary_path
from mooncake_cxl.launch import MasterError, MasterProcess

CTX = mp.get_context("spawn")
CHILD_TIMEOUT = 120

ILLEGAL_CLIENT = -601
OBJECT_NOT_FOUND = -704

# message.h / rpc_protocol.h
FRAME = struct.Struct("<IHHIIQ")
FRAME_MAGIC = 0x4D43584C
PROTOCOL_VERSION = _core._layout()["protocol_version"]
PING, ATTACH, DETACH, PUT_START, REMOVE, BATCH_REMOVE, REMOVE_BY_REGEX, REMOVE_ALL, HEARTBEAT = range(1, 10)

# layout.h: Superblock field offsets (layout version 4).
SB_LAYOUT_VERSION = 8
SB_CLIENT_TABLE_OFFSET = 48
SB_CLIENT_SLOT_COUNT = 56
SB_AUTH_TOKEN = 128
CLIENT_SLOT_SIZE = 128


def s32(b):
    return struct.pack("<I", len(b)) + b


def client_ref(slot, gen):
    return struct.pack("<IQ", slot, gen)


def attach_payload(pid, token=b"", name=b"intruder", machine=None, secret=b""):
    machine = socket.gethostname().encode() if machine is None else machine
    token = token.ljust(16, b"\0")[:16]
    return (s32(name) + s32(machine) + struct.pack("<QIQ", pid, 0, 0) + token + s32(b"default") + s32(secret)
            + struct.pack("<Q", 0) + s32(b""))  # no DRAM segment


def remove_payload(ref, keys, force=True):
    return ref + struct.pack("<BI", int(force), len(keys)) + b"".join(s32(k) for k in keys)


def regex_payload(ref, pattern, force=True):
    return ref + struct.pack("<B", int(force)) + s32(pattern)


def put_start_payload(ref, key, size):
    return (ref + struct.pack("<QIBIQ", 1, 0, 0, 0, 0) + struct.pack("<BI", 0, 1)
            + s32(key) + struct.pack("<Q", size) + s32(b""))


class RawPeer:
    """One TCP connection to the master that sends hand-made frames."""

    def __init__(self, master):
        self.sock = socket.create_connection(("127.0.0.1", master.port), timeout=30)
        self.next_id = 1

    def call(self, mtype, payload):
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(FRAME.pack(FRAME_MAGIC, PROTOCOL_VERSION, mtype, len(payload), 0, rid) + payload)
        head = self._recv(FRAME.size)
        magic, version, rtype, n, _, got_id = FRAME.unpack(head)
        assert magic == FRAME_MAGIC and got_id == rid, (magic, got_id, rid)
        body = self._recv(n)
        return struct.unpack_from("<i", body)[0], body

    def status(self, mtype, payload):
        return self.call(mtype, payload)[0]

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("master closed the connection")
            buf += chunk
        return buf

    def close(self):
        self.sock.close()


def read_pool(path, offset, n):
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def pool_token(path):
    assert struct.unpack("<I", read_pool(path, SB_LAYOUT_VERSION, 4))[0] == _core._layout()["layout_version"]
    return read_pool(path, SB_AUTH_TOKEN, 16)


def slot_of_pid(path, pid):
    """(slot, generation) of the attached client whose slot names `pid`."""
    table = struct.unpack("<Q", read_pool(path, SB_CLIENT_TABLE_OFFSET, 8))[0]
    count = struct.unpack("<I", read_pool(path, SB_CLIENT_SLOT_COUNT, 4))[0]
    for i in range(count):
        gen, slot_pid = struct.unpack("<QQ", read_pool(path, table + i * CLIENT_SLOT_SIZE, 16))
        if gen != 0 and slot_pid == pid:
            return i, gen
    raise AssertionError(f"no client slot names pid {pid}")


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# --------------------------------------------------------------------------
# The real client: a separate process.

def _victim(conn, address, transport, keys):
    os.environ["MC_CXL_RPC"] = transport
    try:
        s = MooncakeDistributedStore()
        rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
        if rc != 0:
            conn.send(("setup", rc))
            return
        for k in keys:
            assert s.put(k, k.encode() * 10) == 0, k
        conn.send(("ready", os.getpid()))
        conn.recv()  # the attack happened
        missing = [k for k in keys if s.get(k) != k.encode() * 10]
        rc = s.put("after", b"still works")
        got = s.get("after")
        s.close()
        conn.send(("done", missing, rc, got))
    except BaseException as e:  # reported, not swallowed
        conn.send(("error", repr(e)))


class Victim:
    def __init__(self, master, transport, keys):
        self.conn, child = CTX.Pipe()
        self.proc = CTX.Process(target=_victim, args=(child, master.address, transport, keys))
        self.proc.start()

    def recv(self):
        assert self.conn.poll(CHILD_TIMEOUT), "victim process hung"
        return self.conn.recv()

    def finish(self):
        self.conn.send("go")
        msg = self.recv()
        self.proc.join(CHILD_TIMEOUT)
        return msg


# --------------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["ring", "tcp"])
def test_unattached_peer_cannot_remove_detach_or_put(master, transport):
    keys = [f"victim/{i}" for i in range(10)]
    v = Victim(master, transport, keys)
    msg = v.recv()
    assert msg[0] == "ready", msg
    slot, gen = slot_of_pid(master.pool_path, msg[1])
    real = client_ref(slot, gen)

    peer = RawPeer(master)
    try:
        # The bootstrap needs no credential.
        st, body = peer.call(PING, b"")
        assert st == 0
        # Everything else from a connection that never attached: refused,
        # whether it names the real client (read from the pool's client
        # table, i.e. as guessed as can be) or nobody.
        for ref in (real, client_ref(0, 0), client_ref(slot, gen + 1)):
            assert peer.status(REMOVE_ALL, regex_payload(ref, b"")) == ILLEGAL_CLIENT
            assert peer.status(REMOVE_BY_REGEX, regex_payload(ref, b".*")) == ILLEGAL_CLIENT
            assert peer.status(REMOVE, remove_payload(ref, [keys[0].encode()])) == ILLEGAL_CLIENT
            assert peer.status(BATCH_REMOVE, remove_payload(ref, [k.encode() for k in keys])) == ILLEGAL_CLIENT
            assert peer.status(PUT_START, put_start_payload(ref, b"intruder", 64)) == ILLEGAL_CLIENT
            assert peer.status(HEARTBEAT, ref) == ILLEGAL_CLIENT
            assert peer.status(DETACH, ref) == ILLEGAL_CLIENT
        # An attach without the token (or with a wrong one) does not help.
        assert peer.status(ATTACH, attach_payload(os.getpid())) == ILLEGAL_CLIENT
        assert peer.status(ATTACH, attach_payload(os.getpid(), b"\x01" * 16)) == ILLEGAL_CLIENT
        assert peer.status(REMOVE_ALL, regex_payload(real, b"")) == ILLEGAL_CLIENT
        assert peer.status(DETACH, real) == ILLEGAL_CLIENT
    finally:
        peer.close()

    msg = v.finish()
    assert msg == ("done", [], 0, b"still works"), msg
    log = open(master.log_path, errors="replace").read()
    assert "refused: ILLEGAL_CLIENT" in log, log[-3000:]
    # Nothing was put either.
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(master.metrics_url + "/query_key?key=intruder", timeout=30)
    assert e.value.code == 404


def test_attach_flood_without_token_does_not_lock_out_a_client(master):
    # More tokenless attaches claiming pid 1 than the table has slots (64),
    # some on their own connections, some pipelined on one.
    peers = [RawPeer(master) for _ in range(8)]
    started = time.monotonic()
    try:
        for i in range(200):
            p = peers[i % len(peers)]
            assert p.status(ATTACH, attach_payload(1, name=b"flood%d" % i)) == ILLEGAL_CLIENT
        flood_seconds = time.monotonic() - started
        v = Victim(master, "tcp", ["flooded/0", "flooded/1"])
        msg = v.recv()
        assert msg[0] == "ready", f"a real client was locked out: {msg}; log: {master.log_tail()}"
        assert v.finish() == ("done", [], 0, b"still works")
    finally:
        for p in peers:
            p.close()
    log = open(master.log_path, errors="replace").read()
    # A flood costs at most 10 log lines per second (a bound that holds
    # however slowly the frames were sent), not a line per frame.
    lines = log.count("without the pool's token")
    assert 1 <= lines <= min(200, 10 * (int(flood_seconds) + 2)), lines


def test_token_holder_attach_claims(master_factory):
    m = master_factory(extra_flags=["--client_slots=8"])
    token = pool_token(m.pool_path)
    peer = RawPeer(m)
    try:
        # A claimed local pid that is not running is refused, token or not.
        assert peer.status(ATTACH, attach_payload(dead_pid(), token)) == ILLEGAL_CLIENT
        # With the token and a live pid the peer is a client like any other.
        st, body = peer.call(ATTACH, attach_payload(os.getpid(), token))
        assert st == 0
        slot, gen = struct.unpack_from("<IQ", body, 4)
        assert peer.status(REMOVE, remove_payload(client_ref(slot, gen), [b"nothing-here"])) == OBJECT_NOT_FOUND
        assert peer.status(DETACH, client_ref(slot, gen)) == 0
        # Token holders that fill the table for a process that then dies do
        # not lock a client out: a full table gives up the dead process's slots.
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        try:
            for i in range(8):
                assert peer.status(ATTACH, attach_payload(holder.pid, token, name=b"h%d" % i)) == 0
        finally:
            holder.kill()
            holder.wait()
        v = Victim(m, "ring", ["late/0"])
        msg = v.recv()
        assert msg[0] == "ready", f"{msg}; log: {m.log_tail()}"
        assert v.finish() == ("done", [], 0, b"still works")
    finally:
        peer.close()


def test_key_listing_from_loopback(master):
    from conftest import connect
    s = connect(master)
    try:
        assert s.put("listed/key", b"v") == 0
        with urllib.request.urlopen(master.metrics_url + "/get_all_keys", timeout=30) as r:
            assert "listed/key" in r.read().decode()
        with urllib.request.urlopen(master.metrics_url + "/query_key?key=listed/key", timeout=30) as r:
            assert r.status == 200
    finally:
        s.close()
    # Listening on 127.0.0.1 explicitly: no exposure warning.
    assert "listens on" not in open(master.log_path, errors="replace").read()


# --------------------------------------------------------------------------
# Pool file modes.

def test_launcher_creates_the_pool_owner_only(master_factory, pool_path):
    old = os.umask(0)  # the mode must not depend on the umask
    try:
        m = master_factory()
    finally:
        os.umask(old)
    assert os.stat(m.pool_path).st_mode & 0o777 == 0o600


def test_launcher_pool_group_makes_it_0660(pool_path, tmp_path):
    group = grp.getgrgid(os.getgid()).gr_name
    with MasterProcess(pool_path, 64 << 20, format=True, pool_group=group,
                       log_path=str(tmp_path / "m.log")):
        st = os.stat(pool_path)
        assert st.st_mode & 0o777 == 0o660
        assert st.st_gid == os.getgid()


def test_start_master_script_creates_the_pool_owner_only(pool_path, tmp_path):
    script = os.path.join(REPO, "scripts", "start_master.sh")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "mooncake_cxl_master").symlink_to(binary_path())
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", MC_RPC_PORT="0", MC_METRICS_PORT="0",
               MC_RPC_ADDRESS="127.0.0.1")
    env.pop("MC_POOL_GROUP", None)
    log = open(tmp_path / "script.log", "wb")
    proc = subprocess.Popen(["bash", script, pool_path, str(64 << 20)], env=env, stdout=subprocess.PIPE,
                            stderr=log, umask=0)
    try:
        deadline = time.monotonic() + 60
        out = b""
        while b"mooncake_cxl_master ready" not in out and time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if select.select([proc.stdout], [], [], 0.2)[0]:
                out += proc.stdout.readline()
        assert b"mooncake_cxl_master ready" in out, (out, open(tmp_path / "script.log").read())
        assert os.stat(pool_path).st_mode & 0o777 == 0o600
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        log.close()


def _make_file(path, size, mode):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    os.fchmod(fd, mode)
    os.close(fd)


@pytest.mark.parametrize("mode", [0o644, 0o666], ids=["0644", "0666"])
def test_formatting_a_world_readable_pool_is_refused(pool_path, tmp_path, mode):
    _make_file(pool_path, 64 << 20, mode)
    m = MasterProcess(pool_path, 64 << 20, format=True, log_path=str(tmp_path / "refused.log"))
    with pytest.raises(MasterError):
        m.start()
    assert m.proc.returncode == 1
    log = m.log_tail()
    assert "refusing to format" in log and "--allow_world_readable_pool" in log, log
    assert os.stat(pool_path).st_mode & 0o777 == mode  # left as it was
    with MasterProcess(pool_path, 64 << 20, format=True, extra_flags=["--allow_world_readable_pool"],
                       log_path=str(tmp_path / "allowed.log")) as ok:
        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", ok.address) == 0
        assert s.put("k", b"v") == 0
        s.close()
