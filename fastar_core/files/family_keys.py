"""Recognising a Matrix-Game 2.0 checkpoint from its keys alone (before anything is read)."""

from __future__ import annotations

PREFIX = "model."  # the reference's WanDiffusionWrapper holds the model as ``self.model``


def is_matrix_game(keys) -> bool:
    """Whether checkpoint keys (prefixed or not) are Matrix-Game's: a CLIP-vision context (``img_emb``), action
    modules in its blocks, and no text embedding."""
    keys = [k[len(PREFIX):] if k.startswith(PREFIX) else k for k in keys]
    return (any(k.startswith("img_emb.") for k in keys) and any(".action_model." in k for k in keys)
            and not any(k.startswith("text_embedding.") for k in keys))
