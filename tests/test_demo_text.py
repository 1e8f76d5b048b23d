"""The demo's tokenizer and text encoder: prompts round-trip, padding rows are exactly zero."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comfyui_fastar.fastar_core.families.demo.text import (
    PAD,
    TEXT_DIM,
    TEXT_LEN,
    UNK,
    PromptEncoder,
    TextEncoder,
    Tokenizer,
    split_words,
)
from comfyui_fastar.tools.demo.world import default_vocabulary, make_scene

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = default_vocabulary()
WORDS = VOCAB[2:]


def test_every_world_prompt_round_trips_without_unknown_words():
    tok = Tokenizer(VOCAB)
    for seed in range(30):
        for long in (False, True):
            prompt = make_scene(seed).prompt(long=long)
            ids = tok.encode(prompt)
            assert tok.ids[UNK] not in ids and 0 not in ids
            assert len(ids) <= TEXT_LEN
            assert tok.decode(ids) == " ".join(split_words(prompt))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(WORDS), min_size=0, max_size=TEXT_LEN + 10))
def test_word_sequences_round_trip_and_are_cut_to_text_len(words):
    tok = Tokenizer(VOCAB)
    ids = tok.encode(" ".join(words))
    assert len(ids) == min(len(words), TEXT_LEN)
    assert tok.decode(ids).split() == words[:TEXT_LEN]


def test_unknown_words_map_to_unk_and_padding_is_id_zero():
    tok = Tokenizer(VOCAB)
    assert VOCAB[0] == PAD and tok.ids[PAD] == 0
    ids = tok.batch(["a red zebra moves left"])
    assert ids.shape == (1, TEXT_LEN)
    assert ids[0, 2] == tok.ids[UNK]
    assert (ids[0, 5:] == 0).all() and (ids[0, :5] != 0).all()


def test_encoder_output_is_zero_exactly_on_padding_rows():
    torch.manual_seed(0)
    enc = PromptEncoder(Tokenizer(VOCAB), TextEncoder(len(VOCAB)))
    short, long = make_scene(1).prompt(), make_scene(1).prompt(long=True)
    out = enc([short, long])
    assert out.shape == (2, TEXT_LEN, TEXT_DIM)
    for row, text in enumerate((short, long)):
        n = len(split_words(text))
        assert (out[row, n:] == 0).all()
        assert (out[row, :n].abs().sum(dim=-1) > 0).all()


def test_padding_does_not_change_the_prompt_rows():
    torch.manual_seed(0)
    enc = TextEncoder(len(VOCAB), text_len=TEXT_LEN)
    ids = Tokenizer(VOCAB).batch(["a big blue circle quickly bounces"])
    full = enc(ids)
    trimmed = enc(ids[:, :6])  # the same prompt without any padding
    assert torch.allclose(full[:, :6], trimmed, atol=1e-6)
