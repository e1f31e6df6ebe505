"""Run code written against Mooncake's import path on mooncake_cxl.

    from mooncake_cxl import compat
    compat.install()                  # even where the real Mooncake wheel is installed
    from mooncake.store import MooncakeDistributedStore   # -> mooncake_cxl's

    python -m mooncake_cxl.compat run script.py [args...]  # always ours,
    python -m mooncake_cxl.compat run -m package.module [args...]  # children too
    MOONCAKE_CXL_COMPAT=1 any-python-program ...           # the same switch

install() puts a finder first on sys.meta_path that answers for `mooncake`
(an empty package) and `mooncake.store` (mooncake_cxl's classes under
Mooncake's names). Where the real Mooncake wheel is installed, a few of its
pure-Python modules that are only clients of `mooncake.store`
(_WHEEL_CLIENT_MODULES: structured_object_store, which Mooncake's own
test_put_get_tensor.py imports, dataproto_catalog, async_store, mooncake_config
and mooncake_store_service, its REST server) load from the wheel's files and so
run on ours. Every other `mooncake.*` import (the
transfer engine, native helpers) fails with ModuleNotFoundError rather than
mixing the two implementations; this package's own users of the engine (a
remote client, the pool's server) load it beside the shim
(mooncake_cxl.remote.engine). An explicit install() is the caller asking
for ours, so it installs the shim whether or not the real wheel is there (and
forgets a real `mooncake` imported before); install(force=False) is the
conditional form: it leaves a real wheel in charge unless the environment has
MOONCAKE_CXL_AS_MOONCAKE=1 or MOONCAKE_CXL_COMPAT=1.

The process-tree switch is MOONCAKE_CXL_COMPAT=1: the package installs
site-packages/mooncake_cxl_compat.pth, whose one line checks that variable at
every interpreter start and, when set, arms a lazy finder
(_mooncake_cxl_compat_hook) that installs this shim, forced, at the first
`mooncake` import. So the program and every child interpreter it starts
(multiprocessing spawn, subprocess python, vLLM's EngineCore and workers) see
ours. `run` sets MOONCAKE_CXL_COMPAT=1 for its children. Without the variable
the .pth does nothing and a process opts in by calling install().
"""
import importlib.abc
import importlib.machinery
import os
import sys

ENV_VAR = "MOONCAKE_CXL_AS_MOONCAKE"
SWITCH_VAR = "MOONCAKE_CXL_COMPAT"  # read by mooncake_cxl_compat.pth at interpreter start
_NAMES = ("mooncake", "mooncake.store")
# The wheel's pure-Python clients of mooncake.store (no native code, no other
# mooncake module at import): served from the installed wheel's own files.
_WHEEL_CLIENT_MODULES = ("mooncake.structured_object_store", "mooncake.dataproto_catalog",
                         "mooncake.async_store", "mooncake.mooncake_config",
                         "mooncake.mooncake_store_service")

# What `from mooncake.store import ...` finds. The enum values are also
# exported at module level as the reference does (where its names clash,
# TaskStatus wins there: FAILED and PROCESSING, which we do not have).
_STORE_NAMES = ("MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ReplicaStatus",
                "BufferHandle", "ObjectDataType", "ReplicaDescriptor", "MemoryDescriptor",
                "DiskDescriptor", "Descriptor", "ParallelAxis", "TensorParallelism", "ReadTarget",
                "MooncakeHostMemAllocator", "bind_to_numa_node")


def real_mooncake_available():
    """True when a real `mooncake.store` can be imported (checked without
    importing it, and ignoring our own finder)."""
    if isinstance(sys.modules.get("mooncake.store"), type(sys)) and \
            not getattr(sys.modules["mooncake.store"], "__mooncake_cxl_shim__", False):
        return True
    try:
        # Ask the finders that come after ours: what would import find on its own?
        for finder in sys.meta_path:
            if isinstance(finder, _ShimFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find("mooncake", None)
            if spec is None:
                continue
            if not spec.submodule_search_locations:
                return False
            return importlib.machinery.PathFinder.find_spec(
                "store", list(spec.submodule_search_locations)) is not None
    except ImportError:
        return False
    return False


def _build_store_module(module):
    import mooncake_cxl
    from mooncake_cxl import _core
    for name in _STORE_NAMES:
        setattr(module, name, getattr(mooncake_cxl, name))
    for enum in (_core.ObjectDataType, _core.ReplicaStatus):
        for name, value in enum.__members__.items():
            if name not in ("FAILED", "PROCESSING"):
                setattr(module, name, value)
    module.ErrorCode = mooncake_cxl.ErrorCode
    module.__all__ = list(_STORE_NAMES)
    module.__doc__ = "mooncake_cxl under Mooncake's name (mooncake_cxl.compat)"


class _ShimLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        module.__mooncake_cxl_shim__ = True
        if module.__name__ == "mooncake.store":
            _build_store_module(module)
        else:
            module.__doc__ = "mooncake_cxl under Mooncake's name: only mooncake.store is provided"
            module.__all__ = []


def _wheel_module_spec(fullname):
    """The spec of `fullname` from the installed Mooncake wheel's directory
    (path finders only: never our own finder), or None without the wheel."""
    try:
        pkg = importlib.machinery.PathFinder.find_spec("mooncake")
        if pkg is None or not pkg.submodule_search_locations:
            return None
        locations = [loc for loc in pkg.submodule_search_locations
                     if importlib.machinery.PathFinder.find_spec("store", [loc]) is not None]
        spec = importlib.machinery.PathFinder.find_spec(fullname, locations) if locations else None
    except (ImportError, ValueError):
        return None
    if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
        return None  # pure Python only
    return spec


class _ShimFinder(importlib.abc.MetaPathFinder):
    """Answers for `mooncake` and `mooncake.store`; refuses other mooncake.* names."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _NAMES:
            return importlib.machinery.ModuleSpec(fullname, _ShimLoader(),
                                                  is_package=(fullname == "mooncake"))
        if fullname in _WHEEL_CLIENT_MODULES:
            spec = _wheel_module_spec(fullname)
            if spec is not None:
                return spec
        if fullname.startswith("mooncake."):
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: mooncake_cxl.compat provides only mooncake.store",
                name=fullname)
        return None


_finder = None


def installed():
    """True when `mooncake.store` resolves (or will resolve) to mooncake_cxl here."""
    return _finder is not None


def _env_asks_for_ours():
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes") for v in (ENV_VAR, SWITCH_VAR))


def install(force=True):
    """Make `import mooncake.store` give mooncake_cxl, also where the real
    Mooncake wheel is installed. Returns True: the shim is in place.

    force=False (or None) is the conditional form: where the real wheel is
    importable it is left in charge (returns False) unless
    MOONCAKE_CXL_AS_MOONCAKE or MOONCAKE_CXL_COMPAT is 1/true/yes."""
    global _finder
    if _finder is not None:
        return True
    if not force and not _env_asks_for_ours() and real_mooncake_available():
        return False
    # Forget a real mooncake imported earlier, so the next import finds ours.
    for name in [n for n in sys.modules if n == "mooncake" or n.startswith("mooncake.")]:
        del sys.modules[name]
    _finder = _ShimFinder()
    sys.meta_path.insert(0, _finder)
    return True


def uninstall():
    """Remove the shim (and the shim modules); the next import sees the real thing."""
    global _finder
    if _finder is None:
        return
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
    for name in [n for n in sys.modules if n == "mooncake" or n.startswith("mooncake.")]:
        if getattr(sys.modules[name], "__mooncake_cxl_shim__", False):
            del sys.modules[name]


_USAGE = """usage: python -m mooncake_cxl.compat run script.py [args...]
       python -m mooncake_cxl.compat run -m module [args...]
       python -m mooncake_cxl.compat check

run    runs the script (or module) with `mooncake.store` resolving to mooncake_cxl,
       even when the real Mooncake wheel is installed, in it and in every python
       process it starts (it sets MOONCAKE_CXL_COMPAT=1 for them).
check  prints which implementation `import mooncake.store` gives in this environment
       after a conditional install (install(force=False): the real wheel when it is
       installed, unless MOONCAKE_CXL_AS_MOONCAKE=1 or MOONCAKE_CXL_COMPAT=1)."""


def main(argv=None):
    import runpy
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "check":
        ours = install(force=False)
        import mooncake.store
        where = "mooncake_cxl (shim)" if ours else getattr(mooncake.store, "__file__", "?")
        print(f"mooncake.store -> {where}")
        return 0
    if command != "run" or not rest:
        print(_USAGE, file=sys.stderr)
        return 2
    install()
    os.environ[SWITCH_VAR] = "1"  # children: mooncake_cxl_compat.pth reads it at start-up
    if rest[0] == "-m":
        if len(rest) < 2:
            print(_USAGE, file=sys.stderr)
            return 2
        sys.argv = rest[1:]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        sys.path[0] = os.path.dirname(os.path.abspath(rest[0]))  # as `python script.py` sets it
        runpy.run_path(rest[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
