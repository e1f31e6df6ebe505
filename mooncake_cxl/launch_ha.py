"""Start etcd and elected masters (--enable_ha) from Python: used by the tests
and the `ha` benchmark section.

    with EtcdProcess(data_dir) as etcd:
        a = HaMasterProcess(etcd.endpoint, "/dev/shm/pool").start()   # elected
        b = HaMasterProcess(etcd.endpoint, "/dev/shm/pool").start()   # standby
        store.setup(..., etcd.client_address)
"""
import os
import select
import shutil
import socket
import subprocess
import tempfile
import time

from .launch import _READY, LoggedProcess, MasterError, MasterProcess


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdProcess(LoggedProcess):
    """One etcd member on 127.0.0.1 (free client and peer ports) over
    `data_dir`. start() again after kill() restarts it on the same ports and
    data."""

    def __init__(self, data_dir, log_path=None, start_timeout=30.0):
        self.data_dir = data_dir
        self.log_path = log_path or tempfile.mktemp(prefix="mcxl_etcd_", suffix=".log")
        self.start_timeout = start_timeout
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc = None

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_address(self):
        return f"etcd://{self.endpoint}"

    @staticmethod
    def available():
        return shutil.which("etcd") is not None

    def start(self):
        c, p = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        args = ["etcd", "--name=mcxl", f"--data-dir={self.data_dir}", f"--listen-client-urls={c}",
                f"--advertise-client-urls={c}", f"--listen-peer-urls={p}",
                f"--initial-advertise-peer-urls={p}", f"--initial-cluster=mcxl={p}"]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.5) as s:
                    s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                    if b'"health":"true"' in s.recv(4096):
                        return self
            except OSError:
                pass
            time.sleep(0.05)  # polling etcd's readiness: no event to wait on
        self.kill()
        raise MasterError(f"etcd did not start; log {self.log_path}: {self.log_tail()}")


class HaMasterProcess(MasterProcess):
    """A master with --enable_ha on etcd `endpoint`: start() returns once it
    campaigns; wait_ready() once it was elected and serves."""

    def __init__(self, endpoint, pool_path, pool_size=64 << 20, cluster_id="mooncake", ttl_s=2,
                 extra_flags=(), log_path=None, start_timeout=30.0):
        flags = ["--enable_ha=true", "--ha_backend_type=etcd", f"--ha_backend_connstring={endpoint}",
                 f"--cluster_id={cluster_id}", f"--ha_lease_ttl_sec={ttl_s}"] + list(extra_flags)
        super().__init__(pool_path, pool_size, format=False, extra_flags=flags, log_path=log_path,
                         start_timeout=start_timeout)
        self.elected = False

    def start(self):
        from ._master import binary_path
        from .launch import create_pool_file, pool_size_for
        self.pool_size = pool_size_for(self.pool_path, self.pool_size)
        if not os.path.exists(self.pool_path):
            create_pool_file(self.pool_path, self.pool_size, self.pool_group)
        args = [binary_path(), "--rpc_address=127.0.0.1", f"--rpc_port={free_port()}",
                "--metrics_host=127.0.0.1", f"--metrics_port={free_port()}",
                f"--cxl_path={self.pool_path}", f"--cxl_size={self.pool_size}"] + self.extra_flags
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log)
        if not self._read_until(self.start_timeout, standby_ok=True):
            self.kill()
            raise MasterError(f"master did not start (exit {self.proc.returncode}); "
                              f"log: {self.log_path}: {self.log_tail()}")
        return self

    def wait_ready(self, timeout=60.0):
        """True once this master was elected and serves (False: it exited or timed out)."""
        return self.elected or self._read_until(timeout, standby_ok=False)

    def _read_until(self, timeout, standby_ok):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.05)
            if ready:
                line = self.proc.stdout.readline().decode(errors="replace")
                m = _READY.search(line)
                if m:
                    self.port, self.uuid, self.metrics_port = int(m.group(2)), m.group(4), int(m.group(6))
                    self.elected = True
                    return True
                if standby_ok and "mooncake_cxl_master standby" in line:
                    return True  # campaigning: wait_ready() says when it leads
                if not line and self.proc.poll() is not None:
                    return False
            elif self.proc.poll() is not None:
                return False
        return False
