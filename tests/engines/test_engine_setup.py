"""What SGLang's and LMCache's Mooncake backends need from the module besides
the byte calls, in this interpreter: setup(config) with the keys they send,
a failed setup logged at ERROR with the address, an SSD path that is not the
tier ignored, MooncakeHostMemAllocator with setup_dummy, and the wheel's
pure-Python service modules on the shim."""
import ctypes
import os
import logging

import pytest

from oracle import free_port
from mooncake_cxl import MooncakeDistributedStore, MooncakeHostMemAllocator, bind_to_numa_node
from mooncake_cxl.errors import ErrorCode


def lmcache_style(master_address, **extra):
    # What LMCache's _build_setup_dict sends: string values, legacy key names.
    d = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
         "global_segment_size": "3355443200", "local_buffer_size": "1073741824", "protocol": "tcp",
         "device_name": "", "master_server_address": master_address}
    d.update(extra)
    return d


def test_setup_dict_takes_lmcache_keys(master, caplog):
    s = MooncakeDistributedStore()
    with caplog.at_level(logging.WARNING, logger="mooncake_cxl"):
        assert s.setup(lmcache_style(master.address, enable_ssd_offload="False")) == 0
    assert "unknown key" not in caplog.text
    assert s.put("k", b"v") == 0 and s.get("k") == b"v"
    s.close()


def test_setup_dict_names_an_unknown_key_and_the_one_expected(master, caplog):
    s = MooncakeDistributedStore()
    with caplog.at_level(logging.WARNING, logger="mooncake_cxl"):
        assert s.setup(lmcache_style(master.address, master_server_adress="x")) == 0
    assert "unknown key 'master_server_adress' ignored (did you mean 'master_server_address'?)" in caplog.text
    s.close()


def test_failed_setup_is_an_error_line_with_the_address(caplog, monkeypatch):
    monkeypatch.setenv("MC_CXL_CONNECT_TIMEOUT_MS", "300")
    addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    s = MooncakeDistributedStore()
    with caplog.at_level(logging.ERROR, logger="mooncake_cxl"):
        rc = s.setup(lmcache_style(addr))
    assert rc < 0
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and addr in r.getMessage()]
    assert errors and "could not attach to the master" in errors[0].getMessage()
    assert s.health_check() == 1  # not set up, still usable: a later setup may succeed


def test_ssd_offload_path_without_tier_files_is_ignored(master, tmp_path, caplog):
    rank_dir = tmp_path / "rank_0_0_0_0"  # SGLang's per-rank subdirectory
    rank_dir.mkdir()
    s = MooncakeDistributedStore()
    with caplog.at_level(logging.WARNING, logger="mooncake_cxl"):
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master.address, None,
                       enable_ssd_offload=True, ssd_offload_path=str(rank_dir)) == 0
    assert "holds no SSD tier files; ignored" in caplog.text
    s.close()


def test_host_mem_allocator_alloc_register_free(master):
    a = MooncakeHostMemAllocator()
    ptr = a.alloc(1 << 20)
    assert ptr != 0
    view = (ctypes.c_ubyte * (1 << 20)).from_address(ptr)
    assert bytes(view[:16]) == bytes(16)  # zero-filled
    view[:5] = list(b"hello")
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master.address) == 0
    assert s.register_buffer(ptr, 1 << 20) == 0
    assert s.put_from("hm", ptr, 5) == 0 and s.get("hm") == b"hello"
    assert s.unregister_buffer(ptr) == 0
    s.close()
    del view
    assert a.free(ptr) == 0
    assert a.free(ptr) == int(ErrorCode.INVALID_PARAMS)  # not (any longer) ours
    assert a.alloc(0) == 0


def test_bind_to_numa_node_unknown_node_changes_nothing():
    import os
    before = os.sched_getaffinity(0)
    bind_to_numa_node(4095)
    assert os.sched_getaffinity(0) == before
    bind_to_numa_node(0)  # node 0 exists on Linux; our CPUs stay within what we had
    assert os.sched_getaffinity(0) <= before
    os.sched_setaffinity(0, before)


def test_shim_serves_the_wheels_service_modules():
    from oracle import reference_package_dir
    if reference_package_dir() is None:
        pytest.skip("the reference Mooncake wheel (whose files these are) is not installed")
    pytest.importorskip("aiohttp")
    import subprocess
    import sys
    code = ("from mooncake_cxl import compat; compat.install()\n"
            "import mooncake.store, mooncake.mooncake_config, mooncake.mooncake_store_service as svc\n"
            "assert mooncake.store.__mooncake_cxl_shim__\n"
            "assert svc.MooncakeDistributedStore is mooncake.store.MooncakeDistributedStore\n"
            "from mooncake.store import MooncakeHostMemAllocator, bind_to_numa_node\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr


def test_wheels_rest_server_runs_unmodified_on_ours(master, tmp_path):
    """mc_store_rest_server (the wheel's mooncake_store_service) under the compat
    switch: a put over its REST API is in our store; /api/mount_shm is refused."""
    import json
    import subprocess
    import sys
    import urllib.error
    import urllib.request
    from conftest import wait_until
    from oracle import loopback_only_netns, reference_package_dir
    if reference_package_dir() is None:
        pytest.skip("the reference Mooncake wheel (whose files these are) is not installed")
    pytest.importorskip("aiohttp")
    ok, why = loopback_only_netns()
    if not ok:
        pytest.skip(f"the wheel's REST server binds 0.0.0.0; it runs only in a loopback-only "
                    f"network namespace (unshare -n): {why}")
    port = free_port()
    env = dict(os.environ, MOONCAKE_MASTER=master.address, MOONCAKE_PROTOCOL="tcp",
               MOONCAKE_TE_META_DATA_SERVER="P2PHANDSHAKE", MOONCAKE_DEVICE="",
               MOONCAKE_LOCAL_HOSTNAME="127.0.0.1")
    log = open(tmp_path / "rest.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_cxl.compat", "run", "-m",
                             "mooncake.mooncake_store_service", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/")

    def call(method, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return None, b""

    try:
        wait_until(lambda: call("PUT", "/api/put", {"key": "rest-k", "value": "hello"})[0] == 200,
                   lambda: "the REST server's put: " + open(tmp_path / "rest.log").read()[-2000:])
        assert call("GET", "/api/get/rest-k") == (200, b"hello")
        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master.address) == 0
        assert s.get("rest-k") == b"hello"  # in our pool, visible to any client
        s.close()
        status, body = call("POST", "/api/mount_shm", {"name": "seg", "size": 4096})
        assert status == 500, body  # mount_segment: NOT_SUPPORTED, the pool is the one segment
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
