"""Input checks shared by the public ops: one clear error per bad input, naming it and what would be valid."""

import math

import torch

from .errors import KernelInputError

ATTENTION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_CODE = 2**16  # codes are at most 16 bits, so Hamming distances fit a 16-bit popcount


def check_qkv(q, k, v) -> tuple[int, int, int, int, int]:
    """Check q [B,H,Nq,D], k and v [B,H,Nk,D]; returns (B, H, Nq, Nk, D)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise KernelInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise KernelInputError(f"{name} must be 4-D [B, H, N, D], got shape {tuple(t.shape)}")
        if t.dtype not in ATTENTION_DTYPES:
            raise KernelInputError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise KernelInputError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise KernelInputError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, Nq, D = q.shape
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != D:
        raise KernelInputError(f"k must be [B={B}, H={H}, Nk, D={D}] to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise KernelInputError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if D == 0:
        raise KernelInputError("the head dim D of q, k and v must be at least 1, got 0")
    return B, H, Nq, k.shape[2], D


def check_bias(bias, B: int, H: int, Nk: int, device: torch.device, check_values: bool = True) -> torch.Tensor | None:
    """Check a per-key logit bias: float32, broadcastable to [B, H, Nk], entries finite or -inf (looked at only
    with ``check_values``: callers whose biases are so by construction skip the host read)."""
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor):
        raise KernelInputError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    valid = f"[{B}, {H}, {Nk}], [1, {H}, {Nk}], [{B}, 1, {Nk}] or [1, 1, {Nk}]"
    if bias.dim() != 3 or bias.shape[0] not in (1, B) or bias.shape[1] not in (1, H) or bias.shape[2] != Nk:
        raise KernelInputError(f"bias must have shape {valid} (per-key logit bias), got {tuple(bias.shape)}")
    if bias.dtype != torch.float32:
        raise KernelInputError(f"bias must be float32 (log counts lose precision in half types), got {bias.dtype}")
    if bias.device != device:
        raise KernelInputError(f"bias must be on the attention device {device}, got {bias.device}")
    # NaN and +inf are the values that break softmax. Looking costs a host sync, so CUDA tensors (the hot path,
    # possibly inside graph capture) are not inspected; CPU ones are.
    if check_values and bias.device.type == "cpu" and bias.numel() > 0 and not torch.compiler.is_compiling():
        if bool((torch.isnan(bias) | (bias == math.inf)).any()):
            raise KernelInputError("bias entries must be finite or -inf (an empty slot); found NaN or +inf")
    return bias


def resolve_scale(scale, D: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, torch.Tensor):
        raise KernelInputError("scale must be a Python float, not a tensor")
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise KernelInputError(f"scale must be a positive finite float (default 1/sqrt(D)), got {scale}")
    return scale


def check_codes(codes, name: str, shape_prefix: tuple[int, ...] | None = None) -> torch.Tensor:
    """Check integer bucket codes [..., N] in [0, 2**16); returns them as int64."""
    if not isinstance(codes, torch.Tensor):
        raise KernelInputError(f"{name} must be an integer torch.Tensor, got {type(codes).__name__}")
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise KernelInputError(f"{name} must hold integer codes (int32 or int64), got {codes.dtype}")
    if shape_prefix is not None and tuple(codes.shape[: len(shape_prefix)]) != shape_prefix:
        raise KernelInputError(f"{name} must have shape {list(shape_prefix)} + [N], got {tuple(codes.shape)}")
    if codes.numel() > 0:
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= MAX_CODE:
            raise KernelInputError(f"{name} must lie in [0, {MAX_CODE}) (at most 16-bit codes), got [{low}, {high}]")
    return codes.long()
