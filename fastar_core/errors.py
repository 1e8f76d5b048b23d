"""User-facing errors: one message that names the input and what would be valid."""

_SHOWN_CHARS = 60


def shown(value) -> str:
    """A value as a message shows it: its repr, cut short (an input may hold a megabyte where a name goes)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still named by its type
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


class FastARError(ValueError):
    """Bad input to the engine (a checkpoint, a frame count, a config field, a conditioning tensor)."""


class CheckpointError(FastARError):
    """A checkpoint file that cannot be used as the requested Wan2.1 model."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class GenerationCancelled(RuntimeError):
    """Raised between denoising steps when the caller's cancel check returns True."""
