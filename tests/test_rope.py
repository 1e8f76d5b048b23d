"""RoPE's CPU path (pairs as complex numbers) gives the elementwise formula's values bit for bit."""

import pytest
import torch

from comfyui_fastar.fastar_core.model.rope import apply_rope, rope_cos_sin


def elementwise(x, cos, sin):
    """The rotation written out: (x0 cos - x1 sin, x0 sin + x1 cos) per interleaved pair, in fp32."""
    pairs = x.float().reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).reshape(x.shape).to(x.dtype)


@pytest.mark.parametrize("head_dim", [12, 16, 128])  # 12: pairs that do not fill a vector take the formula itself
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_rope_equals_the_elementwise_formula_bit_for_bit(head_dim, dtype):
    g = torch.Generator().manual_seed(head_dim)
    L, H = 333, 2
    pos = torch.stack([torch.randint(-5, 40, (H, L), generator=g), torch.randint(0, 30, (H, L), generator=g),
                       torch.randint(0, 52, (H, L), generator=g)], -1)  # per-head positions, as TempCache's view
    cos, sin = rope_cos_sin(pos, head_dim)
    x = (30 * torch.randn(2, L, H, head_dim, generator=g)).to(dtype).transpose(1, 2)  # a strided layout
    out = apply_rope(x, cos, sin)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, elementwise(x, cos, sin))
    assert not torch.equal(out, x)  # control: positions other than 0 rotate
    # The inverse rotation brings the keys back (what TempCache's rotated storage relies on).
    back = apply_rope(apply_rope(x.float(), cos, sin), cos, -sin)
    torch.testing.assert_close(back, x.float(), rtol=1e-5, atol=1e-4)
