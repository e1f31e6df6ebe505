"""Start-up hook of mooncake_cxl.compat (installed next to mooncake_cxl_compat.pth).

The .pth line runs in every interpreter that uses this site-packages; it only
imports this module when MOONCAKE_CXL_COMPAT=1 (1/true/yes), so an unset
switch costs one environment lookup. arm() puts a finder first on
sys.meta_path that does nothing until the first `mooncake`/`mooncake.*`
import: then it removes itself, imports mooncake_cxl.compat, installs the
shim (forced: the switch asks for ours even when the real wheel is present)
and lets the shim answer. Interpreters that never import mooncake never load
mooncake_cxl, so the switch is safe to export to a whole process tree
(vLLM's EngineCore and workers, multiprocessing spawn, subprocess python).
"""
import sys


class _LazyShim:
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "mooncake" and not fullname.startswith("mooncake."):
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        from mooncake_cxl import compat
        compat.install(force=True)
        return compat._finder.find_spec(fullname, path, target)


def arm():
    if not any(isinstance(f, _LazyShim) for f in sys.meta_path):
        sys.meta_path.insert(0, _LazyShim())
