"""Model families that change Wan's block or inputs, a folder each (``matrix_game``: Matrix-Game 2.0, ``lingbot``:
LingBot-World 2.0, ``demo``: the bundled demo models, whose steered world is a family), or that keep them and bring a
cache of their own (``longlive2``: LongLive 2.0 on Wan2.2 TI2V-5B).

A family subclasses ``forward.family.ModelFamily`` and registers itself on import; this package imports every
shipped family, and ``fastar_core`` imports this package, so ``family_for`` knows them all.

Imports: every other room (a family's loader reads through ``files``, its rollout settings are ``rollout``'s).
"""

from . import longlive2  # noqa: F401 - registers the family
from .demo import family as demo_family  # noqa: F401 - registers the family
from .lingbot import family as lingbot_family  # noqa: F401 - registers the family
from .matrix_game import family as matrix_game_family  # noqa: F401 - registers the family
