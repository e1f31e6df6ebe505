"""Console entry point `mooncake_cxl_master`: runs the C++ master shipped in the package.

With --pool_te_protocol=tcp|rdma it also runs the process that serves the
pool's mapping over the Transfer Engine (mooncake_cxl.pool_te) beside the
master, once the master is ready, and restarts it if it dies; the master
advertises the session that process writes. Without it, the binary is exec'd."""
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path


def binary_path() -> str:
    return str(Path(__file__).resolve().parent / "bin" / "mooncake_cxl_master")


def _flag(args, name, default=""):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return default


def pool_te_command(args):
    """The serving process's command for the master's flags, or None when off."""
    proto = _flag(args, "pool_te_protocol")
    if not proto:
        return None
    pool = _flag(args, "cxl_path", os.environ.get("MC_CXL_DEV_PATH", "/dev/dax0.0"))
    session = _flag(args, "pool_te_session_file") or pool + ".te"
    return [sys.executable, "-m", "mooncake_cxl.pool_te", f"--pool={pool}", f"--session_file={session}",
            f"--protocol={proto}"]


def _supervise(path, args, te_cmd):
    master = subprocess.Popen([path] + args, stdout=subprocess.PIPE)
    stop = threading.Event()
    te = [None]

    def forward(sig, _):
        stop.set()
        for p in (master, te[0]):
            if p is not None and p.poll() is None:
                p.send_signal(sig)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    def serve_te():
        while not stop.is_set() and master.poll() is None:
            te[0] = subprocess.Popen(te_cmd)
            te[0].wait()
            if not stop.is_set() and master.poll() is None:
                print("mooncake_cxl_master: the Transfer Engine process exited; restarting it",
                      file=sys.stderr, flush=True)
                stop.wait(1.0)
    started = False
    for line in master.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        if not started and b"mooncake_cxl_master ready" in line:
            started = True
            threading.Thread(target=serve_te, daemon=True).start()
    rc = master.wait()
    stop.set()
    if te[0] is not None and te[0].poll() is None:
        te[0].terminate()
        try:
            te[0].wait(5)
        except subprocess.TimeoutExpired:
            te[0].kill()
    sys.exit(rc)


def main() -> None:
    path = binary_path()
    if not os.access(path, os.X_OK):
        sys.exit(f"mooncake_cxl_master binary not found at {path}; reinstall the package")
    args = sys.argv[1:]
    te_cmd = pool_te_command(args)
    if te_cmd is None:
        os.execv(path, [path] + args)
    _supervise(path, args, te_cmd)


if __name__ == "__main__":
    main()
