"""Small JSON files a user hands in (a calibration, a model folder's config.json and index), read with their
size, nesting and numbers bounded.

Python's parser turns a deeply nested file into a RecursionError and a 5,000-digit integer into a ValueError,
both far from the file's name; here each is one ``FastARError`` naming the file and the limit.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..errors import FastARError

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_INT_DIGITS = 18
_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _depth(text: str) -> int:
    depth = deepest = 0
    for m in _BRACKETS.finditer(text):
        token = m.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def read_json(path, what: str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH):
    """The JSON value in ``path``; ``what`` names the input in every message (e.g. "--calibration x.json")."""
    p = Path(path)
    try:
        if not p.is_file():
            problem = ("no such file" + (" (a broken symbolic link)" if p.is_symlink() else "") if not p.exists()
                       else "a directory, not a JSON file" if p.is_dir() else "not a regular file")
            raise FastARError(f"{what}: {problem}")
        size = p.stat().st_size
        if size > max_bytes:
            raise FastARError(f"{what}: {size:,} bytes; a JSON file read here is at most {max_bytes:,}")
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise FastARError(f"{what}: not a JSON file (not UTF-8 text)") from None
    except OSError as e:
        raise FastARError(f"{what}: cannot be read ({e.strerror or e})") from None
    return parse_json(text, what, max_depth)


def parse_json(text: str, what: str, max_depth: int = MAX_DEPTH):
    """The JSON value of ``text`` (a file's, or one a file carries in its metadata), nesting and numbers bounded."""
    if _depth(text) > max_depth:
        raise FastARError(f"{what}: nested more than {max_depth} deep (at most {max_depth})")

    def bounded_int(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise FastARError(f"{what}: holds a {len(digits)}-digit integer; at most {MAX_INT_DIGITS} digits")
        return int(digits)

    try:
        return json.loads(text, parse_int=bounded_int, parse_constant=lambda c: math.nan)
    except json.JSONDecodeError as e:
        raise FastARError(f"{what}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise FastARError(f"{what}: nested too deeply (at most {max_depth})") from None
