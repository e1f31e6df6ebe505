"""The oracle: Mooncake's own store (the PyPI wheel
mooncake-transfer-engine-non-cuda==0.3.13.post1, `import mooncake.store`)
run beside ours, so that one conformance test can be checked against both.

Why a network namespace. The reference *client* opens two listeners on
0.0.0.0 (the transfer engine's P2P handshake port and its TcpTransport port)
whatever it is told; tests here may only listen on 127.0.0.1. So the reference
half runs only inside a private network namespace that the run made itself and
in which loopback is the only interface:

    unshare -n -- bash -c 'ip link set lo up && MCXL_ORACLE_NETNS=1 python -m pytest -q tests/compat/test_conformance.py'

`reference_skip_reason()` says why the reference cannot run here (wheel not
importable, not in such a namespace, master binary missing), or None. The
check is twofold: the wrapper's promise (MCXL_ORACLE_NETNS=1) and what the
kernel says (`socket.if_nameindex()` lists the interfaces of *this* process's
network namespace; /sys/class/net would show the host's, since `unshare -n`
does not remount sysfs).

Nothing here starts a reference client: the tests do, after checking.
"""
import importlib.machinery
import importlib.util
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time

from mooncake_cxl.launch import LoggedProcess

REFERENCE_PACKAGE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
NETNS_ENV = "MCXL_ORACLE_NETNS"
NETNS_COMMAND = ("unshare -n -- bash -c 'ip link set lo up && MCXL_ORACLE_NETNS=1 "
                 "python -m pytest -q tests/compat/test_conformance.py'")

MIB = 1 << 20
# The setup() arguments every reference client in this suite uses (as the brief
# and FINDINGS.md: a 64 MiB segment, a 16 MiB local buffer, TCP over loopback).
GLOBAL_SEGMENT_SIZE = 64 * MIB
LOCAL_BUFFER_SIZE = 16 * MIB


def free_port():
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- detection

def reference_package_dir():
    """The directory of the installed `mooncake` package, found without
    importing it (None when absent)."""
    try:
        spec = importlib.util.find_spec("mooncake")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        if importlib.machinery.PathFinder.find_spec("store", [loc]) is not None:
            return loc
    return None


def reference_master_binary():
    """The wheel's mooncake_master ELF (the console script in bin/ is a wrapper
    that execs it). None when absent."""
    d = reference_package_dir()
    if d is None:
        return None
    path = os.path.join(d, "mooncake_master")
    return path if os.access(path, os.X_OK) else None


_import_error = None


def reference_importable():
    """True if `import mooncake.store` works in this interpreter (it only loads
    the extension; no client, no socket)."""
    global _import_error
    if reference_package_dir() is None:
        _import_error = "the reference wheel is not installed (no `mooncake.store` on sys.path)"
        return False
    try:
        import mooncake.store  # noqa: F401
    except Exception as e:  # a missing libibverbs1 shows up here
        _import_error = f"`import mooncake.store` failed: {type(e).__name__}: {e}"
        return False
    return True


def loopback_only_netns():
    """(True, "") inside a network namespace whose only interface is `lo`."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError as e:
        return False, f"cannot list network interfaces: {e}"
    if names != ["lo"]:
        return False, f"this network namespace has interfaces {names}, not only lo"
    return True, ""


def reference_skip_reason():
    """None when the reference store may run here, else why not (a skip reason)."""
    if not reference_importable():
        return (f"reference Mooncake store unavailable: {_import_error}; "
                f"install it with `pip install {REFERENCE_PACKAGE}` (needs Debian's libibverbs1)")
    if os.environ.get(NETNS_ENV) != "1":
        return ("the reference client binds 0.0.0.0, so it runs only inside a private network "
                f"namespace: run `{NETNS_COMMAND}` ({NETNS_ENV}=1 is not set)")
    ok, why = loopback_only_netns()
    if not ok:
        return (f"{NETNS_ENV}=1 is set but {why}; the reference client binds 0.0.0.0 and may only "
                f"run in a loopback-only namespace: `{NETNS_COMMAND}`")
    if reference_master_binary() is None:
        return "the reference wheel has no mooncake_master binary next to mooncake/store.so"
    return None


# ---------------------------------------------------------------- the master

def die_with_parent():
    """preexec_fn: SIGTERM this child when the process that started it dies
    (a test process killed by a crash must not leave a master behind)."""
    import ctypes
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


class ReferenceMaster(LoggedProcess):
    """The wheel's mooncake_master on 127.0.0.1 with free RPC and metrics ports;
    every other flag at its default (lease 10 s, eviction 0.9 / 0.05, ...)."""

    def __init__(self, log_path=None, extra_flags=(), start_timeout=20.0):
        self.binary = reference_master_binary()
        if self.binary is None:
            raise RuntimeError("reference mooncake_master not found")
        self.log_path = log_path or tempfile.mktemp(prefix="mooncake_ref_master_", suffix=".log")
        self.extra_flags = list(extra_flags)
        self.start_timeout = start_timeout
        self.proc = None
        self.rpc_port = self.metrics_port = None

    @property
    def address(self):
        return f"127.0.0.1:{self.rpc_port}"

    def start(self):
        self.rpc_port, self.metrics_port = free_port(), free_port()
        args = [self.binary, "--rpc_address=127.0.0.1", f"--rpc_port={self.rpc_port}",
                "--metrics_host=127.0.0.1", f"--metrics_port={self.metrics_port}",
                "--logtostderr"] + self.extra_flags
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        deadline = time.monotonic() + self.start_timeout  # a hang guard, not a timing assertion
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.rpc_port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"reference mooncake_master did not start; log {self.log_path}: "
                           f"{self.log_tail()}")


# ---------------------------------------------------------------- the two implementations

class Impl:
    """One implementation under test: its module (for ReplicateConfig & co.),
    its master's address, and how to make a store against it."""

    def __init__(self, name, module, master_address):
        self.name = name
        self.mod = module
        self.master_address = master_address

    @property
    def ours(self):
        return self.name == "mooncake_cxl"

    @property
    def reference(self):
        return self.name == "mooncake"

    def new(self):
        return self.mod.MooncakeDistributedStore()

    def setup_args(self, hostname=None):
        """The seven positional setup() arguments, as an inference engine passes them."""
        return (hostname or f"127.0.0.1:{free_port()}", "P2PHANDSHAKE", GLOBAL_SEGMENT_SIZE,
                LOCAL_BUFFER_SIZE, "tcp", "", self.master_address)

    def setup_dict(self, **overrides):
        cfg = {"local_hostname": f"127.0.0.1:{free_port()}", "metadata_server": "P2PHANDSHAKE",
               "global_segment_size": GLOBAL_SEGMENT_SIZE, "local_buffer_size": LOCAL_BUFFER_SIZE,
               "protocol": "tcp", "rdma_devices": "", "master_server_addr": self.master_address}
        cfg.update(overrides)
        return cfg

    def connect(self, hostname=None):
        s = self.new()
        rc = s.setup(*self.setup_args(hostname))
        if rc != 0:
            raise RuntimeError(f"{self.name}: setup failed with {rc}")
        return s

    def __repr__(self):
        return f"Impl({self.name})"


def reference_module():
    import mooncake.store
    return mooncake.store


def ours_module():
    import mooncake_cxl
    return mooncake_cxl


# ---------------------------------------------------------------- crashes in a child

def _no_core_dumps():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_child(code, *args, timeout=60, env=None):
    """Runs `code` (with `args` as sys.argv[1:]) in a fresh interpreter, core
    dumps off; returns the CompletedProcess. For calls that crash the
    reference (SIGSEGV), and for clients that must never be closed."""
    e = dict(os.environ)
    e.update(env or {})
    here = os.path.dirname(os.path.abspath(__file__))
    e["PYTHONPATH"] = here + os.pathsep + e.get("PYTHONPATH", "") if e.get("PYTHONPATH") else here
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, preexec_fn=_no_core_dumps, cwd=tempfile.gettempdir())
