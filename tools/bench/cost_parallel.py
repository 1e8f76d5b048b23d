"""The cost model over N GPUs: what sequence parallelism (Ulysses, heads sharded inside self-attention) buys.

Per rank and chunk, from the shapes alone (``flops.py`` counts the FLOPs):

- compute: every matmul splits evenly, per-token parts by tokens and attention by heads: ``1 / N`` of the chunk;
- memory: the weights are replicated on every rank; the KV cache of a rank holds its ``H / N`` heads;
- traffic: per layer and forward, the rank's queries, keys and values go out to the other ranks
  (``3 n d / N`` elements, ``(N - 1) / N`` of them leave) and the attention output comes back (``n d / N``); the
  clean pass skips the last layer's output; every forward that returns an output gathers the tokens before
  the head (``n d / N`` to each of the ``N - 1`` others). This is what ``fastar_core/forward/parallel.py`` sends, and a
  test holds its byte counter to this count. AnnCA's per-frame keep mask (a few bytes per prompt token) is left
  out.

Times at assumed rates (bf16 matmuls at ``TFLOPS``, all-to-all at ``LINK_GBPS`` per GPU) are an orientation until
a multi-GPU run measures them; nothing here is measured.
"""

from __future__ import annotations

from .flops import WAN_1_3B, WAN_14B, CacheCost, ModelShape, rollout_flops

TFLOPS = 400.0  # sustained bf16 matmul rate per GPU assumed for the time columns (an H100/H200-class card)
LINK_GBPS = 300.0  # all-to-all bandwidth per GPU assumed (NVLink-class; PCIe cards get a tenth of it)
BYTES = 2  # bf16 activations, weights and cache


def parameters(s: ModelShape) -> int:
    """Matmul weights: self- and cross-attention q, k, v, o and the FFN, per layer."""
    return s.layers * (8 * s.dim * s.dim + 2 * s.dim * s.ffn)


def chunk_traffic_bytes(s: ModelShape, n_tokens: int, ranks: int, clean_pass: bool, bytes_per: int = BYTES) -> int:
    """Bytes one rank sends for one chunk (its denoising forwards, plus the clean pass when there is one)."""
    if ranks == 1:
        return 0
    local = n_tokens // ranks * s.dim  # elements of one [tokens, dim] tensor on a rank
    leaves = local * (ranks - 1) // ranks  # the share of it that goes to other ranks in an all-to-all
    step = s.layers * 4 * leaves + local * (ranks - 1)  # q, k, v out and y back per layer; the gather
    clean = s.layers * 4 * leaves - leaves if clean_pass else 0  # no output for the last layer, no gather
    return (s.steps * step + clean) * bytes_per


def kv_cache_bytes(s: ModelShape, frames: int, ranks: int) -> int:
    return s.layers * 2 * frames * s.tokens_per_frame * s.dim * BYTES // ranks


def parallel_rows(s: ModelShape, video_frames: int, capacity_frames: int, ranks=(1, 2, 4, 8)) -> list[dict]:
    latent = (video_frames - 1) // 4 + 1
    n = s.frames_per_block * s.tokens_per_frame
    dense = rollout_flops(s, latent)
    bounded = rollout_flops(s, latent, CacheCost.bounded(capacity_frames, tempcache=True))
    chunk_flops = bounded["per_chunk"][-2]  # a late chunk with a full cache (the last one has no clean pass)
    rows = []
    for r in ranks:
        if s.heads % r or s.tokens_per_frame % r:
            rows.append({"ranks": r, "fits": False,
                         "why": f"{s.heads} heads or {s.tokens_per_frame} tokens per frame do not split over {r}"})
            continue
        traffic = chunk_traffic_bytes(s, n, r, clean_pass=True)
        compute_s = chunk_flops / r / (TFLOPS * 1e12)
        link_s = traffic / (LINK_GBPS * 1e9)
        rows.append({
            "ranks": r, "fits": True,
            "chunk_tflop_per_rank": round(chunk_flops / r / 1e12, 3),
            "weights_gib_per_rank": round(parameters(s) * BYTES / 2**30, 2),
            "kv_gib_per_rank_dense_global": round(kv_cache_bytes(s, latent, r) / 2**30, 2),
            f"kv_gib_per_rank_tempcache_{capacity_frames}": round(kv_cache_bytes(s, capacity_frames, r) / 2**30, 3),
            "all_to_all_gib_per_chunk_per_rank": round(traffic / 2**30, 3),
            "compute_ms_per_chunk_at_assumed_rate": round(compute_s * 1e3, 1),
            "link_ms_per_chunk_at_assumed_rate": round(link_s * 1e3, 1),
            # one GPU's chunk time over N's, the all-to-all not overlapped with compute
            "speedup_at_assumed_rate": round(compute_s * r / (compute_s + link_s), 2),
            "dense_global_tflop_total": round(dense["total"] / 1e12, 1),
        })
    return rows


# Wan2.2-TI2V-5B at 704x1280: 44x80 latent (its VAE compresses 16x), 2x2 patches = 880 tokens per latent frame;
# LongLive 2.0's chunks of 8 frames, 4 steps.
WAN_5B = ModelShape("Wan2.2-TI2V-5B 704x1280", dim=3072, heads=24, layers=30, ffn=14336, tokens_per_frame=880,
                    text_tokens=512, frames_per_block=8, steps=4)


def parallel_report(video_frames: int = 3001, capacity_frames: int = 21) -> dict:
    shapes = (WAN_1_3B, WAN_5B, WAN_14B)
    return {
        "video_frames": video_frames, "capacity_frames": capacity_frames,
        "assumed": {"tflops_per_gpu": TFLOPS, "all_to_all_gbps_per_gpu": LINK_GBPS, "bytes_per_element": BYTES},
        "models": {s.name: {"shape": s.to_dict(), "rows": parallel_rows(s, video_frames, capacity_frames)}
                   for s in shapes},
    }


def print_parallel(report: dict) -> None:
    c = report["capacity_frames"]
    a = report["assumed"]
    print(f"\nsequence parallelism (Ulysses) at {report['video_frames']} video frames, per rank, a late chunk with a "
          f"{c}-frame TempCache; times at an assumed {a['tflops_per_gpu']:.0f} TFLOP/s and "
          f"{a['all_to_all_gbps_per_gpu']:.0f} GB/s per GPU (not measured)")
    for name, m in report["models"].items():
        print(f"\n{name}")
        print(f"{'GPUs':>4s} {'TFLOP/chunk':>11s} {'weights GiB':>11s} {'KV GiB dense':>12s} {'KV GiB temp':>11s} "
              f"{'a2a GiB/chunk':>13s} {'compute ms':>10s} {'link ms':>8s} {'speedup':>7s}")
        for r in m["rows"]:
            if not r["fits"]:
                print(f"{r['ranks']:4d}  n/a: {r['why']}")
                continue
            print(f"{r['ranks']:4d} {r['chunk_tflop_per_rank']:11.3f} {r['weights_gib_per_rank']:11.2f} "
                  f"{r['kv_gib_per_rank_dense_global']:12.2f} {r[f'kv_gib_per_rank_tempcache_{c}']:11.3f} "
                  f"{r['all_to_all_gib_per_chunk_per_rank']:13.3f} {r['compute_ms_per_chunk_at_assumed_rate']:10.1f} "
                  f"{r['link_ms_per_chunk_at_assumed_rate']:8.1f} {r['speedup_at_assumed_rate']:7.2f}")
