"""One causal pass of the network over a chunk: ``runner`` (the block-causal Wan forward against the caches),
``attention`` (the seam every attention variant plugs into, and the dense reference), ``family`` (what a model family
changes around Wan's block, and the registry that picks one) and ``parallel`` (sequence parallelism across ranks).

Imports: ``errors``, ``memory``, ``model``, ``caches`` and ``kernels``.
"""
