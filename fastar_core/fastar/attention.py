"""FAST-AR's attention seam: AnnSA (bucketed sparse self-attention) and AnnCA (prompt pruning).

TempCache needs nothing here: it is a cache whose view carries ``log(count)`` biases, which the dense path
already adds. This class changes only what the paper changes and measures itself against dense on request.

AnnSA, per (chunk, step, layer) where active: queries and keys (after RoPE, what attention scores) are hashed
with one sign-LSH table; a query visits the keys of its bucket (and Hamming-1 neighbours with multi-probe).
Sink tokens and the current chunk stay dense. The plan (bucket-sorted order, key blocks per query block) is
built once per call and consumed by the kernel. Dense for the first ``dense_warmup`` share of denoising steps
and outside the selected layers.

AnnCA: identical prompt rows (the zero-padded tail of a UMT5 prompt) are merged exactly into one key with a
``+log(count)`` bias. With pruning on, per (frame, step, layer) the frame's queries and the prompt's keys are
hashed into one space, and only prompt tokens whose bucket some query hits are attended (plus merged keys).
"""

from __future__ import annotations

import math

import torch

from ...kernels import attention as kernel_attention
from ...kernels import build_sparse_layout, choose_backend, sparse_attention
from ..caches.base import Figure
from ..forward.attention import DenseAttention, PassInfo
from .ann import LSHMatcher, hamming1_probes
from .config import FastARConfig
from .metrics import attention_recall, dense_probabilities, relative_error, sample_queries

MEASURED_QUERIES = 64  # queries sampled per attention call when measuring recall


class FastARAttention(DenseAttention):
    def __init__(self, config: FastARConfig, num_heads: int, head_dim: int, measure: bool = False,
                 rope_max_distance: int | None = None, sa_heads: tuple[int, int] | None = None, parallel=None):
        super().__init__(backend=config.backend, rope_max_distance=rope_max_distance,
                         verify_kernels=config.verify_kernels)
        self.config = config
        self.num_heads, self.head_dim = num_heads, head_dim
        # Under sequence parallelism self-attention sees a range of the model's heads (the planes of those heads,
        # so buckets equal one process's) and cross-attention a slice of every frame's queries (parallel).
        self.sa_heads = sa_heads or (0, num_heads)
        self.parallel = parallel
        self.measure = measure
        self.sparse_layers: set = set()
        self._sa_hash: dict = {}
        self._ca_hash: dict = {}
        self._prompt_merge: dict = {}
        self.layer_recall: dict = {}  # layer -> recalls measured over the rollout (calibration reads it)
        self._checked: set = set()  # layers whose AnnSA codes were checked (at first use: never again)
        self._token_masks: dict = {}  # (sparse frames, tokens per frame, device) -> bool mask of sparse queries
        self._reset_tally()

    def begin_rollout(self, num_layers: int) -> None:
        super().begin_rollout(num_layers)
        c = self.config.validate(num_layers=num_layers)
        self.sparse_layers = c.sparse_layers(num_layers) if c.annsa else set()
        self._sa_hash.clear()
        self._ca_hash.clear()
        self._prompt_merge.clear()
        self.layer_recall = {}
        self._checked = set()
        self._reset_tally()

    @property
    def capturable(self) -> bool:
        """Measuring tallies recall on the host and AnnCA's pruning sums what it kept per call: run those eagerly."""
        return not self.measure and not (self.config.annca and self.config.annca_prune)

    def graph_key(self, info: PassInfo) -> tuple:
        """AnnSA is dense in the first denoising steps: a pass is sparse or dense by its frames' steps."""
        if not self.sparse_layers:
            return ()
        dense_steps = math.floor(self.config.dense_warmup * info.num_steps + 1e-9)
        steps = info.frame_steps if info.frame_steps is not None else [info.step] * info.num_frames
        return tuple((s if s >= 0 else info.num_steps) >= dense_steps for s in steps)

    # -- tallies (read once per chunk by the sampler) ----------------------------------------------------------
    def _reset_tally(self):
        self._tally = {"sa_calls": 0, "sa_density": 0.0, "sa_recall": 0.0, "sa_recall_n": 0, "sa_error": 0.0,
                       "ca_calls": 0, "ca_kept": 0.0, "ca_recall": 0.0, "ca_recall_n": 0}

    def chunk_stats(self) -> dict:
        """The chunk's tallies; the share of prompt tokens AnnCA's pruning kept is summed on the device and read
        with the rest of the report (the sampler reads ``Figure``s in one transfer)."""
        t = self._tally
        out: dict = {}
        if t["sa_calls"]:
            out["density"] = round(t["sa_density"] / t["sa_calls"], 5)
        if t["sa_recall_n"]:
            out["recall"] = round(t["sa_recall"] / t["sa_recall_n"], 5)
            out["sa_output_error"] = round(t["sa_error"] / t["sa_recall_n"], 6)
        if t["ca_calls"]:
            kept = t["ca_kept"] / t["ca_calls"]
            out["ca_kept"] = Figure(kept, 5) if torch.is_tensor(kept) else round(kept, 5)
        if t["ca_recall_n"]:
            out["ca_recall"] = round(t["ca_recall"] / t["ca_recall_n"], 5)
        self._reset_tally()
        return out

    # -- hashing -----------------------------------------------------------------------------------------------
    def _hasher(self, table: dict, layer: int, salt: int, tables: int, device,
                heads: tuple[int, int] | None = None) -> LSHMatcher:
        if layer not in table:
            c = self.config
            hasher = LSHMatcher(self.num_heads, self.head_dim, c.bits, tables,
                                seed=c.seed * 1_000_003 + salt * 1009 + layer, multiprobe=c.multiprobe,
                                device=device, backend=c.backend)
            if heads is not None and heads != (0, self.num_heads):
                hasher.planes = hasher.planes[heads[0]:heads[1]].contiguous()
            table[layer] = hasher
        return table[layer]

    # -- self-attention (AnnSA) -----------------------------------------------------------------------------------
    def _sparse_kernel_on(self, k: torch.Tensor) -> bool:
        """Whether a sparse kernel runs AnnSA on this device: on a GPU without one (no Triton), the torch fallback
        would launch a kernel per (head, bucket) and cost far more than dense attention, so the layer stays dense."""
        if k.device.type != "cuda":
            return True
        chosen = choose_backend("sparse_attention", self.backend, k.device, dtype=k.dtype, head_dim=k.shape[-1])
        return chosen != "torch"

    def _sparse_query_frames(self, layer: int, view, info: PassInfo) -> list[bool] | None:
        """Per query frame: sparse or dense (decided on the host from the pass). None when the pass is dense."""
        if (layer not in self.sparse_layers or view.length - view.n_sink < self.config.annsa_min_keys
                or not self._sparse_kernel_on(view.k)):
            return None
        dense_steps = math.floor(self.config.dense_warmup * info.num_steps + 1e-9)
        steps = info.frame_steps if info.frame_steps is not None else [info.step] * info.num_frames
        # The clean pass behaves like a step after the last one.
        sparse = [(s if s >= 0 else info.num_steps) >= dense_steps for s in steps]
        return sparse if any(sparse) else None

    def _token_mask(self, sparse_frames: list, tpf: int, device) -> torch.Tensor:
        """Bool per query token: its frame is sparse. Made with fills on the device, once per pattern."""
        key = (tuple(sparse_frames), tpf, device)
        if key not in self._token_masks:
            mask = torch.zeros(len(sparse_frames) * tpf, dtype=torch.bool, device=device)
            for f, sparse in enumerate(sparse_frames):
                if sparse:
                    mask[f * tpf:(f + 1) * tpf].fill_(True)
            self._token_masks[key] = mask
        return self._token_masks[key]

    def self_attention(self, layer, q, k, v, positions, view, info):
        sparse_frames = None if view is None else self._sparse_query_frames(layer, view, info)
        if sparse_frames is None:
            if self.measure:
                self._tally["sa_calls"] += 1
                self._tally["sa_density"] += 1.0
            return super().self_attention(layer, q, k, v, positions, view, info)

        q_rot, k_rot, cache_k = self.rotate_inputs(layer, q, k, positions, view, info)
        s = view.n_sink
        # Key order for the layout: dense keys first (sink, then the current chunk), then the sparse rest.
        keys = torch.cat([cache_k[:, :, :s], k_rot, cache_k[:, :, s:]], dim=2)
        values = torch.cat([view.v[:, :, :s].to(v.dtype), v, view.v[:, :, s:].to(v.dtype)], dim=2)
        bias = None
        if not view.uniform:
            b = view.bias.float()
            cur = torch.zeros(*b.shape[:-1], k.shape[2], device=b.device)
            bias = torch.cat([b[..., :s], cur, b[..., s:]], dim=-1)
        n_dense = s + k.shape[2]
        hasher = self._hasher(self._sa_hash, layer, 1, 1, q.device, heads=self.sa_heads)
        # The codes are checked at the layer's first call (before any capture); the layout's shapes then depend on
        # the sizes and the hash's width alone, and nothing is read back.
        layout = build_sparse_layout(hasher.codes(q_rot)[..., 0], hasher.codes(keys)[..., 0], n_dense=n_dense,
                                     block_q=self.config.block_size, block_k=self.config.block_size,
                                     radius=1 if self.config.multiprobe else 0, bits=hasher.bits,
                                     checked=layer in self._checked, backend=self.backend)
        self._checked.add(layer)
        out = sparse_attention(q_rot, keys, values, layout, bias, backend=self.backend, check_values=False)

        tpf = info.tokens_per_frame
        token_sparse = None
        if not all(sparse_frames):
            # Rolling windows: queries of chunks still in the dense warm-up attend densely.
            token_sparse = self._token_mask(sparse_frames, tpf, q.device)
            dense_out = kernel_attention(q_rot, keys, values, bias, backend=self.backend, check_values=False)
            out = torch.where(token_sparse[None, None, :, None], out, dense_out)
        if self.measure:  # counting visible pairs costs about as much as a small attention call
            self._tally["sa_calls"] += 1
            share = sum(sparse_frames) / len(sparse_frames)
            self._tally["sa_density"] += share * layout.density() + (1 - share)
            if token_sparse is None:
                token_sparse = self._token_mask(sparse_frames, tpf, q.device)
            self._measure_sa(q_rot, keys, values, bias, layout, out, token_sparse, layer, info)
        return out

    def _measure_sa(self, q_rot, keys, values, bias, layout, out, token_sparse, layer, info):
        idx = sample_queries(q_rot.shape[2], MEASURED_QUERIES, seed=layer * 7919 + info.chunk * 31 + info.step,
                             device=q_rot.device)
        probs = dense_probabilities(q_rot[:, :, idx], keys, bias)
        # Visibility of each key for the sampled queries under the layout's token rule.
        q_code = torch.empty_like(layout.q_codes_sorted).scatter_(2, layout.q_perm, layout.q_codes_sorted)[:, :, idx]
        k_code = torch.empty_like(layout.k_codes_sorted).scatter_(2, layout.k_perm, layout.k_codes_sorted)
        x = q_code[..., :, None] ^ k_code[..., None, :]
        visible = (x == 0) if layout.radius == 0 else ((x & (x - 1)) == 0)
        visible[..., : layout.n_dense] = True
        visible = visible | ~token_sparse[idx][None, None, :, None]
        dense_out = (probs @ values.float()).to(out.dtype)
        recall = attention_recall(probs, visible.float())
        self.layer_recall.setdefault(layer, []).append(recall)
        self._tally["sa_recall"] += recall
        self._tally["sa_error"] += relative_error(out[:, :, idx], dense_out)
        self._tally["sa_recall_n"] += 1

    # -- cross-attention (AnnCA) -----------------------------------------------------------------------------------
    def _merged_prompt(self, layer, text_k, text_v):
        """Unique (key, value) prompt rows, their multiplicities and hash probes, once per prompt and layer."""
        cached = self._prompt_merge.get(layer)
        if cached is not None and cached[0] is text_k:
            return cached[1:]
        B, H, L, D = text_k.shape
        rows = torch.cat([text_k, text_v], dim=-1).permute(2, 0, 1, 3).reshape(L, -1)
        _, inverse, counts = torch.unique(rows, dim=0, return_inverse=True, return_counts=True)
        first = torch.full((counts.numel(),), L, dtype=torch.long, device=rows.device)
        first.scatter_reduce_(0, inverse, torch.arange(L, device=rows.device), reduce="amin")
        first, order = first.sort()  # keep prompt order
        counts = counts[order].float()
        k_u = text_k[:, :, first]
        # Hash codes of the unique prompt keys (and their Hamming-1 probes) once per prompt and layer.
        hasher = self._hasher(self._ca_hash, layer, 2, self.config.tables, text_k.device)
        k_codes = hasher.codes(k_u).long()  # [B, H, Lu, T]
        k_probes = hamming1_probes(k_codes, hasher.bits) if hasher.multiprobe else k_codes[..., None]
        merged = (k_u, text_v[:, :, first], counts.log(), counts > 1, k_probes)
        self._prompt_merge[layer] = (text_k, *merged)
        return merged

    def cross_attention(self, layer, q, text_k, text_v, info):
        if not self.config.annca:
            return super().cross_attention(layer, q, text_k, text_v, info)
        k_u, v_u, log_count, merged, k_probes = self._merged_prompt(layer, text_k, text_v)
        bias = log_count[None, None]
        if not self.config.annca_prune:
            self._tally["ca_calls"] += 1
            self._tally["ca_kept"] += k_u.shape[2] / text_k.shape[2]
            return kernel_attention(q, k_u, v_u, bias, backend=self.backend, check_values=False)

        # Per frame: the prompt tokens whose bucket (or a Hamming-1 probe of it) some query of the frame hits.
        hasher = self._hasher(self._ca_hash, layer, 2, self.config.tables, q.device)
        B, H, N, D = q.shape
        F = info.num_frames
        tpf = N // F  # a slice of each frame's tokens under sequence parallelism
        T, n_codes = hasher.tables, 2**hasher.bits
        q_codes = hasher.codes(q).long().view(B, H, F, tpf, T).permute(0, 1, 2, 4, 3)  # [B, H, F, T, tpf]
        hit_map = torch.zeros(B, H, F, T, n_codes, dtype=torch.bool, device=q.device)
        hit_map.scatter_(-1, q_codes, True)
        probes = k_probes.permute(0, 1, 3, 2, 4).reshape(B, H, 1, T, -1).expand(B, H, F, T, -1)
        hits = hit_map.gather(-1, probes).view(B, H, F, T, k_u.shape[2], -1).any(-1).any(3)  # [B, H, F, Lu]
        if self.parallel is not None:  # a token the frame's queries on any rank hit is kept on every rank
            hits = self.parallel.any_across_ranks(hits)
        keep = hits | merged
        frame_bias = torch.where(keep, bias[:, :, None], float("-inf"))
        # Frames become batch entries, so one attention call serves them all with their own key subsets.
        qf = q.view(B, H, F, tpf, D).transpose(1, 2).reshape(B * F, H, tpf, D)
        kf = k_u[:, None].expand(B, F, *k_u.shape[1:]).reshape(B * F, *k_u.shape[1:])
        vf = v_u[:, None].expand(B, F, *v_u.shape[1:]).reshape(B * F, *v_u.shape[1:])
        bf = frame_bias.transpose(1, 2).reshape(B * F, H, -1)
        out = kernel_attention(qf, kf, vf, bf, backend=self.backend, check_values=False)
        out = out.view(B, F, H, tpf, D).transpose(1, 2).reshape(B, H, N, D)
        self._tally["ca_calls"] += 1
        self._tally["ca_kept"] = self._tally["ca_kept"] + keep.float().sum(-1).mean() / text_k.shape[2]
        if self.measure:
            probs = dense_probabilities(qf[:, :, :MEASURED_QUERIES], kf, bias)
            self._tally["ca_recall"] += attention_recall(probs, keep.transpose(1, 2).reshape(B * F, H, 1, -1).float())
            self._tally["ca_recall_n"] += 1
        return out
