"""Where a Matrix-Game 2.0 file's sizes come from: its own metadata, the config.json beside it (the release's folder
layout), or, for a released file alone at the top of models/diffusion_models as ComfyUI's model download leaves it,
the released variant its keys and shapes are. The bundled configs are the release's own (checked against its
configs when FASTAR_REFERENCE_DIR holds them)."""

import json

import pytest
import reference_harness as rh
from matrix_game_models import tiny_config

from comfyui_fastar.fastar_core.errors import CheckpointError
from comfyui_fastar.fastar_core.families.matrix_game.checkpoint import (
    PREFIX,
    choose_config,
    load_matrix_game_checkpoint,
    released_shapes,
    save_matrix_game,
)
from comfyui_fastar.fastar_core.families.matrix_game.config import RELEASED, from_reference_config
from comfyui_fastar.fastar_core.families.matrix_game.model import random_matrix_game
from comfyui_fastar.fastar_core.files.family_keys import is_matrix_game


def test_a_file_carries_its_config_in_its_metadata(tmp_path):
    model = random_matrix_game(tiny_config("templerun"), seed=1)
    save_matrix_game(model, tmp_path / "templerun_7dim_onlykey.safetensors", config_in_file=True)
    assert not (tmp_path / "config.json").exists()
    ckpt = load_matrix_game_checkpoint(tmp_path / "templerun_7dim_onlykey.safetensors")
    assert ckpt.config == model.config and ckpt.config_source == "the file's fastar_config metadata"


def test_a_config_json_beside_the_file_is_read_and_named_when_it_does_not_fit(tmp_path):
    save_matrix_game(random_matrix_game(tiny_config("universal"), seed=1), tmp_path / "model.safetensors")
    assert load_matrix_game_checkpoint(tmp_path / "model.safetensors").config_source == str(tmp_path / "config.json")
    config = json.loads((tmp_path / "config.json").read_text())
    config["action_config"]["keyboard_dim_in"] = 7
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="does not fit the Matrix-Game custom layout of its config.json"):
        load_matrix_game_checkpoint(tmp_path / "model.safetensors")


def test_a_file_of_other_sizes_alone_is_refused_naming_what_to_add(tmp_path):
    save_matrix_game(random_matrix_game(tiny_config("universal"), seed=1), tmp_path / "model.safetensors")
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="has no config.json beside it and is none of the released Matrix-Game "
                                              "2.0 models \\(closest, .*\\): put it in a folder of its own with the "
                                              "config.json it came with"):
        load_matrix_game_checkpoint(tmp_path / "model.safetensors")


@pytest.mark.parametrize("variant", list(RELEASED))
def test_a_released_file_alone_is_recognised_by_its_keys_and_shapes(tmp_path, variant):
    declared = {PREFIX + k: shape for k, shape in released_shapes(variant).items()}
    assert is_matrix_game(declared)
    config, source = choose_config(tmp_path / "alone.safetensors", declared, {})
    assert config is RELEASED[variant] and config.variant == variant
    assert source == f"the released {variant} model's config (recognised by its keys and shapes)"
    # one tensor of another shape is not the release
    key = next(k for k in declared if "keyboard_embed" in k and k.endswith("weight"))
    changed = {**declared, key: (declared[key][0], declared[key][1] + 1)}
    with pytest.raises(CheckpointError, match="none of the released"):
        choose_config(tmp_path / "alone.safetensors", changed, {})


@pytest.mark.skipif(not rh.REFERENCE_DIR or not (rh.reference_root("matrix_game") / "configs").is_dir(),
                    reason="FASTAR_REFERENCE_DIR/matrix_game is not there (see tools/extract_references.py)")
@pytest.mark.parametrize("variant", list(RELEASED))
def test_the_bundled_configs_are_the_releases(variant):
    path = rh.reference_root("matrix_game") / "configs" / "distilled_model" / variant / "config.json"
    assert from_reference_config(json.loads(path.read_text())) == RELEASED[variant]
