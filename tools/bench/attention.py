"""``fastar bench attention``: attention alone at Wan-1.3B shapes, self-attention as the cache grows.

One 3-frame chunk of queries (1,560 tokens per latent frame, head_dim 128; 2 heads on a CPU, 12 on CUDA)
against a cache of F frames, for F growing. Paths: dense over the whole cache (the unbounded baseline),
TempCache (capped at 21 frames, log-count bias), AnnSA (bucketed sparse over the whole cache) and both.
Keys and queries come from a clustered synthetic distribution, so buckets mean something; AnnSA's output
error and recall are measured against dense on the same keys. Cross-attention (AnnCA) is timed on the same
queries against a padded 512-token prompt (``cross_attention.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ...fastar_core.fastar.ann import LSHMatcher
from ...fastar_core.fastar.metrics import attention_recall, dense_probabilities, relative_error, sample_queries
from ...kernels import attention, build_sparse_layout, sparse_attention
from .cross_attention import cross_attention_rows
from .report import line_plots, machine, write_json

TOKENS_PER_FRAME = 1560
CHUNK_FRAMES = 3
CAPACITY_FRAMES = 21
BITS = 6


def clustered(n_tokens, heads, centers, g, noise=0.35, dtype=torch.float32, device="cpu"):
    pick = torch.randint(0, centers.shape[1], (heads, n_tokens), generator=g)
    x = centers.gather(1, pick[..., None].expand(-1, -1, centers.shape[-1]))
    x = x + noise * torch.randn(heads, n_tokens, centers.shape[-1], generator=g)
    return x[None].to(device=device, dtype=dtype)


def _time(repeats, fn, *args, **kwargs):
    return _time_in_rounds(repeats, {"only": (fn, args, kwargs)})["only"]


def _time_in_rounds(repeats, calls: dict) -> dict:
    """Median seconds of each call (name -> (fn, args, kwargs)), all of them run once per round in an order that
    rotates every round, so load from other processes falls on every path alike."""
    def once(fn, args, kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t

    names = list(calls)
    for name in names:  # warm-up
        once(*calls[name])
    times: dict = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(once(*calls[name]))
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def run_attention_bench(out_dir, cache_frames=(3, 12, 21, 42), heads=None, repeats=5, seed=0, device=None) -> dict:
    out_dir = Path(out_dir)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    heads = heads or (12 if device.type == "cuda" else 2)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(seed)
    D = 128
    centers = torch.randn(heads, 64, D, generator=g)
    nq = CHUNK_FRAMES * TOKENS_PER_FRAME
    q = clustered(nq, heads, centers, g, dtype=dtype, device=device)
    cur_k = clustered(nq, heads, centers, g, dtype=dtype, device=device)
    cur_v = torch.randn(1, heads, nq, D, generator=g).to(device, dtype)
    hasher = LSHMatcher(heads, D, BITS, 1, seed=seed + 1, multiprobe=True, device=device)
    rows = []
    for frames in cache_frames:
        n_cache = frames * TOKENS_PER_FRAME
        k = torch.cat([clustered(n_cache, heads, centers, g, dtype=dtype, device=device), cur_k], dim=2)
        v = torch.cat([torch.randn(1, heads, n_cache, D, generator=g).to(device, dtype), cur_v], dim=2)
        capped = min(frames, CAPACITY_FRAMES) * TOKENS_PER_FRAME
        kc = torch.cat([k[:, :, :capped], cur_k], dim=2)
        vc = torch.cat([v[:, :, :capped], cur_v], dim=2)
        counts = torch.randint(1, 4, (capped,), generator=g).float()
        bias_c = torch.cat([counts.log(), torch.zeros(nq)]).to(device)[None, None]
        # Sparse layouts: the current chunk (placed first) stays dense, the cache is bucketed.
        order = torch.cat([torch.arange(k.shape[2] - nq, k.shape[2]), torch.arange(k.shape[2] - nq)]).to(device)
        ks, vs = k[:, :, order], v[:, :, order]
        q_codes = hasher.codes(q)[..., 0]
        layout = build_sparse_layout(q_codes, hasher.codes(ks)[..., 0], n_dense=nq, radius=1)
        order_c = torch.cat([torch.arange(capped, capped + nq), torch.arange(capped)]).to(device)
        kcs, vcs, bcs = kc[:, :, order_c], vc[:, :, order_c], bias_c[..., order_c]
        layout_c = build_sparse_layout(q_codes, hasher.codes(kcs)[..., 0], n_dense=nq, radius=1)

        t = _time_in_rounds(repeats, {"dense": (attention, (q, k, v), {}),
                                      "tempcache": (attention, (q, kc, vc, bias_c), {}),
                                      "annsa": (sparse_attention, (q, ks, vs, layout), {}),
                                      "both": (sparse_attention, (q, kcs, vcs, layout_c, bcs), {})})
        t_dense, t_temp, t_sparse, t_both = t["dense"], t["tempcache"], t["annsa"], t["both"]
        k_codes = hasher.codes(ks)[..., 0]
        t_plan = _time(1, build_sparse_layout, q_codes, k_codes, n_dense=nq, radius=1)

        idx = sample_queries(nq, 256, seed, device)
        dense_out = attention(q[:, :, idx], ks, vs)
        sparse_out = sparse_attention(q, ks, vs, layout)[:, :, idx]
        probs = dense_probabilities(q[:, :, idx], ks)
        q_code = q_codes[:, :, idx]
        k_code = layout.k_codes_sorted.new_empty(layout.k_codes_sorted.shape).scatter_(
            2, layout.k_perm, layout.k_codes_sorted)
        x = q_code[..., :, None] ^ k_code[..., None, :]
        visible = (x & (x - 1)) == 0
        visible[..., :nq] = True
        rows.append({
            "cache_frames": frames, "keys": k.shape[2], "queries": nq,
            "seconds": {"dense": t_dense, "tempcache": t_temp, "annsa": t_sparse, "tempcache+annsa": t_both,
                        "annsa_plan": t_plan},
            "speedup_vs_dense": {"tempcache": t_dense / t_temp, "annsa": t_dense / t_sparse,
                                 "tempcache+annsa": t_dense / t_both},
            "annsa_density": layout.density(), "tempcache+annsa_density": layout_c.density(),
            "annsa_recall": attention_recall(probs, visible.float()),
            "annsa_output_error": relative_error(sparse_out, dense_out),
        })
        print(f"cache {frames:3d} frames: dense {t_dense * 1000:8.1f} ms, tempcache {t_temp * 1000:8.1f} ms, "
              f"annsa {t_sparse * 1000:8.1f} ms (density {layout.density():.2f}), both {t_both * 1000:8.1f} ms")
    cross = cross_attention_rows(q, TOKENS_PER_FRAME, lambda fn, *a: _time(repeats, fn, *a), seed=seed)
    report = {"benchmark": "attention", "device": str(device), "dtype": str(dtype), "heads": heads, "head_dim": D,
              "tokens_per_frame": TOKENS_PER_FRAME, "chunk_frames": CHUNK_FRAMES, "lsh_bits": BITS,
              "capacity_frames": CAPACITY_FRAMES, "machine": machine(), "rows": rows, "cross_attention": cross}
    write_json(out_dir / "attention.json", report)
    xs = [r["cache_frames"] for r in rows]
    line_plots(out_dir / "attention.png", [
        {"title": "attention time per chunk", "xlabel": "cache frames", "ylabel": "s", "logy": True,
         "series": {p: (xs, [r["seconds"][p] for r in rows]) for p in ("dense", "tempcache", "annsa",
                                                                       "tempcache+annsa")}},
        {"title": "AnnSA vs dense", "xlabel": "cache frames", "ylabel": "",
         "series": {"density": (xs, [r["annsa_density"] for r in rows]),
                    "recall": (xs, [r["annsa_recall"] for r in rows]),
                    "output error": (xs, [r["annsa_output_error"] for r in rows])}},
        {"title": "cross-attention (AnnCA)", "xlabel": "real prompt tokens of 512", "ylabel": "s",
         "series": {p: ([r["real_tokens"] for r in cross], [r["seconds"][p] for r in cross])
                    for p in ("padded", "pad_merge", "pad_merge+prune")}},
    ], title="attention at Wan-1.3B shapes")
    return report
