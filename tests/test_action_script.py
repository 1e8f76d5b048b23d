"""Action scripts for Matrix-Game 2.0: timelines in seconds -> per-frame keyboard and mouse tensors, and back.

The reference checks (skipped unless ``FASTAR_REFERENCE_DIR`` holds ``matrix_game``, written by
``tools/extract_references.py``) compare the key layouts with the reference's own interactive maps, and turn the
reference's own benchmark actions into scripts and back, bit for bit.
"""

import ast
import importlib.util
import json
import os
import random
from pathlib import Path

import pytest
import torch

from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.rollout.action_script import (
    VARIANTS,
    parse_script,
    parse_text,
    read_script_file,
    script_from_tensors,
)

REFERENCE = Path(os.environ.get("FASTAR_REFERENCE_DIR") or "/nonexistent") / "matrix_game"
needs_reference = pytest.mark.skipif(not (REFERENCE / "utils" / "conditions.py").exists(),
                                     reason="FASTAR_REFERENCE_DIR has no matrix_game (tools/extract_references.py)")


def script(variant="universal", timeline=None, **top):
    return {"variant": variant, "timeline": [{"at": 0, "keys": ["W"]}] if timeline is None else timeline, **top}


def test_a_timeline_holds_each_entry_until_the_next_at_the_video_frame_rate():
    s = parse_script(script(timeline=[{"at": 0, "keys": ["W"]}, {"at": 1.5, "keys": ["W", "A"]},
                                      {"at": 2, "keys": [], "mouse": [0.05, -0.02]}], fps=8))
    keyboard, mouse = s.to_tensors(21)
    assert keyboard.shape == (21, 4) and mouse.shape == (21, 2) and keyboard.dtype == torch.float32
    assert keyboard[:12].tolist() == [[1, 0, 0, 0]] * 12  # W from 0 s to 1.5 s = frames 0..11 at 8 fps
    assert keyboard[12:16].tolist() == [[1, 0, 1, 0]] * 4  # W A from frame 12 (1.5 s) to 15
    assert keyboard[16:].abs().sum() == 0 and mouse[:16].abs().sum() == 0
    assert torch.equal(mouse[16:], torch.tensor([[0.05, -0.02]] * 5))


def test_camera_and_steering_keys_move_the_mouse_by_mouse_step():
    k, m = parse_script(script(timeline=[{"at": 0, "keys": ["I", "L"]}])).to_tensors(5)
    assert k.abs().sum() == 0 and torch.equal(m, torch.tensor([[0.1, 0.1]] * 5))
    _, m = parse_script(script(timeline=[{"at": 0, "keys": ["camera_l"]}], mouse_step=0.25)).to_tensors(1)
    assert m.tolist() == [[0.0, -0.25]]
    k, m = parse_script(script("gta_drive", [{"at": 0, "keys": ["w", "a"]}])).to_tensors(5)
    assert k.tolist() == [[1, 0]] * 5 and torch.equal(m, torch.tensor([[0.0, -0.1]] * 5))


def test_templerun_is_one_hot_and_no_key_is_its_nomove_column():
    s = parse_script(script("templerun", [{"at": 0, "keys": []}, {"at": 0.5, "keys": ["jump"]},
                                          {"at": 1, "keys": ["Z"]}]))
    keyboard, mouse = s.to_tensors(17)
    assert mouse is None and keyboard.shape == (17, 7)
    assert keyboard[0].tolist() == [1, 0, 0, 0, 0, 0, 0]  # Q, the model's "no move"
    assert keyboard[6].tolist() == [0, 1, 0, 0, 0, 0, 0]  # 0.5 s at 12 fps = frame 6
    assert keyboard[12].tolist() == [0, 0, 0, 1, 0, 0, 0]
    assert (keyboard.sum(1) == 1).all()


def test_the_line_format_reads_as_the_same_script_as_json():
    text = """
    # a walk, then a look right
    variant universal
    fps 16
    0    W
    1.5: W, A
    3    -   mouse 0 0.1
    """
    from_lines = parse_text(text)
    from_json = parse_text(json.dumps(script(fps=16, timeline=[
        {"at": 0, "keys": ["W"]}, {"at": 1.5, "keys": ["W", "A"]}, {"at": 3, "keys": [], "mouse": [0, 0.1]}])))
    assert from_lines == from_json
    assert parse_text(from_lines.to_text()) == from_lines
    assert parse_script(from_lines.to_dict()) == from_lines


def test_widget_values_fill_the_script_and_must_agree_with_it():
    s = parse_text("0 W\n2 S", variant="gta_drive", fps=10.0)
    assert (s.variant, s.fps, [e.frame for e in s.entries]) == ("gta_drive", 10.0, [0, 20])
    assert parse_text("variant gta_drive\n0 W", variant="gta_drive").variant == "gta_drive"
    with pytest.raises(FastARError, match="says variant 'templerun' but 'universal' was chosen"):
        parse_text("variant templerun\n0 W", variant="universal")


def test_describe_names_each_entry_and_the_entries_past_the_video():
    s = parse_script(script(timeline=[{"at": 0, "keys": ["W"]}, {"at": 1, "keys": ["L"]},
                                      {"at": 60, "keys": []}]))
    text = s.describe(pixel_frames=81)
    assert text.startswith("universal at 12 fps: 0 s (frame 0): W(forward); 1 s (frame 12): L(camera_r)")
    assert "1 later entry past the video's 81 frames unused" in text
    assert [e.at for e in s.unused(81)] == [60.0]
    k, _ = s.to_tensors(81)
    assert k[12:].abs().sum() == 0  # L moves the mouse only; W is released at 1 s


def test_tensors_come_back_as_the_shortest_script():
    s = parse_script(script(timeline=[{"at": 0, "keys": ["W", "J"]}, {"at": 0.5, "keys": ["D"]},
                                      {"at": 1, "keys": [], "mouse": [0.05, 0.3]}]))
    k, m = s.to_tensors(25)
    back = script_from_tensors(k, m, "universal")
    assert back == s and back.to_dict()["timeline"][2]["mouse"] == [0.05, 0.3]
    k, _ = parse_script(script("templerun", [{"at": 0, "keys": ["Q"]}, {"at": 1, "keys": ["C"]}])).to_tensors(21)
    assert torch.equal(script_from_tensors(k, None, "templerun").to_tensors(21)[0], k)


@pytest.mark.parametrize("data, message", [
    ([], "expected an object with variant, fps, mouse_step, timeline; got list"),
    (script(speed=2), "unknown field(s) speed; valid: variant, fps, mouse_step, timeline"),
    ({"timeline": [{"at": 0}]}, "no variant; name the model's variant (universal, gta_drive, templerun, lingbot, "
                                "demo_world)"),
    (script("minecraft"), "variant 'minecraft' is not a world model's variant; valid: universal, gta_drive"),
    (script(fps=0), "fps 0 is out of range"),
    (script(fps="12"), "fps is '12'; expected a finite number"),
    (script(mouse_step=-0.1), "mouse_step -0.1 must be more than 0"),
    (script(timeline=[]), "timeline must be a non-empty list"),
    (script(timeline=["W"]), "timeline[0]: expected an object"),
    (script(timeline=[{"keys": ["W"]}]), "timeline[0]: no \"at\""),
    (script(timeline=[{"at": 0, "key": "W"}]), "timeline[0]: unknown field(s) key; valid: at, keys, mouse"),
    (script(timeline=[{"at": -1}]), "timeline[0]: at -1 s is out of range"),
    (script(timeline=[{"at": float("nan")}]), "timeline[0]: at is nan; expected a finite number"),
    (script(timeline=[{"at": 0.5}]), "timeline[0] is at 0.5 s; the first entry must be at 0"),
    (script(timeline=[{"at": 0}, {"at": 2}, {"at": 1}]),
     "timeline[2] at 1 s does not come after timeline[1] at 2 s; list the entries in increasing time"),
    (script(timeline=[{"at": 0}, {"at": 0.01}]),
     "timeline[1] at 0.01 s starts at the same frame (0 at 12 fps) as timeline[0] at 0 s"),
    (script(timeline=[{"at": 0, "keys": "W"}]), "timeline[0] (at 0 s): keys must be a list of key names"),
    (script(timeline=[{"at": 0, "keys": ["X"]}]),
     "timeline[0] (at 0 s): unknown key 'X' for universal; valid: W (forward), S (back), A (left), D (right), "
     "I (camera_up)"),
    (script("gta_drive", [{"at": 0, "keys": ["I"]}]), "unknown key 'I' for gta_drive; valid: W (forward), S (back), "
                                                      "A (camera_l), D (camera_r)"),
    (script(timeline=[{"at": 0, "keys": ["W", "forward"]}]), "key W (forward) is named twice"),
    (script(timeline=[{"at": 0, "keys": ["W", "S"]}]), "W (forward) and S (back) are opposite; hold one of them"),
    (script(timeline=[{"at": 0, "keys": ["J", "L"]}]), "J (camera_l) and L (camera_r) are opposite"),
    (script("gta_drive", [{"at": 0, "keys": ["A", "D"]}]), "A (camera_l) and D (camera_r) are opposite"),
    (script("templerun", [{"at": 0, "keys": ["W", "A"]}]), "templerun takes one action at a time"),
    (script("templerun", [{"at": 0, "mouse": [0, 0.1]}]), "templerun has no mouse input"),
    (script(timeline=[{"at": 0, "mouse": [0.1]}]), "mouse must be [pitch, yaw]"),
    (script(timeline=[{"at": 0, "mouse": [0, "x"]}]), "mouse yaw is 'x'; expected a finite number"),
    (script(timeline=[{"at": 0, "keys": ["L"], "mouse": [0, 0.1]}]),
     "keys L already move the mouse and \"mouse\" sets it too"),
])
def test_every_bad_script_gets_one_message_naming_the_input_and_what_is_valid(data, message):
    with pytest.raises(FastARError) as e:
        parse_script(data, "run.json")
    assert str(e.value).startswith("run.json: ") and message in str(e.value)


@pytest.mark.parametrize("text, message", [
    ("", "no timeline lines"),
    ("variant universal", "no timeline lines"),
    ("variant universal\nwalk W", "line 2: the time (seconds) that starts the line: 'walk' is not a number"),
    ("variant universal\n0 W mouse 1", "line 2: write 'mouse <pitch> <yaw>'"),
    ("variant universal\nfps", "line 2: write 'fps <value>'"),
    ("variant universal\nvariant templerun\n0 W", "line 2: variant is given twice"),
    ("{\"variant\": ", "not valid JSON"),
    ("{\"variant\": \"universal\", \"timeline\": [{\"at\": 1" + "0" * 5000 + "}]}", "5001-digit integer"),
])
def test_bad_text_names_the_line(text, message):
    with pytest.raises(FastARError, match="^actions: ") as e:
        parse_text(text, "actions")
    assert message in str(e.value)


def test_bad_tensors_and_frame_counts_are_refused():
    s = parse_script(script())
    for n in (0, 6, True):
        with pytest.raises(FastARError, match="actions cover a video of 1 \\+ 4\\(T - 1\\) frames"):
            s.to_tensors(n)
    with pytest.raises(FastARError, match="keyboard has shape \\[5, 3\\]; universal takes \\[frames, 4\\]"):
        script_from_tensors(torch.zeros(5, 3), torch.zeros(5, 2), "universal")
    with pytest.raises(FastARError, match="keyboard frame 2 is \\[0.0, 0.5\\]; keys are 0 or 1"):
        script_from_tensors(torch.tensor([[0, 0]] * 2 + [[0, 0.5]] * 3), torch.zeros(5, 2), "gta_drive")
    with pytest.raises(FastARError, match="holds no key; templerun's idle is Q"):
        script_from_tensors(torch.zeros(5, 7), None, "templerun")
    with pytest.raises(FastARError, match="templerun has no mouse actions"):
        script_from_tensors(torch.zeros(5, 7), torch.zeros(5, 2), "templerun")


def test_script_files_are_read_with_their_name_in_every_message(tmp_path):
    good = tmp_path / "walk.txt"
    good.write_text("variant gta_drive\n0 W D\n")
    assert read_script_file(good).entries[0].keys == ("W", "D")
    with pytest.raises(FastARError, match="missing.json: no such file"):
        read_script_file(tmp_path / "missing.json")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (2 << 20))
    with pytest.raises(FastARError, match="big.json: 2,097,152 bytes"):
        read_script_file(big)
    binary = tmp_path / "image.png"
    binary.write_bytes(b"\x89PNG\xff\xfe")
    with pytest.raises(FastARError, match="image.png: not a text file"):
        read_script_file(binary)


# -- against the reference ---------------------------------------------------------------------------------------

def _reference_interactive_maps() -> dict:
    """The literal key maps of the reference's interactive ``get_current_action``, per mode, read from its source."""
    source = (REFERENCE / "pipeline" / "causal_inference.py").read_text()
    function = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)
                    and n.name == "get_current_action")
    constants = {n.targets[0].id: ast.literal_eval(n.value) for n in function.body
                 if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}  # CAM_VALUE
    maps = {}
    for branch in ast.walk(function):
        if isinstance(branch, ast.If) and isinstance(branch.test, ast.Compare) \
                and isinstance(branch.test.left, ast.Name) and branch.test.left.id == "mode" \
                and isinstance(branch.test.ops[0], ast.Eq):
            mode = ast.literal_eval(branch.test.comparators[0])
            found = {}
            for node in branch.body:
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                    found[node.targets[0].id] = ast.literal_eval(_with_constants(node.value, constants))
            maps.setdefault(mode, found)
    return maps


def _with_constants(node, constants: dict):
    class Inline(ast.NodeTransformer):
        def visit_Name(self, name):
            return ast.copy_location(ast.Constant(constants[name.id]), name)

    return Inline().visit(node)


@needs_reference
def test_every_interactive_key_of_the_reference_gives_its_vectors():
    maps = _reference_interactive_maps()
    assert set(maps) == set(VARIANTS)
    for variant, found in maps.items():
        spec = VARIANTS[variant]
        for letter, row in found["KEYBOARD_IDX"].items():
            keys = [] if letter == "q" and variant != "templerun" else [letter]
            k, _ = parse_script(script(variant, [{"at": 0, "keys": keys}])).to_tensors(1)
            assert k[0].tolist() == row, (variant, letter)
        for letter, move in found.get("CAMERA_VALUE_MAP", {}).items():
            keys = [] if letter in ("u", "q") else [letter]
            _, m = parse_script(script(variant, [{"at": 0, "keys": keys}])).to_tensors(1)
            assert m[0].tolist() == pytest.approx(move), (variant, letter)
        assert spec.keyboard_dim == len(next(iter(found["KEYBOARD_IDX"].values())))


@needs_reference
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_reference_benchmark_actions_become_a_script_and_back_bit_for_bit(variant):
    spec = importlib.util.spec_from_file_location("mg_reference_conditions", REFERENCE / "utils" / "conditions.py")
    conditions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conditions)
    config = json.loads((REFERENCE / "configs" / "distilled_model" / variant / "config.json").read_text())
    assert VARIANTS[variant].keyboard_dim == config["action_config"]["keyboard_dim_in"]
    assert VARIANTS[variant].has_mouse == config["action_config"]["enable_mouse"]
    bench = {"universal": conditions.Bench_actions_universal, "gta_drive": conditions.Bench_actions_gta_drive,
             "templerun": conditions.Bench_actions_templerun}[variant]
    frames = 1 + 4 * (150 - 1)  # the reference's default 150 latent frames
    random.seed(7)
    actions = bench(frames)
    keyboard = actions["keyboard_condition"].float()
    mouse = actions.get("mouse_condition")
    mouse = None if mouse is None else mouse.float()
    s = script_from_tensors(keyboard, mouse, variant)
    assert len(s.entries) > 10  # the bench changes action every 12 frames, with repeats merged
    k, m = s.to_tensors(frames)
    assert torch.equal(k, keyboard)
    assert (m is None) == (mouse is None) and (m is None or torch.equal(m, mouse))
    assert parse_text(s.to_text()) == s
