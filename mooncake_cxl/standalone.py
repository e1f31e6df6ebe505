"""The standalone client `mooncake_cxl_client` (Mooncake's `mooncake_client`,
as SGLang's and vLLM's "standalone" modes start it: one per host, engine
processes attached to it with setup_dummy, dummy.py).

Contract:
  * The standalone client is a normal client of the master (it set up with its
    flags, so a bad master address or an unreadable pool fails at start, exit
    1) and a configuration relay: it serves, on 127.0.0.1:--port only, the
    master's address, the protocol, the tenant, this host's name and this
    host's pool path hint (MC_CXL_DEV_PATH / MC_CXL_DEV_SIZE with
    protocol=cxl). Nothing it serves is a credential: the pool's access token
    stays in the pool, so a dummy that cannot map the pool cannot attach.
  * Wire protocol: standalone_wire.py. The server closes a connection that is
    idle for CONN_TIMEOUT_S or sends more than MAX_REQUEST bytes without a
    newline, and serves at most MAX_CONNECTIONS at once (more are closed at
    once).
"""
import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading

from .setup_args import PROTOCOLS, env_int, host_name, with_port
from .sizes import parse_size
from .standalone_wire import MAX_REQUEST, PROTOCOL_VERSION, encode
from .store import MooncakeDistributedStore

log = logging.getLogger("mooncake_cxl")

MAX_CONNECTIONS = 16
CONN_TIMEOUT_S = 2.0


# ------------------------------------------------------------------ the server

class StandaloneServer:
    """Serves `config` (a dict of JSON values) on 127.0.0.1:port."""

    def __init__(self, config, port, bind="127.0.0.1"):
        self.config = dict(config)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind, port))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._stop = threading.Event()
        self._refused = 0

    def serve_forever(self):
        self.sock.settimeout(0.5)  # so that stop() is noticed
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    break
                raise
            if not self._slots.acquire(blocking=False):
                self._refused += 1
                if self._refused in (1, 10, 100) or self._refused % 1000 == 0:
                    log.warning("mooncake_cxl_client: %d connections refused: %d already open",
                                self._refused, MAX_CONNECTIONS)
                conn.close()
                continue
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def stop(self):
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass

    def _serve_one(self, conn):
        try:
            conn.settimeout(CONN_TIMEOUT_S)
            data = b""
            while b"\n" not in data:
                chunk = conn.recv(MAX_REQUEST + 1 - len(data))
                if not chunk:
                    return  # closed before a whole request: nothing to answer
                data += chunk
                if len(data) > MAX_REQUEST and b"\n" not in data:
                    self._reply(conn, {"ok": False, "error": f"request longer than {MAX_REQUEST} bytes"})
                    return
            self._reply(conn, self.handle(data.split(b"\n", 1)[0]))
        except (socket.timeout, OSError):
            pass
        finally:
            conn.close()
            self._slots.release()

    def handle(self, line):
        try:
            req = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return {"ok": False, "error": "request is not a JSON object"}
        if not isinstance(req, dict):
            return {"ok": False, "error": "request is not a JSON object"}
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "v": PROTOCOL_VERSION}
        if op == "config":
            return {"ok": True, "v": PROTOCOL_VERSION, **self.config}
        return {"ok": False, "error": f"unknown op {str(op)[:64]!r} (known: config, ping)"}

    @staticmethod
    def _reply(conn, obj):
        conn.sendall(encode(obj))


# ------------------------------------------------------- mooncake_cxl_client

def _bool(text):
    t = str(text).strip().lower()
    if t in ("1", "true", "t", "yes", "y"):
        return True
    if t in ("0", "false", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"not a bool: {text!r}")


_BOOL_FLAGS = ("enable_offload", "start_offload_rpc_server")


def _gflags_argv(argv):
    """gflags spellings into argparse's: -flag -> --flag, --noflag -> --flag=false."""
    out = []
    for a in argv:
        if a.startswith("-") and not a.startswith("--") and len(a) > 2:
            a = "-" + a
        name = a[2:].split("=", 1)[0] if a.startswith("--") else ""
        if name.startswith("no") and name[2:] in _BOOL_FLAGS and "=" not in a:
            a = f"--{name[2:]}=false"
        out.append(a)
    return out


def parse_flags(argv):
    p = argparse.ArgumentParser(
        prog="mooncake_cxl_client", allow_abbrev=False,
        description="The standalone client of a mooncake_cxl pool (Mooncake's mooncake_client): "
                    "a client of the master that tells dummy clients (setup_dummy) of this host "
                    "how to attach. Serves on 127.0.0.1 only.")
    p.add_argument("--host", default="0.0.0.0",
                   help="this host's name for its clients (0.0.0.0: the machine's name)")
    p.add_argument("--port", type=int, default=50052,
                   help="service port on 127.0.0.1 (0: any free port)")
    p.add_argument("--master_server_address", default="127.0.0.1:50051")
    p.add_argument("--protocol", default="tcp", help="cxl, tcp or rdma: all map the pool")
    p.add_argument("--tenant_id", default="default")
    p.add_argument("--metadata_server", default="http://127.0.0.1:8080/metadata",
                   help="accepted; a CXL pool needs no metadata service")
    p.add_argument("--device_names", default="", help="accepted; no NICs are used")
    p.add_argument("--global_segment_size", default="4 GB",
                   help="accepted (validated); the pool is the master's segment")
    p.add_argument("--local_buffer_size", default="0", help="accepted (validated); values go "
                                                            "straight into the pool")
    p.add_argument("--threads", type=int, default=1, help="accepted; one thread serves")
    for name in _BOOL_FLAGS:
        p.add_argument(f"--{name}", type=_bool, nargs="?", const=True,
                       default=name == "start_offload_rpc_server",
                       help="accepted; there is no offload tier")
    args = p.parse_args(_gflags_argv(argv))
    for name in ("global_segment_size", "local_buffer_size"):
        if parse_size(getattr(args, name)) is None:
            p.error(f"--{name}={getattr(args, name)!r} is not a size (e.g. 4GB, 16 MB, 1048576)")
    if not 0 <= args.port < 65536:
        p.error(f"--port={args.port} is not a port")
    if args.protocol.lower() not in PROTOCOLS:
        p.error(f"--protocol={args.protocol!r}: use cxl, tcp or rdma")
    return args


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_flags(sys.argv[1:] if argv is None else argv)
    if args.enable_offload:
        log.warning("mooncake_cxl_client: --enable_offload ignored: there is no offload tier")
    store = MooncakeDistributedStore()
    host = host_name(args.host)
    rc = store.setup(with_port(host), args.metadata_server, parse_size(args.global_segment_size),
                     parse_size(args.local_buffer_size), args.protocol, args.device_names,
                     args.master_server_address, tenant_id=args.tenant_id)
    if rc != 0:
        print(f"mooncake_cxl_client: setup against the master at {args.master_server_address} "
              f"failed with {rc}", file=sys.stderr, flush=True)
        return 1
    cxl = args.protocol.lower() == "cxl"
    config = {
        "master_server_addr": args.master_server_address, "protocol": args.protocol,
        "host": args.host, "tenant_id": args.tenant_id,
        "pool_path": os.environ.get("MC_CXL_DEV_PATH", "") if cxl else "",
        "pool_size": env_int("MC_CXL_DEV_SIZE", 0) if cxl else 0,
    }
    try:
        server = StandaloneServer(config, args.port)
    except OSError as e:
        print(f"mooncake_cxl_client: cannot listen on 127.0.0.1:{args.port}: {e.strerror or e}",
              file=sys.stderr, flush=True)
        store.close()
        return 1

    def on_signal(signum, frame):
        server.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"mooncake_cxl_client ready port={server.port} master={args.master_server_address} "
          f"hostname={store.get_hostname()}", flush=True)
    try:
        server.serve_forever()
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
