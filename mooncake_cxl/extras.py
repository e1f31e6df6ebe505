"""The optional features of mooncake-cxl and the pip extras that bring them
(pyproject.toml's [project.optional-dependencies]).

A command whose feature's extra is missing fails before it starts with one
line naming the extra (require() raises MissingExtra; the command prints it
and exits with EXIT_MISSING), instead of a traceback halfway through.
"""
import importlib.util

from . import checkout

# extra: the modules it provides that the package imports
EXTRAS = {
    "bench": ("numpy",),
    "compare": ("matplotlib", "tqdm"),
    "oracle": ("mooncake",),
    "remote": ("mooncake",),
    "torch": ("torch",),
    "vllm": ("vllm",),
}
EXIT_MISSING = 2


class MissingExtra(ImportError):
    """A feature was asked for whose extra is not installed; str() is the one line to print."""


def importable(module):
    """True when `module` can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install_hint(extra):
    """The pip command that installs `extra`: from the source checkout when this
    package runs from one, else from the index."""
    if checkout.package_checkout():
        return f"pip install '.[{extra}]'"
    return f"pip install 'mooncake-cxl[{extra}]'"


def missing(extra, modules=None):
    """The modules of `extra` (or the given subset of them) that are not importable."""
    return [m for m in (modules or EXTRAS[extra]) if not importable(m)]


def require(feature, extra, modules=None):
    """Raises MissingExtra when a module of `extra` that `feature` needs is missing."""
    absent = missing(extra, modules)
    if absent:
        raise MissingExtra(f"{feature} needs the '{extra}' extra (no module {', '.join(absent)}): "
                           f"{install_hint(extra)}")
