"""FAST-AR's selection, in FlashDreams' words the sparse-selection policy: which keys a query is shown before the
kernel runs. ``ann`` hashes queries and keys (AnnSA's buckets, AnnCA's prompt-token matches), ``attention`` is
FAST-AR's attention on the seam of ``forward.attention``, ``config`` its settings and presets (TempCache's settings
come from ``caches``), ``metrics`` what it measures against dense attention (recall, error).

Imports: ``errors``, ``files`` (a calibration file), ``caches``, ``forward`` and ``kernels``.
"""
