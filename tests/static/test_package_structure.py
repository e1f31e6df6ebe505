"""The import structure of the mooncake_cxl package, read from its sources
(ast, nothing is imported): no module imports itself back through any chain
of imports (lazy imports inside functions count: they close a circle all the
same), and no benchmark module takes a private name (`_x`) of another module.
"""
import ast
import importlib.machinery
from pathlib import Path

import mooncake_cxl
from conftest import REPO

PACKAGE = Path(REPO) / "mooncake_cxl"

# Private names a benchmark module may take, and why.
BENCH_PRIVATE_ALLOWED = {
    # The memcpy baseline is a native module of its own (mooncake_cxl._bench_core,
    # not the product binding), measured in the same process as the store calls
    # it is compared with.
    ("mooncake_cxl.bench.common", "mooncake_cxl._bench_core"),
    ("mooncake_cxl.bench.common", "mooncake_cxl._bench_core.MemcpyBench"),
}


def _modules(root=PACKAGE):
    """{dotted name: path} of every .py file of the package at `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _native_modules():
    """Dotted names of the compiled modules of the installed package (the
    binding that CMake builds from python/): they are modules, not names of
    the package they sit in."""
    installed = Path(mooncake_cxl.__file__).parent
    out = set()
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for path in installed.rglob("*" + suffix):
            rel = path.relative_to(installed.parent).parts
            out.add(".".join(rel[:-1] + (path.name[:-len(suffix)],)))
    return out


def _is_package(name, modules):
    return modules.get(name, Path()).name == "__init__.py"


def _base(module, node, modules):
    """The module an ImportFrom names, absolute."""
    if not node.level:
        return node.module
    package = module if _is_package(module, modules) else module.rsplit(".", 1)[0]
    for _ in range(node.level - 1):
        package = package.rsplit(".", 1)[0]
    return f"{package}.{node.module}" if node.module else package


def _imports(module, path, modules):
    """[(imported module or name, bound local name or None, line)] of one module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((a.name, a.asname or a.name.split(".")[0], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, node, modules)
            for a in node.names:
                out.append((f"{base}.{a.name}", a.asname or a.name, node.lineno))
    return out


def _graph(modules, native=frozenset()):
    """{module: {imported module of the package}}: `from X import y` depends on
    X.y when that is a module, else on X (whose y it is)."""
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target, _, _ in _imports(name, path, modules):
            if target in modules:
                deps.add(target)
            elif target not in native and target.rsplit(".", 1)[0] in modules:
                deps.add(target.rsplit(".", 1)[0])
        deps.discard(name)
        graph[name] = deps
    return graph


def _cycles(graph):
    """Every strongly connected set of more than one module (Tarjan), each as a
    list of names in the order of one circle through them."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _private(dotted):
    """A name of this package with a private part (mooncake_cxl.x._y, mooncake_cxl._x)."""
    parts = dotted.split(".")
    return parts[0] == "mooncake_cxl" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _bench_private_uses(modules):
    """(module, private name, line) of every private name a bench module takes
    of another module: imported by name, or read as an attribute of an
    imported module."""
    found = []
    for name, path in modules.items():
        if not name.startswith("mooncake_cxl.bench"):
            continue
        bound = {}  # local name -> module it names
        for target, local, line in _imports(name, path, modules):
            if _private(target) and (name, target) not in BENCH_PRIVATE_ALLOWED:
                found.append((name, target, line))
            bound[local] = target
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                target = f"{bound[node.value.id]}.{node.attr}"
                if _private(target) and (name, target) not in BENCH_PRIVATE_ALLOWED:
                    found.append((name, target, node.lineno))
    return found


def test_the_package_is_where_the_test_reads_it():
    modules = _modules()
    assert {"mooncake_cxl", "mooncake_cxl.store", "mooncake_cxl.bench.compare"} <= modules.keys()
    assert "mooncake_cxl._core" in _native_modules()


def test_no_import_cycle():
    assert _cycles(_graph(_modules(), _native_modules())) == []


def test_bench_modules_use_public_names_only():
    assert _bench_private_uses(_modules()) == []


# ---------------------------------------------------------------- the checks themselves

def _fake_package(tmp_path, files):
    root = tmp_path / "mooncake_cxl"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return _modules(root)


def test_a_lazy_import_closing_a_circle_is_found(tmp_path):
    modules = _fake_package(tmp_path, {
        "__init__.py": "", "a.py": "from .b import x\n",
        "b.py": "def f():\n    from .a import y\n", "c.py": "from . import a\n"})
    assert _cycles(_graph(modules)) == [["mooncake_cxl.a", "mooncake_cxl.b"]]


def test_a_private_name_taken_by_a_bench_module_is_found(tmp_path):
    modules = _fake_package(tmp_path, {
        "__init__.py": "", "bench/__init__.py": "", "bench/compare.py": "def _helper(): pass\n",
        "bench/other.py": "import os\nfrom . import compare\nfrom .compare import _helper\n"
                          "compare._helper()\nos._exit(0)\n"})
    assert _bench_private_uses(modules) == [
        ("mooncake_cxl.bench.other", "mooncake_cxl.bench.compare._helper", 3),
        ("mooncake_cxl.bench.other", "mooncake_cxl.bench.compare._helper", 4)]
