"""The engine: the causal Wan runner, its caches, FAST-AR and the rollout loop, in pure torch (no ComfyUI).

Its rooms, each importing only the rooms listed before it (and ``kernels``); ``errors`` and ``memory`` are shared
by all of them:

- ``model/``: the Wan network: config, module tree, RoPE, the tensor pieces of a block;
- ``files/``: every file a user hands in, read safely: readers, pickle scans, layouts, LoRA, model-file detection;
- ``caches/``: what a chunk's queries see of the past: retention (global, window, rolling, recompute, TempCache)
  and storage (int8);
- ``forward/``: one causal pass: the runner, the attention seam, the family hooks, sequence parallelism;
- ``fastar/``: FAST-AR's selection (AnnSA, AnnCA), its attention and presets;
- ``rollout/``: a whole video: settings, the sampler, schedules and solvers, conditioning, prompts, actions, the VAE
  in the loop;
- ``families/``: model families that change Wan's block or inputs (Matrix-Game 2.0), each in a folder of its own.

``docs/code-map.md`` maps them. Importing the package registers every shipped family with ``forward.family``.
"""

from . import families as families  # noqa: E402 - the shipped families register themselves on import
