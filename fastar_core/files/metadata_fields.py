"""A file's metadata checked against a table of its entries, by type and range, before anything uses it.

A table is a tuple of ``Field``: a dotted path into the metadata (``"sampler.steps"``; ``"phases[].steps"``
means the entry of every item of a list), what its value must be (``whole(1, 100)``, ``number(0, 1)``,
``text(200)``, ``one_of("unipc")``, ...) and what it means. A new entry is one line. ``check_fields`` walks the
table in order, so a parent (an object, a list) is checked before its entries; an entry whose parent is absent
(an optional object) is skipped. The first entry that does not fit is one ``CheckpointError`` naming the file,
the entry, the value found (cut short) and what would be valid.

Sizes a table lets through are bounded, so that a value read from a file can become a loop count or an
allocation without a further check: a step count of 10,000 or a text length of a billion is refused here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import CheckpointError, shown

_MISSING = object()


@dataclass(frozen=True)
class Kind:
    """What a value must be: ``fits(value)`` says whether it is, ``valid`` says it in words."""

    fits: Callable[[object], bool]
    valid: str


def _is_number(v) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer too large for a float
        return False


def whole(lo: int, hi: int) -> Kind:
    return Kind(lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi,
                f"a whole number in {lo:,}..{hi:,}" if lo != hi else f"the whole number {lo:,}")


def number(lo: float, hi: float, open_low: bool = False) -> Kind:
    def fits(v):
        return _is_number(v) and (v > lo if open_low else v >= lo) and v <= hi
    return Kind(fits, f"a finite number in {'(' if open_low else '['}{lo:g}, {hi:g}]")


def any_number() -> Kind:
    """A number of any size, NaN included (a record, such as a final loss, that nothing computes with)."""
    return Kind(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number")


def text(max_chars: int, min_chars: int = 1) -> Kind:
    return Kind(lambda v: isinstance(v, str) and min_chars <= len(v) <= max_chars,
                f"text of {min_chars}..{max_chars:,} characters")


def one_of(*choices: str) -> Kind:
    return Kind(lambda v: isinstance(v, str) and v in choices, "one of " + ", ".join(repr(c) for c in choices))


def obj() -> Kind:
    return Kind(lambda v: isinstance(v, dict), "an object")


def items(lo: int, hi: int) -> Kind:
    """A list of ``lo..hi`` items (their entries checked by ``name[]`` fields)."""
    return Kind(lambda v: isinstance(v, list) and lo <= len(v) <= hi, f"a list of {lo:,}..{hi:,} items")


def list_of(kind: Kind, lo: int, hi: int) -> Kind:
    """A list of ``lo..hi`` values, each ``kind``."""
    return Kind(lambda v: isinstance(v, list) and lo <= len(v) <= hi and all(kind.fits(x) for x in v),
                f"a list of {lo:,}..{hi:,} items, each {kind.valid}" if lo != hi
                else f"a list of {lo} items, each {kind.valid}")


@dataclass(frozen=True)
class Field:
    path: str  # dotted; "name[]" steps into every item of a list
    kind: Kind
    meaning: str = ""
    required: bool = True


def _values(meta, parts: list, shown_path: str):
    """(path as shown, value or _MISSING) for every place ``parts`` names; nothing where a parent is absent."""
    if not parts:
        yield shown_path, meta
        return
    head, rest = parts[0], parts[1:]
    each = head.endswith("[]")
    name = head[:-2] if each else head
    if not isinstance(meta, dict):
        return
    value = meta.get(name, _MISSING)
    where = f"{shown_path}.{name}" if shown_path else name
    if not each:
        if value is _MISSING:
            if not rest:
                yield where, _MISSING
            return
        if rest:
            yield from _values(value, rest, where)
        else:
            yield where, value
        return
    if not isinstance(value, list):
        return
    for i, item in enumerate(value):
        yield from _values(item, rest, f"{where}[{i}]") if rest else iter([(f"{where}[{i}]", item)])


def check_fields(path, meta: dict, fields, what: str) -> None:
    """Refuse (``CheckpointError``) the first entry of ``meta`` that does not fit its field of ``fields``;
    ``what`` names the metadata ("demo metadata")."""
    for field in fields:
        for where, value in _values(meta, field.path.split("."), ""):
            why = f" ({field.meaning})" if field.meaning else ""
            if value is _MISSING:
                if field.required:
                    raise CheckpointError(path, f"its {what} has no entry '{where}'; expected {field.kind.valid}"
                                                f"{why}")
                continue
            if not field.kind.fits(value):
                raise CheckpointError(path, f"its {what} entry '{where}' is {shown(value)}; valid: "
                                            f"{field.kind.valid}{why}")
