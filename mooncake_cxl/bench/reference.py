"""Mooncake's own store beside ours, for the sections that measure both
(compare, tiering's reference rows, pd): the reference wheel's
mooncake_master, and the private loopback-only network namespace its client
needs (it listens on 0.0.0.0 whatever it is told).

A section that needs the namespace either runs there already
(loopback_only()) or re-runs its command there (rerun_in_netns: `unshare -n`,
which needs root or user namespaces, and util-linux's unshare), then brings
`lo` up (bring_loopback_up: a fresh namespace has it down).
"""
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from . import common

PACKAGE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"  # the `oracle` extra


# ---------------------------------------------------------------- network namespace

def loopback_only():
    """True in a network namespace whose only interface is lo."""
    try:
        return [name for _, name in socket.if_nameindex()] == ["lo"]
    except OSError:
        return False


def bring_loopback_up():
    """`ip link set lo up`, without needing iproute2."""
    import fcntl
    import struct
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s.fileno(), siocgifflags, req)[:18])[1]
        if not flags & iff_up:
            fcntl.ioctl(s.fileno(), siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def netns_unavailable():
    """None when `unshare -n` works here, else why not."""
    if shutil.which("unshare") is None:
        return "`unshare` (util-linux) is not installed"
    r = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`unshare -n` is not permitted here (needs root or user namespaces): {r.stderr.strip()}"
    return None


def rerun_in_netns(argv, marker_env):
    """Runs `python -m mooncake_cxl.bench <argv>` again under `unshare -n`, with
    marker_env=1 in its environment (so that it does not try again); its exit
    status. Ctrl-C is passed on to it."""
    env = dict(os.environ, **{marker_env: "1"})
    cmd = [shutil.which("unshare") or "unshare", "-n", "--", sys.executable, "-m", "mooncake_cxl.bench",
           *argv]
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        return proc.wait()


def netns_skip_reason(binds_all):
    """None when a process that binds all addresses can run here (in a
    loopback-only namespace already, or under `unshare -n`), else why not.
    binds_all names what binds them, for the message."""
    why = reference_unavailable()
    if why or loopback_only():
        return why
    why = netns_unavailable()
    return f"{binds_all} binds 0.0.0.0, so it runs only in a private network namespace, and {why}" \
        if why else None


def run_child_in_netns(module, args, mark, what, timeout):
    """Runs `python -m <module> --child <json args>` (under `unshare -n` unless
    this is a loopback-only namespace already) and returns the JSON its stdout
    prints after `mark`, or {"skipped": why} naming its log on failure. Its
    stderr goes to a log file, removed when it succeeds."""
    cmd = [sys.executable, "-m", module, "--child", json.dumps(args)]
    if not loopback_only():
        cmd = ["unshare", "-n", "--"] + cmd
    log = tempfile.NamedTemporaryFile(prefix=module.rsplit(".", 1)[-1] + "_", suffix=".log", delete=False)
    print(f"{what}: running under `unshare -n` (log: {log.name})", flush=True)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=timeout)
    finally:
        log.close()
    for line in proc.stdout.splitlines():
        if line.startswith(mark):
            os.unlink(log.name)
            return json.loads(line[len(mark):])
    tail = open(log.name, errors="replace").read()[-1500:]
    why = f"the child failed (exit {proc.returncode}); log {log.name}: ...{tail}"
    print(f"{what}: {why}", flush=True)
    return {"skipped": why}


# ---------------------------------------------------------------- the reference master

def reference_unavailable():
    """None when the reference wheel (store and master) is installed, else why not."""
    try:
        if importlib.util.find_spec("mooncake") is None:
            return f"the reference wheel is not installed (`pip install {PACKAGE}`)"
    except (ImportError, ValueError) as e:
        return f"the reference wheel cannot be found: {e}"
    if reference_master_binary() is None:
        return "the reference wheel has no mooncake_master binary"
    return None


def reference_master_binary():
    try:
        spec = importlib.util.find_spec("mooncake")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(loc, "mooncake_master")
        if os.access(path, os.X_OK):
            return path
    return None


def die_with_parent():
    """preexec_fn: SIGTERM the child if this process dies first."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


class ReferenceMaster:
    """Mooncake's mooncake_master on 127.0.0.1 (free RPC and metrics ports),
    with extra `flags`; start()/stop() or a context manager."""

    def __init__(self, log_path, flags=()):
        self.log_path = log_path
        self.flags = list(flags)
        self.proc = None
        self.port = None
        self._log = None

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        binary = reference_master_binary()
        if binary is None:
            raise RuntimeError("the reference wheel's mooncake_master was not found")
        self.port = common.free_port()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [binary, "--rpc_address=127.0.0.1", f"--rpc_port={self.port}", "--metrics_host=127.0.0.1",
             f"--metrics_port={common.free_port()}", "--logtostderr", *self.flags],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"mooncake_master did not start; see {self.log_path}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            common.wait_or_kill(self.proc, 10)
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
