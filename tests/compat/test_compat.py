"""mooncake_cxl.compat: code written against `mooncake.store` runs on ours.

Each case runs in a fresh interpreter (the shim changes sys.meta_path and
sys.modules), from a temporary directory so that the installed package is
the one imported. They hold whether or not the real Mooncake wheel is
installed: where its presence matters, the real one is hidden by a finder
that refuses `mooncake`, or the case checks both outcomes.
"""
import subprocess
import sys
import textwrap

MOONCAKE_SCRIPT = textwrap.dedent("""\
    # Written for Mooncake: nothing here names mooncake_cxl.
    import sys
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1:12345", "P2PHANDSHAKE", 16 * 1024 * 1024, 16 * 1024 * 1024,
                     "tcp", "", sys.argv[1])
    print("setup", rc)
    config = ReplicateConfig()
    config.replica_num = 1
    print("put", store.put("compat-key", b"hello from mooncake code", config))
    print("get", store.get("compat-key").decode())
    print("exist", store.is_exist("compat-key"))
    print("argv", sys.argv[1:] == [sys.argv[1], "extra-arg"])
    print("impl", type(store).__module__)
    print("close", store.close())
    """)

EXPECTED = ["setup 0", "put 0", "get hello from mooncake code", "exist 1", "argv True",
            "impl mooncake_cxl.store", "close 0"]

BLOCK_REAL = textwrap.dedent("""\
    import importlib.abc, sys

    class BlockRealMooncake(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "mooncake" or name.startswith("mooncake."):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
            return None

    sys.meta_path.insert(0, BlockRealMooncake())
    """)


def _python(code_or_args, cwd, env=None, timeout=120):
    args = [sys.executable] + (["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args)
    import os
    e = dict(os.environ)
    e.pop("MOONCAKE_CXL_AS_MOONCAKE", None)
    e.pop("MOONCAKE_CXL_COMPAT", None)
    e.update(env or {})
    out = subprocess.run(args, cwd=str(cwd), capture_output=True, text=True, timeout=timeout, env=e)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split("\n")


def test_run_a_mooncake_script_on_ours(master, tmp_path):
    script = tmp_path / "engine.py"
    script.write_text(MOONCAKE_SCRIPT)
    lines = _python(["-m", "mooncake_cxl.compat", "run", str(script), master.address, "extra-arg"], tmp_path)
    assert [line for line in lines if line] == EXPECTED


def test_run_a_mooncake_module_on_ours(master, tmp_path):
    (tmp_path / "engine_mod.py").write_text(MOONCAKE_SCRIPT)
    lines = _python(["-m", "mooncake_cxl.compat", "run", "-m", "engine_mod", master.address, "extra-arg"],
                    tmp_path)
    assert [line for line in lines if line] == EXPECTED


def test_install_when_the_real_package_is_hidden(tmp_path):
    code = BLOCK_REAL + textwrap.dedent("""\
        try:
            import mooncake.store
            print("real visible")
        except ModuleNotFoundError:
            print("real hidden")
        from mooncake_cxl import compat
        print("install", compat.install())
        from mooncake.store import (MooncakeDistributedStore, ReplicateConfig, SoftPinAction,
                                    ReplicaStatus, BufferHandle, ObjectDataType)
        import mooncake, mooncake.store, mooncake_cxl
        print("same", all(getattr(mooncake.store, n) is getattr(mooncake_cxl, n) for n in (
            "MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ReplicaStatus",
            "BufferHandle", "ObjectDataType")))
        print("enum values", mooncake.store.KVCACHE == ObjectDataType.KVCACHE,
              mooncake.store.COMPLETE == ReplicaStatus.COMPLETE)
        print("store is usable", MooncakeDistributedStore().health_check())
        try:
            import mooncake.buffer_pool
            print("other submodule imported")
        except ModuleNotFoundError as e:
            print("other submodule refused")
        print("install again", compat.install())
        compat.uninstall()
        try:
            import mooncake.store
            print("after uninstall: visible")
        except ModuleNotFoundError:
            print("after uninstall: hidden")
        """)
    lines = [line for line in _python(code, tmp_path) if line]
    assert lines == ["real hidden", "install True", "same True", "enum values True True", "store is usable 1",
                     "other submodule refused", "install again True", "after uninstall: hidden"]


def test_install_takes_over_from_a_real_package(tmp_path):
    """An explicit install() asks for ours: it installs the shim even where the
    real wheel is installed (and forgets a real mooncake imported before)."""
    code = textwrap.dedent("""\
        from mooncake_cxl import compat
        real = compat.real_mooncake_available()
        print("real", real)
        if real:
            import mooncake.store
            print("real imported", not getattr(mooncake.store, "__mooncake_cxl_shim__", False))
        print("install", compat.install())
        import mooncake.store, mooncake_cxl
        print("ours", mooncake.store.MooncakeDistributedStore is mooncake_cxl.MooncakeDistributedStore)
        print("installed", compat.installed())
        """)
    lines = [line for line in _python(code, tmp_path) if line]
    if lines[0] == "real True":
        assert lines[1:] == ["real imported True", "install True", "ours True", "installed True"]
    else:
        assert lines == ["real False", "install True", "ours True", "installed True"]


def test_conditional_install_leaves_a_real_package_alone(tmp_path):
    """install(force=False): the real wheel, when importable, stays in charge."""
    code = textwrap.dedent("""\
        from mooncake_cxl import compat
        print("real", compat.real_mooncake_available())
        print("install", compat.install(force=False))
        import mooncake.store
        print("ours", getattr(mooncake.store, "__mooncake_cxl_shim__", False))
        print("explicit", compat.install())
        import mooncake.store
        import mooncake_cxl
        print("ours now", mooncake.store.MooncakeDistributedStore is mooncake_cxl.MooncakeDistributedStore)
        """)
    lines = [line for line in _python(code, tmp_path) if line]
    if lines[0] == "real True":  # the reference wheel is installed: it wins the conditional install
        assert lines[1:] == ["install False", "ours False", "explicit True", "ours now True"]
    else:
        assert lines == ["real False", "install True", "ours True", "explicit True", "ours now True"]


def test_environment_variable_makes_the_conditional_install_ours(tmp_path):
    code = textwrap.dedent("""\
        from mooncake_cxl import compat
        print("install", compat.install(force=False))
        import mooncake.store, mooncake_cxl
        print("ours", mooncake.store.MooncakeDistributedStore is mooncake_cxl.MooncakeDistributedStore)
        """)
    for var in ("MOONCAKE_CXL_AS_MOONCAKE", "MOONCAKE_CXL_COMPAT"):
        lines = [line for line in _python(code, tmp_path, env={var: "1"}) if line]
        assert lines == ["install True", "ours True"], var


def test_check_and_usage(tmp_path):
    lines = _python(["-m", "mooncake_cxl.compat", "check"], tmp_path, env={"MOONCAKE_CXL_AS_MOONCAKE": "1"})
    assert lines[0] == "mooncake.store -> mooncake_cxl (shim)"
    real = _python("from mooncake_cxl import compat; print(compat.real_mooncake_available())", tmp_path)[0]
    lines = _python(["-m", "mooncake_cxl.compat", "check"], tmp_path)
    if real == "True":  # check reports the conditional install: the wheel
        assert lines[0].startswith("mooncake.store -> ") and "shim" not in lines[0], lines
    else:
        assert lines[0] == "mooncake.store -> mooncake_cxl (shim)"
    out = subprocess.run([sys.executable, "-m", "mooncake_cxl.compat", "bogus"], cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage:" in out.stderr


# --------------------------------------------------------------------------
# The process-tree switch: `compat run` and MOONCAKE_CXL_COMPAT=1 reach every
# interpreter the program starts (vLLM's EngineCore and workers are spawned
# processes), through site-packages/mooncake_cxl_compat.pth.

WHICH = textwrap.dedent("""\
    def which():
        try:
            import mooncake.store as s
        except ModuleNotFoundError:
            return "missing"
        if getattr(s, "__mooncake_cxl_shim__", False):
            import mooncake_cxl
            return "ours" if s.MooncakeDistributedStore is mooncake_cxl.MooncakeDistributedStore else "broken"
        return "reference:" + s.__file__
    """)

TREE_SCRIPT = textwrap.dedent("""\
    import multiprocessing as mp
    import subprocess
    import sys

    WHICH = {which!r}
    exec(WHICH)

    def spawned(q):
        q.put(which())

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=spawned, args=(q,))
        p.start()
        from_spawn = q.get(timeout=100)
        p.join(60)
        sub = subprocess.run([sys.executable, "-c", WHICH + "print(which())"],
                             capture_output=True, text=True, timeout=100)
        print("main", which())
        print("spawn", from_spawn)
        print("subprocess", sub.stdout.strip() or "failed: " + sub.stderr[-500:])
    """).format(which=WHICH)


def _tree(tmp_path, args, env=None):
    script = tmp_path / "tree.py"
    script.write_text(TREE_SCRIPT)
    lines = _python([str(script) if a == "SCRIPT" else a for a in args], tmp_path, env=env)
    return dict(line.split(" ", 1) for line in lines if line)


def test_compat_run_reaches_spawned_and_subprocess_children(tmp_path):
    got = _tree(tmp_path, ["-m", "mooncake_cxl.compat", "run", "SCRIPT"])
    assert got == {"main": "ours", "spawn": "ours", "subprocess": "ours"}


def test_environment_switch_reaches_spawned_and_subprocess_children(tmp_path):
    got = _tree(tmp_path, ["SCRIPT"], env={"MOONCAKE_CXL_COMPAT": "1"})
    assert got == {"main": "ours", "spawn": "ours", "subprocess": "ours"}


def test_without_the_switch_nothing_changes(tmp_path):
    """Switch unset or 0: the reference wheel (installed system-wide on the
    test machine) stays in charge in the program and in its children."""
    real = _python("from mooncake_cxl import compat; print(compat.real_mooncake_available())", tmp_path)[0]
    for env in ({}, {"MOONCAKE_CXL_COMPAT": "0"}):
        got = _tree(tmp_path, ["SCRIPT"], env=env)
        assert len(set(got.values())) == 1, got
        if real == "True":
            assert got["main"].startswith("reference:") and "mooncake_cxl" not in got["main"], got
        else:
            assert got["main"] == "missing", got


def test_switch_is_lazy_and_the_pth_is_installed(tmp_path):
    """With the switch set, an interpreter that never imports mooncake never
    loads mooncake_cxl (the .pth hook only arms a finder); unset, not even that."""
    code = ("import sys; print('mooncake_cxl' in sys.modules, "
            "any(type(f).__name__ == '_LazyShim' for f in sys.meta_path))")
    assert _python(code, tmp_path, env={"MOONCAKE_CXL_COMPAT": "1"})[0] == "False True"
    assert _python(code, tmp_path)[0] == "False False"
    import os
    import site
    assert any(os.path.isfile(os.path.join(d, "mooncake_cxl_compat.pth")) for d in site.getsitepackages())
