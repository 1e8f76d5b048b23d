"""The Wan network: hyper-parameters (``wan_config``), the module tree whose names are the checkpoint keys
(``wan_model``), 3-D RoPE (``rope``) and the tensor-only pieces of a block between its attention calls
(``block_forward``).

Imports: ``errors`` only. Nothing here knows about caches, files or rollouts.
"""
