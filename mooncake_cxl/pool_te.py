"""The process that serves a pool's mapping over Mooncake's Transfer Engine to
hosts outside the pod: `python -m mooncake_cxl.pool_te --pool PATH
--session_file FILE [--protocol tcp|rdma] [--host ADDR]`. It maps the pool
MAP_SHARED, registers the mapping with its own engine (the engine's Python
API is the only one its wheel ships, hence a Python process beside the C++
master; `mooncake_cxl_master --pool_te_protocol=...` starts it), writes its
session name and its pid to FILE (mode 0600, replaced atomically) for the
master to advertise, serves until SIGTERM and then removes FILE (a killed
one's FILE is removed by the next master to start or stop, which sees the
pid gone). It runs no store logic: remote clients
locate through the master and validate every copy against the index entry.
The engine binds 0.0.0.0 on a random port and checks nothing but bounds: any
peer that reaches that port can read and write the whole pool."""
import argparse
import ctypes
import mmap
import os
import signal
import sys
import threading


def serve(pool, session_file, protocol="tcp", host="127.0.0.1", ready=print):
    from .extras import require
    require("serving the pool over the Transfer Engine", "remote")
    from .remote.engine import transfer_engine_class

    fd = os.open(pool, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    te = transfer_engine_class()()
    if te.initialize(host, "P2PHANDSHAKE", protocol, "") != 0:
        raise SystemExit(f"pool_te: the Transfer Engine did not start ({protocol} on {host})")
    if te.register_memory(base, size) != 0:
        raise SystemExit(f"pool_te: registering {size} bytes of {pool} failed")
    session = f"{host}:{te.get_rpc_port()}"
    tmp = f"{session_file}.{os.getpid()}.tmp"
    wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(wfd, 0o600)
    os.write(wfd, f"{session}\n{os.getpid()}\n".encode())
    os.close(wfd)
    os.replace(tmp, session_file)
    ready(f"mooncake_cxl_pool_te ready session={session} pool={pool} size={size}", flush=True)
    return te, m


def remove_session_file(session_file):
    """Removes FILE if it still names this process (a successor's stays)."""
    try:
        with open(session_file) as f:
            lines = f.read().split("\n")
        if len(lines) > 1 and lines[1] == str(os.getpid()):
            os.unlink(session_file)
    except OSError:
        pass


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mooncake_cxl.pool_te", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", required=True, help="the pool file or device (as this host names it)")
    ap.add_argument("--session_file", required=True, help="where the session name is written")
    ap.add_argument("--protocol", default="tcp", choices=("tcp", "rdma"))
    ap.add_argument("--host", default=os.environ.get("MC_CXL_TE_HOST", "127.0.0.1"),
                    help="the address remote hosts reach this host at (the session's host part)")
    a = ap.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    te, m = serve(a.pool, a.session_file, a.protocol, a.host)
    while not stop.wait(1.0):
        pass
    remove_session_file(a.session_file)
    sys.stdout.flush()
    os._exit(0)  # the engine's threads do not join cleanly


if __name__ == "__main__":
    main()
