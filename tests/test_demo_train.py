"""The demo trainer: seeded runs are reproducible, leave loadable weights, and resume where they stopped."""

import pytest
import torch

from comfyui_fastar.tools.cli import main as fastar_main
from comfyui_fastar.tools.demo.bundled import load_demo_model
from comfyui_fastar.tools.demo.data import sprite_weights, training_batch
from comfyui_fastar.tools.demo.settings import ROPE_MAX_DISTANCE, TRAIN_CLIP_FRAMES, WEIGHTS_FILE
from comfyui_fastar.tools.demo.train import Trainer, TrainRecipe
from comfyui_fastar.tools.demo.train_command import train_demo


@pytest.fixture(autouse=True)
def _restore_threads():
    """``train_demo`` sets the torch thread count it is given; later tests keep theirs."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / WEIGHTS_FILE))


def test_same_seed_same_weights_and_the_file_loads_as_a_demo_model(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train_demo(a, steps=1, batch=1, threads=1, report=False, log=lambda m: None)
    # The second run goes through `fastar train-demo`, which hands every option to the trainer.
    argv = ["train-demo", "--out", str(b), "--steps", "1", "--batch", "1", "--threads", "1", "--no-report"]
    assert fastar_main(argv) == 0
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert all(v.dtype == torch.float16 for v in wa.values())
    assert any(k.startswith("text_encoder.") for k in wa) and any(k.startswith("model.diffusion_model.") for k in wa)

    demo = load_demo_model(a / WEIGHTS_FILE)
    assert demo.metadata["training"]["steps"] == 1
    assert demo.trained_span_frames == TRAIN_CLIP_FRAMES and demo.rope_max_distance == ROPE_MAX_DISTANCE
    assert (a / "train_state.pt").is_file() and (a / "loss.json").is_file()


def test_a_stopped_run_resumes_from_its_saved_step(tmp_path):
    logs = []
    train_demo(tmp_path, steps=1, batch=1, threads=1, report=False, log=logs.append)
    first = _weights(tmp_path)
    summary = train_demo(tmp_path, steps=2, batch=1, threads=1, report=False, log=logs.append)
    assert any("resumed at step 1" in m for m in logs)
    assert summary["steps"] == 2
    assert any(not torch.equal(first[k], v) for k, v in _weights(tmp_path).items())


def test_a_state_saved_before_a_recipe_field_existed_resumes_with_its_default(tmp_path):
    train_demo(tmp_path, steps=1, batch=1, threads=1, report=False, log=lambda m: None)
    path = tmp_path / "train_state.pt"
    state = torch.load(path, weights_only=True)
    del state["recipe"]["new_region_loss_weight"]
    torch.save(state, path)
    assert train_demo(tmp_path, steps=2, batch=1, threads=1, report=False, log=lambda m: None)["steps"] == 2
    state["recipe"]["lr"] = 1.0  # a field that was there and differs still refuses the resume
    torch.save(state, path)
    with pytest.raises(ValueError, match="another seed or recipe"):
        train_demo(tmp_path, steps=3, batch=1, threads=1, report=False, log=lambda m: None)


def test_learning_rate_warms_up_then_decays():
    r = TrainRecipe(steps=1000, warmup_steps=100)
    assert r.lr_at(0) < r.lr_at(50) < r.lr_at(99) <= r.lr
    assert r.lr_at(500) < r.lr_at(150)
    assert r.lr_at(999) == pytest.approx(r.lr * r.min_lr_ratio, rel=0.01)


def test_a_new_phase_continues_from_another_runs_state(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    train_demo(first, steps=1, batch=1, threads=1, report=False, log=lambda m: None)
    train_demo(second, steps=1, batch=1, threads=1, report=False, log=lambda m: None,
               init_from=first / "train_state.pt")
    training = load_demo_model(second / WEIGHTS_FILE).metadata["training"]
    assert training["total_steps"] == 2 and len(training["earlier_phases"]) == 1
    assert training["earlier_phases"][0]["steps"] == 1


def test_a_run_can_start_from_a_weights_file_with_a_smaller_vocabulary(tmp_path, monkeypatch):
    from comfyui_fastar.tools.demo import train as train_module

    first, second = tmp_path / "first", tmp_path / "second"
    full = train_module.default_vocabulary()
    monkeypatch.setattr(train_module, "default_vocabulary", lambda: [w for w in full if w != "while"])
    train_demo(first, steps=1, batch=1, threads=1, report=False, log=lambda m: None)
    monkeypatch.undo()
    train_demo(second, steps=1, batch=1, threads=1, report=False, log=lambda m: None,
               init_from=first / WEIGHTS_FILE)
    a, b = load_demo_model(first / WEIGHTS_FILE), load_demo_model(second / WEIGHTS_FILE)
    assert "while" in b.tokenizer.vocabulary and "while" not in a.tokenizer.vocabulary
    training = b.metadata["training"]
    assert training["total_steps"] == 2 and training["earlier_phases"][0]["weights_file"] == WEIGHTS_FILE
    word = "circle"  # a word both know starts the second run from the first run's embedding (one step away)
    ea = a.text_encoder.token.weight[a.tokenizer.ids[word]]
    eb = b.text_encoder.token.weight[b.tokenizer.ids[word]]
    assert (ea - eb).abs().max() < 0.05


def test_rollout_context_is_the_ema_weights_own_sampled_continuation_of_the_first_chunk(tmp_path):
    trainer = Trainer(tmp_path, TrainRecipe(batch=2, clip_frames=9, p_rollout_context=1.0), seed=0, log=lambda m: None)
    batch = training_batch(seed=0, step=0, batch=2, frames=9, size=24)
    g = torch.Generator().manual_seed(0)
    context = trainer._rollout_context(batch.video.clone(), batch.video, batch.prompts, g)
    assert torch.equal(context[:, :, :3], batch.video[:, :, :3])  # the rendered start stays
    assert not torch.allclose(context[:, :, 3:], batch.video[:, :, 3:])  # the rest is the model's own
    assert torch.isfinite(context).all()
    again = trainer._rollout_context(batch.video.clone(), batch.video, batch.prompts, torch.Generator().manual_seed(0))
    assert torch.equal(context, again)
    trainer.train_step()  # a whole step with rollout contexts runs


def test_sprite_weights_cover_sprites_and_their_trails_only():
    batch = training_batch(seed=0, step=0, batch=2, frames=6, size=24)
    w = sprite_weights(batch, 4.0)
    assert w.shape == (2, 1, 6, 24, 24)
    assert set(w.unique().tolist()) == {1.0, 4.0}
    on_sprite = (batch.video - batch.backgrounds[:, :, None]).abs().sum(1, keepdim=True) > 0.05
    assert (w[on_sprite] == 4).all()
    assert (w == 1).float().mean() > 0.5  # most of the frame is background


def test_a_wall_time_budget_that_runs_out_first_drives_the_decay():
    r = TrainRecipe(steps=1000, warmup_steps=100)
    assert r.lr_at(200, time_fraction=0.5) < r.lr_at(200)
    assert r.lr_at(200, time_fraction=1.0) == pytest.approx(r.lr * r.min_lr_ratio)
    assert r.lr_at(50, time_fraction=0.9) == r.lr_at(50)  # warm-up is never skipped
