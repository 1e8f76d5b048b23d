"""User-facing errors: one message that names the input and what would be valid."""


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
