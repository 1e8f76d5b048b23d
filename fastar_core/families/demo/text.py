"""The demo's text encoder: a word tokenizer over a vocabulary stored in the weights file and a tiny learned encoder
(the trainer builds the vocabulary from the scenes' prompts: ``tools/demo/world.default_vocabulary``).

Its output mimics UMT5's as Wan models see it: ``[B, text_len, text_dim]`` with every row past the prompt's
last token exactly zero, so the engine's padded-token handling (and prompt pruning) meets what it meets on
real checkpoints. It is trained jointly with the video model and saved in the same file under
``text_encoder.``.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

PAD, UNK = "<pad>", "<unk>"
TEXT_LEN = 64
TEXT_DIM = 64
STATE_PREFIX = "text_encoder."


def split_words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks (``,`` and ``.`` are tokens of their own)."""
    return re.findall(r"[a-z0-9]+|[,.]", text.lower())


class Tokenizer:
    def __init__(self, vocabulary: list[str], text_len: int = TEXT_LEN):
        if vocabulary[:2] != [PAD, UNK]:
            raise ValueError(f"the vocabulary must start with {PAD!r}, {UNK!r}")
        self.vocabulary = list(vocabulary)
        self.text_len = text_len
        self.ids = {w: i for i, w in enumerate(self.vocabulary)}

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt (unknown words map to ``<unk>``), cut to ``text_len``."""
        unk = self.ids[UNK]
        return [self.ids.get(w, unk) for w in split_words(text)][: self.text_len]

    def decode(self, ids) -> str:
        return " ".join(self.vocabulary[i] for i in ids if i != 0)

    def batch(self, texts: list[str]) -> torch.Tensor:
        """``[B, text_len]`` int64 ids, zero-padded."""
        out = torch.zeros(len(texts), self.text_len, dtype=torch.long)
        for row, text in enumerate(texts):
            ids = self.encode(text)
            out[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out


class TextEncoder(nn.Module):
    """Token + position embeddings and one pre-norm self-attention block over the prompt's own tokens."""

    def __init__(self, vocab_size: int, text_dim: int = TEXT_DIM, text_len: int = TEXT_LEN, num_heads: int = 4):
        super().__init__()
        self.text_len = text_len
        self.num_heads = num_heads
        self.token = nn.Embedding(vocab_size, text_dim)
        self.position = nn.Parameter(torch.zeros(text_len, text_dim))
        self.norm1 = nn.LayerNorm(text_dim)
        self.qkv = nn.Linear(text_dim, 3 * text_dim)
        self.proj = nn.Linear(text_dim, text_dim)
        self.norm2 = nn.LayerNorm(text_dim)
        self.ffn = nn.Sequential(nn.Linear(text_dim, 2 * text_dim), nn.GELU(), nn.Linear(2 * text_dim, text_dim))
        self.out_norm = nn.LayerNorm(text_dim)
        nn.init.normal_(self.token.weight, std=0.5)
        nn.init.normal_(self.position, std=0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [B, L]`` (0 = padding) -> ``[B, L, text_dim]``, padded rows exactly zero."""
        B, L = ids.shape
        keep = (ids != 0)[..., None]
        x = self.token(ids) + self.position[:L]
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        # Padding keys are masked out; an empty prompt would leave a row with no keys, so its first slot stays.
        key_ok = keep[..., 0].clone()
        key_ok[:, 0] = True
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_ok[:, None, None, :])
        x = x + self.proj(y.transpose(1, 2).reshape(B, L, -1))
        x = x + self.ffn(self.norm2(x))
        return self.out_norm(x) * keep


class PromptEncoder:
    """Tokenizer and encoder together: text in, Wan-style conditioning out."""

    def __init__(self, tokenizer: Tokenizer, encoder: TextEncoder):
        self.tokenizer = tokenizer
        self.encoder = encoder

    def __call__(self, texts: str | list[str]) -> torch.Tensor:
        if isinstance(texts, str):
            texts = [texts]
        ids = self.tokenizer.batch(texts).to(self.encoder.position.device)
        return self.encoder(ids)
