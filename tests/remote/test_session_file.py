"""The serving process's session file (`<cxl_path>.te`, "session\\npid\\n"):
removed by a clean stop of the serving process, by the master's start or
stop once the process that wrote it is gone, and kept while it lives (it may
outlive masters). Tests that start a Transfer Engine run only inside a
private network namespace (see test_remote.py)."""
import os
import select
import signal
import subprocess
import sys

import pytest

import mooncake_cxl
import oracle
from conftest import WAIT_TIMEOUT
from mooncake_cxl.launch import MasterProcess, RemoteServedMaster

needs_te = pytest.mark.skipif(oracle.reference_skip_reason() is not None,
                              reason=str(oracle.reference_skip_reason()))


def _te_flags(session_file):
    return ["--pool_te_protocol=tcp", f"--pool_te_session_file={session_file}"]


def _dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _first_line(path):
    with open(path) as f:
        return f.read().split("\n")[0]


@needs_te
def test_clean_stop_of_the_serving_process_removes_its_file(pool_path, tmp_path):
    m = RemoteServedMaster(pool_path, str(tmp_path / "secret"), pool_size=64 << 20, format=True,
                           log_path=str(tmp_path / "master.log")).start()
    try:
        assert _first_line(m.session_file) == m.te.session
        m.te.stop()
        assert not os.path.exists(m.session_file)
    finally:
        m.stop()


@needs_te
def test_the_masters_stop_removes_a_killed_serving_processs_file(pool_path, tmp_path):
    m = RemoteServedMaster(pool_path, str(tmp_path / "secret"), pool_size=64 << 20, format=True,
                           log_path=str(tmp_path / "master.log")).start()
    try:
        m.te.kill()
        assert os.path.exists(m.session_file)  # what a crash leaves
    finally:
        MasterProcess.stop(m)
    assert not os.path.exists(m.session_file)
    assert "its Transfer Engine process" in m.log_tail(100000)


def test_a_dead_writers_file_is_dropped_at_start_and_a_live_ones_kept(pool_path, tmp_path):
    session_file = pool_path + ".te"
    for writer, kept in ((_dead_pid(), False), (os.getpid(), True)):
        with open(session_file, "w") as f:
            f.write(f"127.0.0.1:1\n{writer}\n")
        m = MasterProcess(pool_path, 64 << 20, format=True, extra_flags=_te_flags(session_file),
                          log_path=str(tmp_path / "master.log")).start()
        try:
            # The ready line comes after the check.
            assert os.path.exists(session_file) == kept
        finally:
            m.stop()
        assert os.path.exists(session_file) == kept  # a live writer's file survives the stop too


@needs_te
def test_the_console_master_leaves_no_session_file(pool_path, tmp_path):
    """mooncake_cxl_master --pool_te_protocol=tcp runs the serving process
    beside the C++ master; SIGTERM stops both and the file goes."""
    session_file = pool_path + ".te"
    MasterProcess(pool_path, 64 << 20, format=True, log_path=str(tmp_path / "fmt.log")).start().stop()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mooncake_cxl._master", "--rpc_address=127.0.0.1", "--rpc_port=0",
         "--metrics_host=127.0.0.1", "--metrics_port=0", "--enable_cxl=true", f"--cxl_path={pool_path}",
         f"--cxl_size={64 << 20}"] + _te_flags(session_file),
        stdout=subprocess.PIPE, stderr=open(tmp_path / "console.log", "ab"),
        cwd=os.path.dirname(os.path.dirname(mooncake_cxl.__file__)))  # the installed package
    try:
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], WAIT_TIMEOUT)
            assert ready, "no ready line from the serving process"
            line = proc.stdout.readline()
            assert line, f"mooncake_cxl_master exited ({proc.wait()})"
            if b"mooncake_cxl_pool_te ready" in line:
                break
        assert os.path.exists(session_file)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not os.path.exists(session_file)
