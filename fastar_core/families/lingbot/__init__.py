"""LingBot-World 2.0 ("Infinity", Robbyant): Wan made causal, conditioned on a start image, a prompt and a camera
path, as a model family.

``config.py`` (its ``config.json``, the 14B and 1.3B sizes), ``model.py`` (the module tree, checkpoint names),
``camera.py`` (poses and intrinsics per video frame -> rays per latent frame), ``family.py`` (the runner's hooks:
the joined image channels and the camera injected in every block), ``checkpoint.py`` (a ``from_pretrained`` folder:
config.json and safetensors shards), ``rollout.py`` (the conditioning and rollout settings its inference uses).
``docs/lingbot.md`` has more.
"""
