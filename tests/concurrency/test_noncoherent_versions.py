"""kLeases (type 16) without a protocol bump (docs/architecture.md section 7,
"Versions"): a client of a non-coherent pool asks the master for it at setup.
A master from before the non-coherent discipline answers an unknown type with
a Status INVALID_PARAMS; here a proxy in front of a current master answers
type 16 that way, and setup must fail with INVALID_VERSION and say why,
while a coherent pool's client never sends it (setup through the same proxy
works)."""
import socket
import struct
import threading

import pytest

from mooncake_cxl import MooncakeDistributedStore
from mooncake_cxl.errors import ErrorCode

HEADER = struct.Struct("<IHHIIQ")  # message.h FrameHeader: magic, version, type, payload_bytes, reserved, request_id
LEASES = 16
INVALID_PARAMS = -600


def read_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class OldMasterProxy:
    """Forwards TCP frames to `master`, answering kLeases as an older master
    (Dispatch's "unknown type": a Status INVALID_PARAMS under the request's
    header). Records the types it saw."""

    def __init__(self, master):
        self.upstream = ("127.0.0.1", master.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.types = []
        self.threads = [threading.Thread(target=self.accept, daemon=True)]
        self.threads[0].start()

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            master = socket.create_connection(self.upstream)
            lock = threading.Lock()  # both directions write to `client`
            for target in (lambda: self.requests(client, master, lock), lambda: self.replies(master, client, lock)):
                t = threading.Thread(target=target, daemon=True)
                t.start()
                self.threads.append(t)

    def requests(self, client, master, lock):
        while (head := read_exact(client, HEADER.size)) is not None:
            magic, version, type_, size, _, request_id = HEADER.unpack(head)
            body = read_exact(client, size) if size else b""
            if body is None:
                break
            self.types.append(type_)
            if type_ == LEASES:
                with lock:
                    client.sendall(HEADER.pack(magic, version, type_, 4, 0, request_id) +
                                   struct.pack("<i", INVALID_PARAMS))
            else:
                master.sendall(head + body)
        master.close()

    def replies(self, master, client, lock):
        while (data := master.recv(65536)):
            with lock:
                client.sendall(data)
        client.close()

    def close(self):
        self.listener.close()


@pytest.fixture
def proxy_factory():
    made = []

    def make(master):
        made.append(OldMasterProxy(master))
        return made[-1]

    yield make
    for p in made:
        p.close()


def setup(address):
    s = MooncakeDistributedStore()
    return s, s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", address)


def test_a_noncoherent_client_refuses_a_master_without_leases(master_factory, proxy_factory, capfd):
    proxy = proxy_factory(master_factory(extra_flags=["--coherence=noncoherent"]))
    s, rc = setup(proxy.address)
    assert rc == ErrorCode.INVALID_VERSION, rc
    assert "predates the non-coherent discipline" in capfd.readouterr().err
    assert LEASES in proxy.types


def test_a_coherent_client_never_sends_leases(master_factory, proxy_factory):
    proxy = proxy_factory(master_factory(extra_flags=["--coherence=coherent"]))
    s, rc = setup(proxy.address)
    assert rc == 0, rc
    assert s.put("k", b"v" * 4096) == 0 and s.get("k") == b"v" * 4096
    s.close()
    assert LEASES not in proxy.types
