"""The Action Script node and the samplers' 'actions' input, without ComfyUI."""

from types import SimpleNamespace

import pytest
import torch

from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.rollout.action_script import ActionScript
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES
from comfyui_fastar.nodes.node_action_script import EXAMPLE

NODE = NODES["FastAR_ActionScript"]


def test_the_default_script_reads_and_its_summary_names_every_entry():
    actions, summary = NODE().build("universal", 12.0, EXAMPLE)
    assert isinstance(actions, ActionScript) and actions.variant == "universal" and actions.fps == 12.0
    assert [e.frame for e in actions.entries] == [0, 24, 42, 60]
    assert summary.startswith("universal at 12 fps: 0 s (frame 0): W(forward); 2 s (frame 24): W(forward) "
                              "L(camera_r)")
    keyboard, mouse = actions.to_tensors(81)
    assert keyboard.shape == (81, 4) and torch.equal(mouse[60:], torch.tensor([[0.0, -0.05]] * 21))


def test_widget_values_are_checked_when_the_prompt_is_queued():
    # A bad script raises (ComfyUI shows a raised message once; a returned one once per input of the check).
    assert NODE.VALIDATE_INPUTS(variant="gta_drive", fps=16.0, script="0 W D\n1 S") is True
    with pytest.raises(FastARError) as err:
        NODE.VALIDATE_INPUTS(variant="templerun", fps=12.0, script=EXAMPLE)
    assert str(err.value).startswith("Action Script: line 3 (at 2 s): unknown key 'L' for templerun; valid: Q (nomove)")
    with pytest.raises(FastARError, match="unknown key 'I' for gta_drive"):
        NODE.VALIDATE_INPUTS(variant="gta_drive", fps=12.0, script="0 I")
    assert NODE.VALIDATE_INPUTS(variant="universal", fps=12.0, script=None) is True  # linked: checked at run time
    with pytest.raises(FastARError, match="Action Script: line 1 \\(at 0 s\\): unknown key 'Q' for universal"):
        NODE().build("universal", 12.0, "0 Q")


def test_the_long_sampler_refuses_actions_for_a_model_that_takes_none(tiny_checkpoint_host):
    model, _ = NODES["FastAR_LoadARVideoModel"]().load("tiny_ar.safetensors", "default", "none", 5.0)
    actions, _ = NODE().build("universal", 12.0, "0 W")
    with pytest.raises(FastARError, match="'actions' \\(universal\\) steer a Matrix-Game 2.0 model, but this MODEL "
                                          "is a text-to-video Wan model"):
        NODES["FastAR_LongVideoSampler"]().sample(model, [[None, {}]], width=32, height=32, length=13,
                                                   actions=actions)
    with pytest.raises(FastARError, match="'actions' is a str; connect an Action Script or Camera Path node"):
        NODES["FastAR_LongVideoSampler"]().sample(model, [[None, {}]], width=32, height=32, length=13,
                                                   actions="0 W")


class RecordingVAE:
    """Wan2.1's VAE arithmetic (8x space, 4k+1 -> k+1 frames) on the frames it was given, which it keeps."""

    def encode(self, pixels):
        self.pixels = pixels
        n, h, w, _ = pixels.shape
        return torch.randn(1, 16, (n - 1) // 4 + 1, h // 8, w // 8)


def test_world_start_encodes_the_image_then_blank_frames_and_carries_the_clip_tokens(standalone_host):
    tokens = torch.randn(1, 257, 1280)
    vae = RecordingVAE()
    image = torch.rand(1, 64, 96, 3)
    cond, *size = NODES["FastAR_WorldModelStart"]().encode(SimpleNamespace(penultimate_hidden_states=tokens), vae,
                                                            image, width=96, height=64, length=13)
    assert size == [96, 64, 13] and cond[0][1]["fastar_video_size"] == (96, 64, 13, "World Model Start")
    assert torch.equal(cond[0][0], tokens)
    start = cond[0][1]["fastar_world_start"]
    assert start.shape == (1, 16, 4, 8, 12)
    assert vae.pixels.shape == (13, 64, 96, 3) and torch.equal(vae.pixels[0], image[0])
    assert (vae.pixels[1:] == 0.5).all()  # zero in the VAE's [-1, 1], as the reference pads


def test_world_start_refuses_what_is_not_a_vit_h_clip_output(standalone_host):
    node = NODES["FastAR_WorldModelStart"]()
    image = torch.rand(1, 32, 32, 3)
    with pytest.raises(FastARError, match="clip_vision_output has no penultimate_hidden_states"):
        node.encode(SimpleNamespace(), RecordingVAE(), image, 32, 32, 5)
    with pytest.raises(FastARError, match="shape \\[1, 50, 768\\]; Matrix-Game 2.0 reads \\[1, 257, 1280\\]"):
        node.encode(SimpleNamespace(penultimate_hidden_states=torch.zeros(1, 50, 768)), RecordingVAE(), image,
                    32, 32, 5)


def test_the_long_sampler_refuses_a_world_start_for_a_text_model(tiny_checkpoint_host):
    model, _ = NODES["FastAR_LoadARVideoModel"]().load("tiny_ar.safetensors", "default", "none", 5.0)
    positive = [[torch.zeros(1, 257, 1280), {"fastar_world_start": torch.zeros(1, 16, 4, 4, 4)}]]
    with pytest.raises(FastARError, match="'positive' comes from World Model Start"):
        NODES["FastAR_LongVideoSampler"]().sample(model, positive, width=32, height=32, length=13)
