"""A stand-in for torchvision, on the engine tests' PYTHONPATH only.

SGLang imports torchvision unconditionally (its multimodal processors), and
PyPI's torchvision does not load beside the CPU-only torch these tests use.
Nothing on the KV-cache paths under test uses it. Every `torchvision.*` module
imports; every name in them is a placeholder that raises on any use.
"""
import importlib.abc
import importlib.machinery
import sys
import types

STUB = True


class Unavailable:
    def __init__(self, name):
        self._name = name

    def _fail(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: torchvision is a test stub here (tests/engines/no_torchvision)")

    __call__ = _fail

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{self._name}.{attr}")

    def __mro_entries__(self, bases):
        return (object,)


def _module_getattr(module):
    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{module}.{attr}")
    return __getattr__


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = _module_getattr(module.__name__)


__version__ = "0.0.0+stub"
__getattr__ = _module_getattr(__name__)
sys.meta_path.append(_Finder())
