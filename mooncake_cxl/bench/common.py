"""What every benchmark section shares: sizes, the values written, one
client's setup, percentiles, the machine line, CPU placement, and a
throw-away pool file.

Depends on nothing else in mooncake_cxl.bench (the sections import it, never
the other way round).
"""
import contextlib
import glob
import os
import platform
import socket
import statistics
import subprocess
import tempfile
import time
import uuid

KIB, MIB = 1 << 10, 1 << 20


def value(size, i):
    """The i-th value of `size` bytes: its head names it, so a reader can check it."""
    head = f"{size}:{i}:".encode()
    return head + bytes([i % 251]) * (size - len(head))


def size_name(size):
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def percentiles(ns):
    """(median, p99) in µs of latencies in ns."""
    ns = sorted(ns)
    return statistics.median(ns) / 1e3, ns[min(len(ns) - 1, int(len(ns) * 0.99))] / 1e3


def connect(address):
    """One of our clients, set up as a user sets it up (protocol "cxl")."""
    from mooncake_cxl import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
    if rc != 0:
        raise RuntimeError(f"setup failed: {rc}")
    return s


def machine():
    """The machine line: lscpu's model name, cores, memory, kernel, Python."""
    model = None
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((line.split(":", 1)[1].strip() for line in out.splitlines()
                      if line.startswith("Model name:")), None)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        memory = f", {kib / (1 << 20):.1f} GiB memory"
    except (OSError, StopIteration, ValueError):
        memory = ""
    return (f"{model or 'unknown CPU'}, {os.cpu_count()} cores{memory}, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def default_pool_dir():
    """MC_CXL_BENCH_POOL_DIR (e.g. a hugetlbfs mount: 2 MiB pages for the
    pool), else /dev/shm (the pool's medium in these runs) when there is one."""
    env = os.environ.get("MC_CXL_BENCH_POOL_DIR")
    if env and os.path.isdir(env):
        return env
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far (/proc, 10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def set_process_affinity(pid, cpus):
    """Every thread of `pid` on `cpus` (sched_setaffinity(pid) alone moves its main thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass  # the thread exited meanwhile


def settle_placement(store, seconds=0.3):
    """Untimed pings for `seconds`: a new client usually runs on the core of the
    ring thread it wakes for its first ~60 ms (a ring ping: 4.2 µs there vs
    0.7 µs on two cores) until the kernel moves one of them; the timed calls
    after this are a long-lived client's."""
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        store.health_check()


@contextlib.contextmanager
def temp_pool(prefix, pool_dir=None):
    """A fresh pool path in `pool_dir`; the file (and the non-coherent
    simulator's files beside it) are removed afterwards."""
    pool_dir = pool_dir if pool_dir and os.path.isdir(pool_dir) else default_pool_dir()
    path = os.path.join(pool_dir, f"{prefix}_{uuid.uuid4().hex}")
    try:
        yield path
    finally:
        for f in [path] + glob.glob(glob.escape(path) + ".sim*"):
            if os.path.exists(f):
                os.unlink(f)


def set_environ(env):
    """Sets `env` in os.environ; returns what restore_environ needs to undo it."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return saved


def restore_environ(saved):
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def wait_or_kill(proc, timeout):
    """Wait up to timeout seconds for proc to exit; SIGKILL it (and reap) if it does not."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memcpy_baseline(size, working_set, dst_working_set=0, anonymous=False):
    """The memcpy baseline (mooncake_cxl._bench_core.MemcpyBench): copies of
    `size` bytes from a /dev/shm mapping (the pool's own medium), or from
    ordinary anonymous memory (what a user compares against)."""
    from mooncake_cxl import _bench_core
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and not anonymous else ""
    return _bench_core.MemcpyBench(size, working_set, dst_working_set, shm)
