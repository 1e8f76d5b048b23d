"""The layers hold: the library never imports a tool, nothing private crosses a package boundary, the engine's
rooms import only the rooms before them, and no module imports itself through others (no circle)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ("fastar_core", "kernels", "nodes")
PACKAGES = ("fastar_core", "kernels", "nodes", "tools")


# The engine's rooms in import order (fastar_core/__init__.py and docs/code-map.md): a room may import the rooms
# before it. errors and memory are shared by every room and import none.
ROOMS = ("model", "files", "caches", "forward", "fastar", "rollout", "families")
SHARED = ("errors", "memory")


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


def test_the_tools_never_import_the_nodes():
    # Both sit on the engine: what the command line and the nodes share lives in fastar_core.
    bad = [f"{p.relative_to(ROOT)} imports {'.'.join(t)}" for p in sources("tools") for t, _ in imports(p)
           if t[:1] == ("nodes",)]
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


def module_of(path: pathlib.Path) -> tuple:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def import_graph() -> dict:
    """Module -> the modules it imports (a name imported from a package counts as its submodule when it is one)."""
    modules = {module_of(p): p for pkg in PACKAGES for p in sources(pkg)}
    graph = {}
    for module, path in modules.items():
        edges = set()
        for target, names in imports(path):
            for name in names:
                edges.add((*target, name) if (*target, name) in modules else target)
        graph[module] = {e for e in edges if e in modules and e != module}
    return graph


def circles(graph: dict) -> list:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(".".join(m) for m in group))
    return found


def test_no_module_imports_itself_through_others():
    assert not circles(import_graph())


def test_the_circle_finder_finds_a_circle():
    assert circles({("a",): {("b",)}, ("b",): {("c",)}, ("c",): {("a",)}, ("d",): {("a",)}}) == [["a", "b", "c"]]
    assert circles({("a",): {("b",)}, ("b",): set()}) == []


def room_of(module: tuple) -> str | None:
    if module[:1] != ("fastar_core",) or len(module) < 2:
        return None
    return module[1]


def test_every_engine_module_sits_in_a_room():
    loose = [".".join(m) for m in import_graph() if room_of(m) not in (None, *ROOMS, *SHARED)]
    assert not loose, f"fastar_core modules outside the rooms {ROOMS}: {loose}"


def test_engine_rooms_import_only_the_rooms_before_them():
    rank = {room: i for i, room in enumerate(ROOMS)}
    bad = []
    for module, targets in import_graph().items():
        mine = room_of(module)
        if mine is None:
            continue
        for target in targets:
            theirs = room_of(target)
            if theirs is None or theirs == mine:
                continue
            upward = theirs in rank and mine in rank and rank[theirs] > rank[mine]
            if (mine in SHARED and theirs not in SHARED) or upward:
                bad.append(f"{'.'.join(module)} ({mine}) imports {'.'.join(target)} ({theirs})")
    assert not bad, bad


def test_every_room_says_what_it_owns_and_may_import():
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((ROOT / "fastar_core" / room / "__init__.py").read_text())) or ""
        assert "Imports" in doc, f"fastar_core/{room}/__init__.py does not say what the room may import"
