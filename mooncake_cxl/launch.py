"""Start and stop a mooncake_cxl master from Python: used by the demo, the
benchmark and the tests, so that all three start it the same way.

    with MasterProcess(pool_path="/dev/shm/pool", pool_size=256 << 20) as m:
        store.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", m.address)
"""
import grp
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

from ._master import binary_path

_READY = re.compile(r"mooncake_cxl_master ready rpc=([\d.]+):(\d+) pool=(\S+) uuid=(\S+) metrics=([\d.]+):(\d+)")


class MasterError(RuntimeError):
    pass


class LoggedProcess:
    """A child process whose stdout/stderr go to `log_path`: log_tail, a clean
    stop (SIGTERM, then SIGKILL after `timeout`), a kill. Subclasses start it."""

    proc = None
    log_path = None
    _log = None

    def log_tail(self, n=2000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout=10.0):
        """SIGTERM and wait: a clean shutdown."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close()

    def kill(self):
        """SIGKILL: a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self):
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.stop()


def pool_size_for(path, size):
    """`size` rounded up to whole blocks of the file system that will hold `path`
    when its blocks are larger than 4 KiB (hugetlbfs: a file is sized and mapped
    only in whole 2 MiB pages)."""
    block = os.statvfs(os.path.dirname(os.path.abspath(path))).f_bsize
    return -(-size // block) * block if block > 4096 else size


def create_pool_file(path, size, group=None):
    """Creates a sparse pool file of `size` bytes that only its owner may read
    (0600), or its owner and `group` (0660, owned by that group): every value
    in a pool is readable by whoever can read the file. False when it exists."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    try:
        if group:
            os.fchown(fd, -1, grp.getgrnam(group).gr_gid)
            os.fchmod(fd, 0o660)
        else:
            os.fchmod(fd, 0o600)  # exact, whatever the umask
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return True


class MasterProcess(LoggedProcess):
    """A master on 127.0.0.1 with a free port. The pool file is created (sparse,
    mode 0600, or 0660 for `pool_group`) when missing; `format=True` erases an
    existing one."""

    def __init__(self, pool_path, pool_size=256 << 20, format=False, extra_flags=(),
                 log_path=None, start_timeout=20.0, pool_group=None):
        self.pool_path = pool_path
        self.pool_group = pool_group
        self.pool_size = pool_size
        self.format = format
        self.extra_flags = list(extra_flags)
        self.log_path = log_path or tempfile.mktemp(prefix="mcxl_master_", suffix=".log")
        self.start_timeout = start_timeout
        self.proc = None
        self.port = None
        self.metrics_port = None
        self.uuid = None

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self):
        return f"http://127.0.0.1:{self.metrics_port}"

    def start(self):
        self.pool_size = pool_size_for(self.pool_path, self.pool_size)
        if not os.path.exists(self.pool_path):
            create_pool_file(self.pool_path, self.pool_size, self.pool_group)
        args = [binary_path(), "--rpc_address=127.0.0.1", "--rpc_port=0",
                "--metrics_host=127.0.0.1", "--metrics_port=0",
                "--enable_cxl=true", f"--cxl_path={self.pool_path}",
                f"--cxl_size={self.pool_size}"]
        if self.pool_group:
            args.append(f"--pool_group={self.pool_group}")
        if self.format:
            args.append("--format=true")
        args += self.extra_flags
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log)
        deadline = time.monotonic() + self.start_timeout
        line = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                m = _READY.search(line.decode(errors="replace"))
                if m:
                    self.port, self.uuid = int(m.group(2)), m.group(4)
                    self.metrics_port = int(m.group(6))
                    return self
            if self.proc.poll() is not None:
                break
        self.kill()
        raise MasterError(f"master did not start (exit {self.proc.returncode}); "
                          f"log: {self.log_path}: {self.log_tail()}")


_CLIENT_READY = re.compile(r"mooncake_cxl_client ready port=(\d+)")


class StandaloneClientProcess(LoggedProcess):
    """A standalone client (`mooncake_cxl_client`, the dummy clients' helper)
    on 127.0.0.1 with a free port, attached to the master at `master_address`."""

    def __init__(self, master_address, extra_flags=(), log_path=None, start_timeout=30.0,
                 env=None):
        self.master_address = master_address
        self.extra_flags = list(extra_flags)
        self.log_path = log_path or tempfile.mktemp(prefix="mcxl_client_", suffix=".log")
        self.start_timeout = start_timeout
        self.env = env
        self.proc = None
        self.port = None

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        args = [sys.executable, "-c", "import sys; from mooncake_cxl.standalone import main; "
                "sys.exit(main())", "--port=0",
                f"--master_server_address={self.master_address}"] + self.extra_flags
        self._log = open(self.log_path, "ab")
        # cwd: where this package is installed, so that the child imports it, not a source tree
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, env=self.env,
                                     cwd=here)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                m = _CLIENT_READY.search(self.proc.stdout.readline().decode(errors="replace"))
                if m:
                    self.port = int(m.group(1))
                    return self
            if self.proc.poll() is not None:
                break
        self.kill()
        raise MasterError(f"mooncake_cxl_client did not start (exit {self.proc.returncode}); "
                          f"log: {self.log_path}: {self.log_tail()}")


_TE_READY = re.compile(r"mooncake_cxl_pool_te ready session=(\S+)")


class PoolTEProcess(LoggedProcess):
    """The process serving a pool over the Transfer Engine (mooncake_cxl.pool_te),
    as mooncake_cxl_master --pool_te_protocol starts it; must run inside a
    private network namespace in tests (the engine binds 0.0.0.0)."""

    def __init__(self, pool_path, session_file, protocol="tcp", log_path=None, start_timeout=30.0):
        self.pool_path = pool_path
        self.session_file = session_file
        self.protocol = protocol
        self.log_path = log_path or tempfile.mktemp(prefix="mcxl_pool_te_", suffix=".log")
        self.start_timeout = start_timeout
        self.proc = None
        self.session = None

    def start(self):
        args = [sys.executable, "-m", "mooncake_cxl.pool_te", f"--pool={self.pool_path}",
                f"--session_file={self.session_file}", f"--protocol={self.protocol}"]
        self._log = open(self.log_path, "ab")
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, cwd=here)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                m = _TE_READY.search(self.proc.stdout.readline().decode(errors="replace"))
                if m:
                    self.session = m.group(1)
                    return self
            if self.proc.poll() is not None:
                break
        self.kill()
        raise MasterError(f"pool_te did not start (exit {self.proc.returncode}); "
                          f"log: {self.log_path}: {self.log_tail()}")


class RemoteServedMaster(MasterProcess):
    """A MasterProcess whose pool is also served over the Transfer Engine, with
    a secret for remote clients in `auth_token_file` (created by the master)."""

    def __init__(self, pool_path, auth_token_file, protocol="tcp", **kw):
        self.session_file = pool_path + ".te"
        self.auth_token_file = auth_token_file
        flags = list(kw.pop("extra_flags", ())) + [
            f"--pool_te_protocol={protocol}", f"--pool_te_session_file={self.session_file}",
            f"--auth_token_file={auth_token_file}"]
        super().__init__(pool_path, extra_flags=flags, **kw)
        self.te = PoolTEProcess(pool_path, self.session_file, protocol)

    def start(self):
        super().start()
        try:
            self.te.start()
        except MasterError:
            super().kill()
            raise
        return self

    def stop(self, timeout=10.0):
        self.te.stop(timeout)
        super().stop(timeout)

    def kill(self):
        self.te.kill()
        super().kill()
