"""What a pickle would build, found without building it: nesting depth, object count, and the tensor storages
it declares, read from its opcodes alone.

torch's safe unpickler refuses foreign code, but not shape: a dict key that is a tuple nested 200,000 deep
crashes the interpreter (hashing it recurses in C), and a few bytes of pickle can declare gigabytes of storage.
``scan_pickle`` walks the opcode stream (``pickletools.genops``, which executes nothing), keeps a stack of
placeholders, records which container holds which, and afterwards measures the deepest chain. Reads are
capped at the bytes that exist, so a length field cannot make the scan itself allocate.
"""

from __future__ import annotations

import gc
import pickletools
from dataclasses import dataclass, field

MAX_OBJECTS = 2_000_000  # a 1,500-tensor checkpoint builds ~30,000
MAX_DEPTH = 100  # a state dict is ~6 deep (container, dict, tensor rebuild args, size tuple); optimizer state ~8
_OBJECT_BYTES = 64  # a rough per-object cost, for the memory estimate
_STORAGE_BYTES = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
                  "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
                  "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16, "UntypedStorage": 1,
                  "Float8_e4m3fnStorage": 1, "Float8_e5m2Storage": 1, "UInt16Storage": 2, "UInt32Storage": 4,
                  "UInt64Storage": 8}


class PickleShapeError(ValueError):
    """The opcode stream is not a pickle, or would build something refused (too deep, self-containing)."""


class _Mark:
    pass


_MARK = _Mark()


class _Node:
    """A container or object the unpickler would create; ``children`` are the nodes it holds."""

    __slots__ = ("children", "values", "depth")

    def __init__(self, items=()) -> None:
        self.children: list = []
        self.values: list = []
        self.depth = 1  # a lower bound, kept as items arrive (exact for tuples), so a deep chain stops the scan
        self.add(items)

    def add(self, items) -> None:
        for item in items:
            if isinstance(item, _Node):
                self.children.append(item)
                self.depth = max(self.depth, item.depth + 1)
            self.values.append(item)
            if len(self.values) > 8:  # only short tuples (persistent ids, globals) need their values
                self.values = self.values[:8]


@dataclass
class Global:
    module: str
    name: str


@dataclass
class PickleShape:
    depth: int
    objects: int
    nbytes: int  # what the objects themselves will take, roughly (storages not included)
    storages: list = field(default_factory=list)  # (key, bytes declared) per persistent storage id


class BoundedReader:
    """A file-like view whose reads never ask for more than remains, and whose lines are capped."""

    def __init__(self, f, size: int, max_line: int = 1 << 20):
        self.f, self.left, self.max_line = f, size, max_line
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.f.read(n)
        self.left -= len(data)
        self.pos += len(data)
        return data

    def readline(self) -> bytes:
        data = self.f.readline(min(self.max_line, self.left))
        self.left -= len(data)
        self.pos += len(data)
        return data

    def tell(self) -> int:
        return self.pos


_SCALARS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING",
            "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "UNICODE",
            "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "NONE", "NEWTRUE", "NEWFALSE", "FLOAT", "BINFLOAT",
            "NEXT_BUFFER", "EXT1", "EXT2", "EXT4"}
_EMPTY = {"EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE", "EMPTY_SET"}
_FROM_MARK = {"LIST", "TUPLE", "DICT", "FROZENSET", "INST", "OBJ"}
_NO_EFFECT = {"PROTO", "FRAME", "PUT", "BINPUT", "LONG_BINPUT", "READONLY_BUFFER"}


def scan_pickle(stream, max_depth: int = MAX_DEPTH) -> PickleShape:
    """Walk one pickle (up to its STOP) from ``stream`` (a ``BoundedReader``); raises ``PickleShapeError``."""
    enabled = gc.isenabled()
    gc.disable()  # the placeholders hold no cycles; collecting while hundreds of thousands arrive is quadratic
    try:
        return _scan(stream, max_depth)
    finally:
        if enabled:
            gc.enable()


def _scan(stream, max_depth: int) -> PickleShape:
    stack: list = []
    memo: dict = {}
    objects = nbytes = 0
    storages: list = []
    roots: list = []

    def pop_mark() -> list:
        items: list = []
        while stack:
            item = stack.pop()
            if item is _MARK:
                items.reverse()
                return items
            items.append(item)
        raise PickleShapeError("lacks a MARK it needs")

    def pop():
        if not stack or stack[-1] is _MARK:
            raise PickleShapeError("pops from an empty stack")
        return stack.pop()

    def top_node() -> _Node:
        if not stack or not isinstance(stack[-1], _Node):
            raise PickleShapeError("adds an item to something that is not a container")
        return stack[-1]

    def too_deep(node: _Node) -> None:
        if node.depth > max_depth:
            raise PickleShapeError(f"nests containers more than {max_depth} deep")

    def new(items=()) -> _Node:
        nonlocal objects, nbytes
        node = _Node(items)
        too_deep(node)
        objects += 1
        if objects > MAX_OBJECTS:
            raise PickleShapeError(f"builds more than {MAX_OBJECTS:,} objects; a checkpoint builds a few per tensor")
        nbytes += _OBJECT_BYTES + 8 * len(node.values)
        roots.append(node)
        return node

    try:
        for op, arg, _ in pickletools.genops(stream):
            name = op.name
            if name in _SCALARS:
                objects += 1
                if objects > MAX_OBJECTS:
                    raise PickleShapeError(f"builds more than {MAX_OBJECTS:,} objects; a checkpoint builds a few "
                                           "per tensor")
                nbytes += _OBJECT_BYTES + (len(arg) if isinstance(arg, (str, bytes, bytearray)) else 0)
                stack.append(arg if isinstance(arg, (str, int)) and not isinstance(arg, bool) else None)
            elif name in _EMPTY:
                stack.append(new())
            elif name == "MARK":
                stack.append(_MARK)
            elif name in _FROM_MARK:
                items = pop_mark()
                if name == "INST":
                    module, _, attr = str(arg).partition(" ")
                    items = [Global(module, attr), *items]
                stack.append(new(items))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                count = int(name[-1])
                items = [pop() for _ in range(count)][::-1]
                stack.append(new(items))
            elif name == "APPEND":
                item = pop()
                top_node().add([item])
                too_deep(stack[-1])
            elif name in ("APPENDS", "SETITEMS", "ADDITEMS"):
                items = pop_mark()
                top_node().add(items)
                too_deep(stack[-1])
                nbytes += 16 * len(items)
            elif name == "SETITEM":
                value, key = pop(), pop()
                top_node().add([key, value])
                too_deep(stack[-1])
                nbytes += 16
            elif name == "BUILD":
                state = pop()
                top_node().add([state])
                too_deep(stack[-1])
            elif name in ("REDUCE", "NEWOBJ"):
                args, func = pop(), pop()
                stack.append(new([func, args]))
            elif name == "NEWOBJ_EX":
                kwargs, args, cls = pop(), pop(), pop()
                stack.append(new([cls, args, kwargs]))
            elif name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
                stack.append(Global(module, attr))
            elif name == "STACK_GLOBAL":
                attr, module = pop(), pop()
                stack.append(Global(str(module), str(attr)))
            elif name in ("PERSID", "BINPERSID"):
                pid = arg if name == "PERSID" else pop()
                storages.append(_storage(pid))
                stack.append(new())
            elif name == "MEMOIZE":
                if not stack:
                    raise PickleShapeError("memoizes from an empty stack")
                memo[len(memo)] = stack[-1]
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                if not stack:
                    raise PickleShapeError("memoizes from an empty stack")
                memo[arg] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise PickleShapeError(f"reads memo entry {arg} before writing it")
                stack.append(memo[arg])
            elif name == "DUP":
                stack.append(stack[-1] if stack else pop())
            elif name == "POP":
                pop()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "STOP":
                if len(stack) != 1:
                    raise PickleShapeError(f"ends with {len(stack)} items on the stack instead of one")
                break
            elif name not in _NO_EFFECT:
                raise PickleShapeError(f"has an unknown opcode {name}")
    except PickleShapeError:
        raise
    except (ValueError, EOFError, IndexError, KeyError, OverflowError) as e:
        raise PickleShapeError(f"is corrupt ({e})") from None
    depth = _depth(roots, max_depth)
    return PickleShape(depth, objects, nbytes, [s for s in storages if s is not None])


def _storage(pid):
    """(key, bytes) of a torch persistent id ('storage', type, key, location, numel[, view]), else None."""
    if not isinstance(pid, _Node) or len(pid.values) < 5 or pid.values[0] != "storage":
        return None
    kind, key, numel = pid.values[1], pid.values[2], pid.values[4]
    if not isinstance(numel, int):
        raise PickleShapeError(f"declares a tensor storage of size {numel!r}, not a count")
    width = _STORAGE_BYTES.get(kind.name, 8) if isinstance(kind, Global) else 8
    return str(key), numel * width


def _depth(roots: list, max_depth: int) -> int:
    """The longest chain of containment among the nodes; refuses chains past ``max_depth`` and cycles."""
    depth: dict = {}
    on_path: set = set()
    deepest = 0
    for root in roots:
        if id(root) in depth:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                on_path.add(id(node))
                if len(on_path) > max_depth:
                    raise PickleShapeError(f"nests containers more than {max_depth} deep")
            if i < len(node.children):
                work.append((node, i + 1))
                child = node.children[i]
                if id(child) in on_path:
                    raise PickleShapeError("holds a container that contains itself")
                if id(child) not in depth:
                    work.append((child, 0))
                continue
            d = 1 + max((depth[id(c)] for c in node.children), default=0)
            if d > max_depth:
                raise PickleShapeError(f"nests containers more than {max_depth} deep")
            depth[id(node)] = d
            deepest = max(deepest, d)
            on_path.discard(id(node))
    return deepest
