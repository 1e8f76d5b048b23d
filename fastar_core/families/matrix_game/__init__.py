"""Matrix-Game 2.0 (Skywork): Wan2.1-1.3B made causal and steered by keyboard and mouse, as a model family.

``config.py`` (its ``config.json``, the three released variants), ``model.py`` (the module tree, checkpoint names),
``action.py`` (the action module's forward), ``caches.py`` (keyboard and mouse caches), ``family.py`` (the
runner's hooks), ``checkpoint.py`` (loading a released file and the config beside it; ``files/family_keys.py``
recognises one), ``rollout.py`` (the conditioning and rollout settings its inference uses).
``docs/matrix-game.md`` has more.
"""
