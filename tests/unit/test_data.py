"""hf_seqrl.data without a model: the emptiness rule and the left-padded prompts of decoder-only models."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hf_seqrl.data import has_text, tokenize_sources


@pytest.mark.parametrize("value,expected", [("a", True), (" a ", True), ("", False), (" \t\n", False),
                                            (None, False), (3, False), (["a"], False)])
def test_has_text_accepts_only_strings_with_a_visible_character(value, expected):
    assert has_text(value) is expected


class LetterTokenizer:
    """a → 1, b → 2, ...; no pad token, so prompts are padded with EOS (9)."""

    pad_token_id, eos_token_id, chat_template = None, 9, None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) - 96 for c in text]}


def test_causal_prompts_are_left_padded_with_eos_when_there_is_no_pad_token():
    batch = tokenize_sources(SimpleNamespace(name="causal"), LetterTokenizer(), ["abc", "a", "bcde"], max_length=3)
    # "bcde" is cut from the left to its last 3 tokens; the shorter prompts end at the right edge.
    assert batch["input_ids"].tolist() == [[1, 2, 3], [9, 9, 1], [3, 4, 5]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [1, 1, 1]]
    assert batch["input_ids"].dtype == batch["attention_mask"].dtype == torch.long
