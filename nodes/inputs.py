"""Small builders for V1 input specs, so every input carries a tooltip and the specs read as a table."""

from __future__ import annotations


def link(type_name: str, tooltip: str, **extra) -> tuple:
    """A socket (MODEL, CONDITIONING, ...): no widget."""
    return (type_name, {"tooltip": tooltip, **extra})


def int_input(default: int, minimum: int, maximum: int, tooltip: str, step: int = 1, **extra) -> tuple:
    return ("INT", {"default": default, "min": minimum, "max": maximum, "step": step, "tooltip": tooltip, **extra})


def float_input(default: float, minimum: float, maximum: float, tooltip: str, step: float = 0.01,
                **extra) -> tuple:
    return ("FLOAT", {"default": default, "min": minimum, "max": maximum, "step": step, "tooltip": tooltip,
                      **extra})


def combo(options, tooltip: str, default=None) -> tuple:
    options = list(options)
    spec = {"tooltip": tooltip}
    if options:  # a file list may be empty until the user adds files
        spec["default"] = options[0] if default is None else default
    return (options, spec)


def string_input(default: str, tooltip: str, multiline: bool = False) -> tuple:
    return ("STRING", {"default": default, "multiline": multiline, "tooltip": tooltip})


def seed_input(tooltip: str) -> tuple:
    # The editor adds its "fixed / randomize" widget after an INT named seed.
    return ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True,
                    "tooltip": tooltip})
