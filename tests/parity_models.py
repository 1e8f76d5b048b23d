"""The tiny models the reference parity tests run on both sides: shapes, seeds, weights, and the geometry
rewrites that fit each reference's 1.3B constants to them.

Two cases, each a model shape with its own seed, so a constant or an index that only happens to agree at one
shape shows at the other. The weights are shaped so that what a parity test checks shows in the output:

- self-attention from broad to focused heads (``HEAD_GAINS``; measured over 84 to 126 keys: a query's largest
  weight averages 6 % in the broadest head, 31 to 43 % in the sharpest, and 11 to 74 % of the keys carry the
  attention), never near one-hot: with one-hot attention a wrong frame in a window, or an empty cache slot read
  as a zero key, barely moves the output;
- self- and cross-attention that carry weight in the residual stream (``SELF_VALUE_GAIN``, ``CROSS_*``): with
  the random init both add so little that an empty slot read in Rolling Forcing's first clean passes moves the
  video by 1e-5 (under the tolerance) and a prompt switch by 0.1 %; with them, 6e-4 and about 20 %.

Each checkpoint holds two sets of weights, ``generator`` and ``generator_ema`` (the same model, perturbed by 1 %),
as the training checkpoints do; it is saved under each family's file name, so the pack's loader picks the
entry by its own rule and a test that loads the wrong one fails.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field

import reference_harness as rh
import torch

from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan

# The gain of ``norm_q`` and ``norm_k`` per head (logits scale as its square): heads from broad to focused.
HEAD_GAINS = {2: (1.0, 1.6), 3: (0.9, 1.3, 1.8)}
# Self-attention's value and output projections scaled up: what a query reads reaches the output.
SELF_VALUE_GAIN = 3.0
# The prompt as much say as it has in a trained model: with the random init, 16 tokens among 512 (the rest zero
# padding, as the references pad) move the video by 0.1 %, and a prompt switch, or a recache that is not done,
# hides under the tolerance. Sharper cross-attention and a stronger value path make it about 20 %.
PROMPT_TOKENS = 16
CROSS_QK_GAIN = 2.0
CROSS_VALUE_GAIN = 4.0  # on both its value and its output projections
EMA_PERTURBATION = 0.01
# File names as each family releases them, so the loader's choice of entry is the one under test.
FAMILY_FILES = {"self_forcing": "self_forcing_tiny.pt", "causal_forcing": "causal_forcing_tiny.pt",
                "rolling_forcing": "rolling_forcing_tiny.pt", "longlive": "longlive_tiny.pt",
                "causvid": "causvid_tiny.pt", "krea_realtime": "krea_tiny.pt"}
# What each reference's inference loads (LongLive: use_ema false; CausVid: ['generator']; the rest --use_ema).
REFERENCE_ENTRY = {"self_forcing": "generator_ema", "causal_forcing": "generator_ema",
                   "rolling_forcing": "generator_ema", "longlive": "generator", "causvid": "generator",
                   "krea_realtime": "generator_ema"}


@dataclass(frozen=True)
class Shape:
    name: str
    cfg: WanConfig
    latent_hw: tuple
    seed: int

    @property
    def tpf(self) -> int:  # tokens per latent frame
        return (self.latent_hw[0] // 2) * (self.latent_hw[1] // 2)

    @property
    def kwargs(self) -> dict:
        c = self.cfg
        return dict(model_type="t2v", patch_size=(1, 2, 2), text_len=c.text_len, in_dim=16, dim=c.dim,
                    ffn_dim=c.ffn_dim, freq_dim=c.freq_dim, text_dim=c.text_dim, out_dim=16, num_heads=c.num_heads,
                    num_layers=c.num_layers)


SHAPES = (
    Shape("dim64-2heads-2layers", WanConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, text_dim=32, freq_dim=32),
          (4, 6), seed=0),
    Shape("dim72-3heads-3layers", WanConfig(dim=72, num_heads=3, num_layers=3, ffn_dim=144, text_dim=24, freq_dim=32),
          (4, 4), seed=1),
)


@dataclass
class Case:
    shape: Shape
    files: dict = field(default_factory=dict)  # reference name -> checkpoint path

    @property
    def cfg(self) -> WanConfig:
        return self.shape.cfg

    def prompt(self, salt=1):
        g = torch.Generator().manual_seed(1000 * self.shape.seed + salt)
        return torch.randn(1, PROMPT_TOKENS, self.cfg.text_dim, generator=g)

    def noise(self, frames, salt=2):
        g = torch.Generator().manual_seed(1000 * self.shape.seed + salt)
        return torch.randn(1, 16, frames, *self.shape.latent_hw, generator=g)


def build_case(shape: Shape, folder) -> Case:
    model = random_wan(shape.cfg, seed=shape.seed)
    gains = HEAD_GAINS[shape.cfg.num_heads]
    with torch.no_grad():
        per_channel = torch.tensor(gains).repeat_interleave(shape.cfg.head_dim)
        for blk in model.blocks:
            blk.self_attn.norm_q.weight.copy_(per_channel)
            blk.self_attn.norm_k.weight.copy_(per_channel)
            blk.self_attn.v.weight.mul_(SELF_VALUE_GAIN)
            blk.self_attn.o.weight.mul_(SELF_VALUE_GAIN)
            blk.cross_attn.norm_q.weight.fill_(CROSS_QK_GAIN)
            blk.cross_attn.norm_k.weight.fill_(CROSS_QK_GAIN)
            blk.cross_attn.v.weight.mul_(CROSS_VALUE_GAIN)
            blk.cross_attn.o.weight.mul_(CROSS_VALUE_GAIN)
    plain = {"model." + k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(shape.seed + 77)
    ema = {k: v * (1 + EMA_PERTURBATION * torch.randn(v.shape, generator=g)) for k, v in plain.items()}
    first = folder / "tiny_ar.pt"
    # A config entry, as a .pt of a size no released family has must carry (the references never read it).
    torch.save({"generator": plain, "generator_ema": ema, "fastar_config": shape.cfg.to_dict()}, first)
    case = Case(shape)
    for name, file in FAMILY_FILES.items():
        case.files[name] = folder / file
        shutil.copyfile(first, case.files[name])
    return case


def load_reference_weights(pipeline_generator, case: Case, name: str) -> None:
    """As the reference's inference.py: ``generator.load_state_dict(torch.load(ckpt)[entry])``."""
    state = torch.load(case.files[name], map_location="cpu", weights_only=True)
    missing, unexpected = pipeline_generator.load_state_dict(state[REFERENCE_ENTRY[name]], strict=True)
    assert not missing and not unexpected


# -- geometry: the 1.3B-at-480p constants of each reference, rewritten to the case's model ----------------------
SF_ATTENTION = "self.max_attention_size = 32760 if local_attn_size == -1 else local_attn_size * 1560"


def geometry(shape: Shape, pipeline_module, *, blocks=True, cache="kv_cache_size = 32760", cache_new=None, heads=4,
             model_module="wan.modules.causal_model", attention_line=None):
    tpf, cfg = shape.tpf, shape.cfg
    rewrites = [rh.Rewrite(pipeline_module, "self.frame_seq_length = 1560", f"self.frame_seq_length = {tpf}")]
    if blocks:
        rewrites.append(rh.Rewrite(pipeline_module, "self.num_transformer_blocks = 30",
                                   f"self.num_transformer_blocks = {cfg.num_layers}"))
    if cache:
        rewrites.append(rh.Rewrite(pipeline_module, cache, cache_new or cache.replace("32760", str(21 * tpf))))
    if heads:
        rewrites.append(rh.Rewrite(pipeline_module, "12, 128]", f"{cfg.num_heads}, {cfg.head_dim}]", heads))
    if attention_line:
        rewrites.append(rh.Rewrite(model_module, attention_line,
                                   attention_line.replace("32760", str(21 * tpf)).replace("1560", str(tpf))))
    return rewrites


def reference_geometry(name: str, shape: Shape) -> list:
    tpf = shape.tpf
    if name in ("self_forcing", "causal_forcing"):
        return geometry(shape, "pipeline.causal_inference", attention_line=SF_ATTENTION)
    if name == "rolling_forcing":
        return geometry(shape, "pipeline.rolling_forcing_inference", cache="kv_cache_size = 1560 * 24",
                        cache_new=f"kv_cache_size = {tpf} * 24") + [
            rh.Rewrite("wan.modules.causal_model", "self.frame_length = 1560", f"self.frame_length = {tpf}")]
    if name == "longlive":
        return geometry(shape, "pipeline.causal_inference", heads=4, cache="                kv_cache_size = 32760") + [
            rh.Rewrite("pipeline.causal_inference", "target_size = 32760", f"target_size = {21 * tpf}"),
            rh.Rewrite("wan.modules.causal_model",
                       "self.max_attention_size = 32760 if max_local == -1 else max_local * 1560",
                       f"self.max_attention_size = {21 * tpf} if max_local == -1 else max_local * {tpf}")]
    if name == "causvid":
        module = "causvid.models.wan.causal_inference"
        return geometry(shape, module, heads=4, cache=None) + [
            rh.Rewrite(module, "[batch_size, 32760, ", f"[batch_size, {21 * tpf}, ", 2),
            rh.Rewrite(module, 'device="cuda"', 'device="cpu"')]
    raise KeyError(name)
