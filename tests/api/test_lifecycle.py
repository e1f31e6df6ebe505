"""setup / close / health_check, and the bad-input cases around them: calls
before setup and after close, unreachable master, bad pool paths, foreign pools."""
import os
import shutil
import socket
import struct

import pytest

from mooncake_cxl import ErrorCode, MooncakeDistributedStore
from conftest import connect


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _all_calls(s):
    """Every data method with valid arguments, as (name, thunk)."""
    return [
        ("put", lambda: s.put("k", b"v")), ("upsert", lambda: s.upsert("k", b"v")),
        ("put_batch", lambda: s.put_batch(["k"], [b"v"])),
        ("upsert_batch", lambda: s.upsert_batch(["k"], [b"v"])),
        ("put_parts", lambda: s.put_parts("k", b"v")), ("upsert_parts", lambda: s.upsert_parts("k", b"v")),
        ("get", lambda: s.get("k")), ("get_batch", lambda: s.get_batch(["k"])),
        ("is_exist", lambda: s.is_exist("k")), ("batch_is_exist", lambda: s.batch_is_exist(["k"])),
        ("get_size", lambda: s.get_size("k")), ("remove", lambda: s.remove("k")),
        ("batch_remove", lambda: s.batch_remove(["k"])), ("remove_by_regex", lambda: s.remove_by_regex("k")),
        ("remove_all", lambda: s.remove_all()),
    ]


def _assert_refused(s):
    for name, call in _all_calls(s):
        r = call()
        if name in ("get",):
            assert r == b"", name
        elif name == "get_batch":
            assert r == [b""], name
        elif isinstance(r, list):
            assert r == [ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS], name
        else:
            assert r == ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS, name


def test_calls_before_setup_return_error_codes():
    s = MooncakeDistributedStore()
    _assert_refused(s)
    assert s.health_check() == 1
    assert s.close() == 0


def test_calls_after_close_return_error_codes(master):
    s = connect(master)
    assert s.put("k", b"v") == 0
    assert s.close() == 0
    assert s.close() == 0
    assert s.health_check() == 1
    _assert_refused(s)


def test_setup_after_close_and_setup_twice(master):
    s = connect(master)
    assert s.put("a", b"1") == 0
    assert s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", master.address) == 0
    assert s.get("a") == b"1"
    s.close()
    assert s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "tcp", "", master.address) == 0
    assert s.get("a") == b"1"
    s.close()


def test_setup_forms(master):
    s = MooncakeDistributedStore()
    assert s.setup(local_hostname="h:1", metadata_server="P2PHANDSHAKE", global_segment_size=1 << 20,
                   local_buffer_size=1 << 20, protocol="tcp", rdma_devices="",
                   master_server_addr=master.address) == 0
    assert s.get_hostname() == "h:1"
    s.close()
    for sizes in ((64 << 20, 16 << 20), ("64MB", "16MB"), ("64 MB", "16 mb"), ("67108864", "1GB")):
        cfg = {"local_hostname": "127.0.0.1:0", "metadata_server": "P2PHANDSHAKE",
               "global_segment_size": sizes[0], "local_buffer_size": sizes[1], "protocol": "cxl",
               "master_server_addr": master.address, "unknown_key_is_ignored": 1}
        assert s.setup(cfg) == 0, sizes
        assert s.put("d", b"v") == 0 and s.get("d") == b"v"
        s.close()


def test_setup_rejects_bad_arguments(master):
    s = MooncakeDistributedStore()
    base = {"local_hostname": "127.0.0.1:0", "metadata_server": "P2PHANDSHAKE",
            "master_server_addr": master.address}
    assert s.setup({**base, "global_segment_size": "50%"}) == ErrorCode.INVALID_PARAMS
    assert s.setup({**base, "local_buffer_size": "-5MB"}) == ErrorCode.INVALID_PARAMS
    assert s.setup({"metadata_server": "P2PHANDSHAKE", "master_server_addr": master.address}) == -600
    assert s.setup({"local_hostname": "h:1"}) == ErrorCode.INVALID_PARAMS
    assert s.setup("h:1", "P2PHANDSHAKE", 0, 0, "carrier-pigeon", "", master.address) == -600
    assert s.setup("h:1", "P2PHANDSHAKE", 0, 0, "cxl", "", "no-port") == ErrorCode.INVALID_PARAMS
    with pytest.raises(TypeError):
        s.setup("h:1", "P2PHANDSHAKE", 0, 0, "tcp")  # the first seven are required
    with pytest.raises(TypeError):
        s.setup("h:1", "P2PHANDSHAKE", "64MB", 0, "tcp", "", master.address)
    with pytest.raises(TypeError):
        s.setup("h:1", "P2PHANDSHAKE", -1, 0, "tcp", "", master.address)
    with pytest.raises(TypeError):
        s.setup("h:1", "P2PHANDSHAKE", 0, 0, "tcp", "", master.address, bogus=1)
    assert s.health_check() == 1
    assert s.setup(base["local_hostname"], "P2PHANDSHAKE", 0, 0, "cxl", "", master.address) == 0
    s.close()


def test_setup_without_master_fails_fast():
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", f"127.0.0.1:{_free_port()}")
    assert rc == ErrorCode.RPC_FAIL
    assert s.health_check() == 1
    assert s.put("k", b"v") == ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS


def _setup_with_env(master, monkeypatch, **env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = MooncakeDistributedStore()
    return s, s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", master.address)


def test_pool_path_missing(master, monkeypatch):
    s, rc = _setup_with_env(master, monkeypatch, MC_CXL_DEV_PATH="/dev/shm/does-not-exist-mcxl")
    assert rc == ErrorCode.INVALID_PARAMS
    assert s.health_check() == 1


def test_pool_too_small(master, monkeypatch, tmp_path):
    small = tmp_path / "small_pool"
    small.write_bytes(bytes(1 << 20))
    s, rc = _setup_with_env(master, monkeypatch, MC_CXL_DEV_PATH=str(small))
    assert rc == ErrorCode.INVALID_PARAMS
    s, rc = _setup_with_env(master, monkeypatch, MC_CXL_DEV_PATH=master.pool_path,
                            MC_CXL_DEV_SIZE=str(master.pool_size * 2))
    assert rc == ErrorCode.INVALID_PARAMS


def test_pool_with_another_uuid_or_layout(master, master_factory, monkeypatch, tmp_path):
    # A second, independently formatted pool: same layout, another UUID.
    other = master_factory(path=str(tmp_path / "other_pool"))
    s, rc = _setup_with_env(master, monkeypatch, MC_CXL_DEV_PATH=other.pool_path)
    assert rc == ErrorCode.INVALID_PARAMS
    # A copy of the right pool with the layout version changed.
    bad = tmp_path / "bad_layout"
    shutil.copyfile(master.pool_path, bad)
    with open(bad, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<I", 999))
    s, rc = _setup_with_env(master, monkeypatch, MC_CXL_DEV_PATH=str(bad))
    assert rc == ErrorCode.INVALID_PARAMS
    # Without the override the right pool is used, and the master kept serving.
    monkeypatch.delenv("MC_CXL_DEV_PATH")
    good = connect(master)
    assert good.put("fine", b"v") == 0
    good.close()


def test_master_refuses_a_pool_it_cannot_use(master_factory, tmp_path):
    from mooncake_cxl.launch import MasterError
    with pytest.raises(MasterError):
        master_factory(pool_size=1 << 20, path=str(tmp_path / "tiny"))
    garbage = tmp_path / "garbage"
    garbage.write_bytes(os.urandom(8 << 20))
    garbage.chmod(0o600)  # a pool others may read is not formatted (security/test_access.py)
    m = master_factory(pool_size=8 << 20, format=False, path=str(garbage))  # unformatted: formats it
    s = connect(m)
    assert s.put("k", b"v") == 0
    s.close()


def test_pool_size_is_rounded_to_the_file_systems_blocks(monkeypatch, tmp_path):
    # hugetlbfs sizes and maps files only in whole 2 MiB pages (its f_bsize).
    from mooncake_cxl import launch
    real = os.statvfs

    class Huge:
        f_bsize = 2 << 20

    assert launch.pool_size_for(str(tmp_path / "pool"), (64 << 20) + 1) == (64 << 20) + 1  # 4 KiB blocks
    monkeypatch.setattr(launch.os, "statvfs", lambda p: Huge() if p == str(tmp_path) else real(p))
    assert launch.pool_size_for(str(tmp_path / "pool"), (64 << 20) + 1) == 66 << 20
    assert launch.pool_size_for(str(tmp_path / "pool"), 64 << 20) == 64 << 20
