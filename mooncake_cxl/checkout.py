"""Whether this package runs from a source checkout of mooncake-cxl (an
editable install, PYTHONPATH) or from an installed copy: the hints a command
prints (`pip install '.[extra]'`) and where the benchmark's report goes
depend on it.
"""
import os


def is_checkout(path):
    """True when `path` is the root of a mooncake-cxl source checkout."""
    try:
        with open(os.path.join(path, "pyproject.toml")) as f:
            return 'name = "mooncake-cxl"' in f.read()
    except OSError:
        return False


def package_checkout():
    """The checkout this package is imported from, or None when it is installed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return root if is_checkout(root) else None
