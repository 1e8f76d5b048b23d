"""Sign-LSH codes (Triton vs torch, bit-exact) and the stable bucket sort."""

import pytest
import torch

from comfyui_fastar.kernels import KernelInputError, bucket_sort, lsh_codes


def integer_case(B, H, N, D, planes_cols, seed, dtype=torch.float32):
    """Small-integer inputs: every projection is exact in fp32 whatever the summation order."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (B, H, N, D), generator=gen).to(dtype)
    planes = torch.randint(-3, 4, (H, D, planes_cols), generator=gen).float()
    return x, planes


@pytest.mark.parametrize("D, bits, tables", [(64, 8, 2), (80, 16, 1), (128, 3, 3), (64, 1, 4)])
def test_triton_codes_equal_torch_codes_bit_for_bit(D, bits, tables):
    x, planes = integer_case(1, 2, 100, D, tables * bits, seed=D + bits)
    expected = lsh_codes(x, planes, bits=bits, backend="torch")
    got = lsh_codes(x, planes, bits=bits, backend="triton")
    assert got.dtype == torch.int32 and got.shape == (1, 2, 100, tables)
    assert torch.equal(got, expected)
    assert int(expected.max()) < 2**bits and int(expected.min()) >= 0


def test_triton_codes_on_bf16_input():
    x, planes = integer_case(2, 1, 70, 64, 16, seed=3, dtype=torch.bfloat16)
    assert torch.equal(lsh_codes(x, planes, bits=8, backend="triton"), lsh_codes(x, planes, bits=8, backend="torch"))


def test_codes_follow_the_definition_little_endian():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 9, 16, generator=gen)
    planes = torch.randn(2, 16, 2 * 5, generator=gen)
    codes = lsh_codes(x, planes, bits=5, backend="torch")
    for h in range(2):
        for n in range(9):
            for t in range(2):
                expected = sum(1 << i for i in range(5) if float(x[0, h, n] @ planes[h, :, t * 5 + i]) > 0)
                assert int(codes[0, h, n, t]) == expected


@pytest.mark.parametrize(
    "bits, planes_shape, message",
    [(17, (2, 16, 17), r"bits must be an int in \[1, 16\]"), (4, (2, 16, 6), "multiple of bits=4"),
     (4, (3, 16, 8), r"planes must be \[H=2, D=16")],
)
def test_bad_hashing_input_is_refused(bits, planes_shape, message):
    with pytest.raises(KernelInputError, match=message):
        lsh_codes(torch.randn(1, 2, 4, 16), torch.randn(planes_shape), bits=bits)


def test_bucket_sort_is_stable_with_consistent_offsets():
    gen = torch.Generator().manual_seed(6)
    codes = torch.randint(0, 6, (2, 3, 50), generator=gen)
    result = bucket_sort(codes, num_buckets=8)
    assert torch.equal(codes.gather(-1, result.perm), result.sorted_codes)
    assert result.offsets.shape == (2, 3, 9)
    assert (result.offsets[..., 0] == 0).all() and (result.offsets[..., -1] == 50).all()
    for b in range(2):
        for h in range(3):
            row, off = result.perm[b, h], result.offsets[b, h]
            for c in range(8):
                members = row[off[c] : off[c + 1]]
                assert (codes[b, h, members] == c).all()
                assert torch.equal(members, torch.sort(members).values)  # stable: original order kept
                assert off[c + 1] - off[c] == (codes[b, h] == c).sum()


def test_bucket_sort_rejects_too_few_buckets():
    with pytest.raises(KernelInputError, match="num_buckets must be an int >= max code"):
        bucket_sort(torch.tensor([0, 3, 1]), num_buckets=3)
