"""Errors raised by the kernels package.

Both subclass ValueError, so callers that already catch bad-argument errors keep working.
"""


class KernelInputError(ValueError):
    """An input tensor or argument has the wrong shape, dtype, device or value."""


class BackendUnavailableError(ValueError):
    """The backend asked for cannot run this op on this device / install."""
