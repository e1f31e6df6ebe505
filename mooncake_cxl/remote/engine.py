"""Mooncake's Transfer Engine class for this package's remote clients and the
process serving the pool, also under the compat switch, whose shim refuses
`mooncake.engine` to the program."""
import importlib.machinery
import importlib.util
import sys


def _shim_answers():
    """True when mooncake_cxl.compat's shim answers, or is armed to answer, for
    `mooncake` (judged by names: importing compat here would close a cycle)."""
    if getattr(sys.modules.get("mooncake"), "__mooncake_cxl_shim__", False):
        return True
    return any(type(f).__name__ in ("_ShimFinder", "_LazyShim") for f in sys.meta_path)


def transfer_engine_class():
    """Mooncake's TransferEngine, for this package's remote clients and the
    process serving the pool. Where the shim answers for `mooncake` (the
    compat switch), the wheel's engine extension is loaded from its file and
    not left in sys.modules, so the program's own `import mooncake.engine`
    stays refused; elsewhere it is a plain import."""
    if not _shim_answers():
        from mooncake.engine import TransferEngine
        return TransferEngine
    pkg = importlib.machinery.PathFinder.find_spec("mooncake")
    spec = importlib.machinery.PathFinder.find_spec("mooncake.engine", list(pkg.submodule_search_locations)) \
        if pkg is not None and pkg.submodule_search_locations else None
    if spec is None:
        raise ModuleNotFoundError("No module named 'mooncake.engine' (the Transfer Engine wheel)",
                                  name="mooncake.engine")
    before = sys.modules.get(spec.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if before is None:
        sys.modules.pop(spec.name, None)  # published by the extension's init: not the program's
    return module.TransferEngine
