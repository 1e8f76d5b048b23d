"""The procedural world: deterministic, sprites bounce inside the frame, background static and exposed."""

import pytest
import torch

from comfyui_fastar.tools.demo.world import PALETTE, SHAPES, make_scene, render_clip

pytestmark = pytest.mark.usefixtures("one_thread")


def test_same_seed_same_video_and_different_seeds_differ():
    a, _ = render_clip(5, 12)
    b, _ = render_clip(5, 12)
    c, _ = render_clip(6, 12)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.shape == (12, 3, 24, 24) and a.dtype == torch.float32
    assert a.min() >= -1 and a.max() <= 1


def test_rendering_a_later_range_matches_rendering_from_the_start():
    scene = make_scene(3)
    assert torch.allclose(scene.render(30)[20:], scene.render(10, start=20), atol=1e-6)


def test_sprites_stay_inside_the_frame_and_bounce_off_its_edges():
    t = torch.arange(600, dtype=torch.float64)
    bounced = 0
    for seed in range(20):
        scene = make_scene(seed)
        assert 1 <= len(scene.sprites) <= 3
        assert len(set(scene.colours)) == len(scene.colours)  # one colour per sprite
        for sp in scene.sprites:
            assert sp.shape in SHAPES and sp.colour in PALETTE
            x, y = sp.centre(t, scene.size)
            assert x.min() >= sp.radius - 1e-9 and x.max() <= scene.size - sp.radius + 1e-9
            assert y.min() >= sp.radius - 1e-9 and y.max() <= scene.size - sp.radius + 1e-9
            vx = torch.sign(x[1:] - x[:-1])
            flips = int((vx[1:] * vx[:-1] < 0).sum())
            bounced += flips > 0
            # speed is preserved through a bounce: every step moves by |v| along each axis (up to the fold)
            assert torch.allclose((x[1:] - x[:-1]).abs().max(), torch.tensor(abs(sp.vx), dtype=torch.float64))
    assert bounced >= 50  # nearly every sprite hits a side wall within 600 frames


def test_background_is_static_and_shows_wherever_no_sprite_is():
    scene = make_scene(11)
    video = scene.render(40)
    background = scene.background()
    untouched = (video == background[None]).all(dim=1)  # [T, H, W]
    assert untouched.float().mean() > 0.6
    assert (~untouched).any(dim=0).any()  # sprites do cover something
    assert background.std() > 0.02  # textured, not flat


def test_sprites_are_drawn_in_their_palette_colour():
    scene = make_scene(2)
    frame = scene.render(1)[0]
    for sp in scene.sprites:
        colour = torch.tensor(PALETTE[sp.colour]) * 2 - 1
        cx, cy = (int(v) for v in sp.centre(torch.tensor([0.0]), scene.size))
        centre_pixel = frame[:, cy, cx]
        others = [s for s in scene.sprites if s is not sp]
        if all(((o.x0 - sp.x0) ** 2 + (o.y0 - sp.y0) ** 2) ** 0.5 > o.radius + sp.radius for o in others):
            assert torch.allclose(centre_pixel, colour, atol=1e-5)


def test_prompts_name_every_sprite_and_long_prompts_add_filler():
    for seed in range(10):
        scene = make_scene(seed)
        short, long = scene.prompt(), scene.prompt(long=True)
        for sp in scene.sprites:
            assert f"{sp.colour} {sp.shape}" in short
            assert f"{sp.colour} {sp.shape}" in long
        assert len(long.split()) > len(short.split()) + 8


def test_sprite_areas_match_their_rendered_coverage():
    scene = make_scene(7, num_sprites=1)
    (colour, area), = scene.sprite_areas().items()
    covered = (scene.render(1)[0] != scene.background()).any(dim=0).sum()
    assert abs(area - float(covered)) <= 0.5 * covered ** 0.5 * 4  # only the anti-aliased rim differs
