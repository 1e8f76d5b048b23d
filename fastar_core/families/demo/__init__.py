"""The bundled demo models, a toy text-to-video model and a steered world, as the engine runs them.

``model.py`` loads their files (a Wan module tree, a tiny text encoder and, for the world, an action encoder);
``steer_world.py`` is the world itself (a wrapping map, camera tracks); ``actions.py`` conditions the Wan forward on
the camera's keys and positions (``ActionRunner``); ``family.py`` makes the steered world a model family, so the
nodes and the samplers run it like Matrix-Game 2.0, steered by ``Actions`` of the ``demo_world`` variant.
"""
