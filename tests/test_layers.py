"""The layers hold: the library never imports a tool, nothing private crosses a package boundary."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ("fastar_core", "kernels", "nodes")
PACKAGES = ("fastar_core", "kernels", "nodes", "tools")


def imports(path: pathlib.Path):
    """(imported module as a path under the root, names) for every relative import of ``path``."""
    here = path.relative_to(ROOT).parent.parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)]
            target = (*base, *(node.module.split(".") if node.module else ()))
            yield target, [a.name for a in node.names]


def sources(package):
    return sorted((ROOT / package).rglob("*.py"))


def test_the_library_never_imports_the_tools():
    bad = [f"{p.relative_to(ROOT)} imports {'.'.join(t)}" for pkg in LIBRARY for p in sources(pkg)
           for t, _ in imports(p) if t[:1] == ("tools",)]
    assert not bad, bad


def test_no_private_name_is_imported_across_packages():
    bad = []
    for pkg in PACKAGES:
        for p in sources(pkg):
            for target, names in imports(p):
                if target[:1] != (pkg,):
                    bad += [f"{p.relative_to(ROOT)}: {n} from {'.'.join(target)}" for n in names if n.startswith("_")]
    assert not bad, bad


def test_imports_only_run_downward_between_library_layers():
    # nodes -> fastar_core -> kernels; kernels know nothing of the engine.
    order = {"nodes": 2, "fastar_core": 1, "kernels": 0}
    bad = [f"{p.relative_to(ROOT)} imports {'.'.join(t)}" for pkg in LIBRARY for p in sources(pkg)
           for t, _ in imports(p) if t[:1] and t[0] in order and order[t[0]] > order[pkg]]
    assert not bad, bad
