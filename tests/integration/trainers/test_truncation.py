"""Samples cut at the length limit: one definition (`hf_seqrl.models.tokens.cut_at_limit`) for `rl/frac_truncated`,
`mask_truncated_completions`, the sample logs and MRT's candidates, on both families, whether or not the model forces
EOS at the limit (BART's and some Marian configs set `forced_eos_token_id`)."""

import json

import pytest
import torch

from helpers import byt5_tokenizer, make_config, params, prompt_completion_dataset, tiny_causal_model, tiny_model, \
    toy_dataset, toy_pairs
from hf_seqrl import MRTConfig, MRTTrainer, SCSTTrainer, SeqRLConfig
from hf_seqrl.models.tokens import cut_at_limit

EOS = 1


def test_cut_at_limit_counts_a_forced_eos_as_a_cut():
    # Limit 3. Row 0 chose EOS at its 2nd token; row 1's EOS is its 3rd, the limit's; row 2 has no EOS.
    ids = torch.tensor([[5, EOS, 0], [5, 6, EOS], [5, 6, 7]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    assert cut_at_limit(ids, mask, [EOS], 3).tolist() == [False, False, True]  # the model chose row 1's EOS
    assert cut_at_limit(ids, mask, [EOS], 3, forced_eos_id=EOS).tolist() == [False, True, True]  # it was forced
    assert cut_at_limit(ids, mask, [EOS], torch.tensor([3, 4, 3]), forced_eos_id=EOS).tolist() == [False, False, True]
    assert cut_at_limit(ids, mask, [], 3).tolist() == [True, True, True]  # no EOS: every row runs to the limit


def never_eos(model):
    """Makes the model's EOS logit -1e4 (so every sample runs to the limit) and forces EOS there."""
    model.get_output_embeddings().register_forward_hook(lambda module, inputs, out: out.index_add(
        -1, torch.tensor([EOS]), torch.full((*out.shape[:-1], 1), -1e4, dtype=out.dtype)))
    model.config.forced_eos_token_id = model.generation_config.forced_eos_token_id = EOS
    return model


def build(tmp_path, family, algorithm, **settings):
    tokenizer = byt5_tokenizer()
    if family == "seq2seq":
        model = never_eos(tiny_model("bart", dropout=0.1))
        src, tgt = toy_pairs(8, seed=2, alphabet="abcd", lengths=(3, 5))
        data = toy_dataset(tokenizer, src, tgt)
    else:
        model = never_eos(tiny_causal_model("llama"))
        data = prompt_completion_dataset(tokenizer, n=8)
    trainer_class, config_class = {"scst": (SCSTTrainer, SeqRLConfig), "mrt": (MRTTrainer, MRTConfig)}[algorithm]
    extra = dict(num_samples=2) if algorithm == "mrt" else {}
    args = make_config(config_class, tmp_path, max_steps=2, max_new_tokens=6, learning_rate=1e-2, **extra, **settings)
    return trainer_class(model=model, args=args, reward_funcs="chrf", processing_class=tokenizer, train_dataset=data)


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
def test_samples_ending_in_the_forced_eos_count_as_cut_and_are_masked(tmp_path, family):
    trainer = build(tmp_path, family, "scst", log_completions=True)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rl/frac_truncated" in h]
    assert len(logs) == 2 and all(h["rl/frac_truncated"] == 1.0 and h["rl/sample_length"] == 6.0 for h in logs)
    rows = [json.loads(line) for line in (tmp_path / "out" / "completions" / "step-2.jsonl").read_text().splitlines()]
    assert rows and all(row["truncated"] for row in rows)  # the sample log calls them cut as well

    masked = build(tmp_path / "masked", family, "scst", mask_truncated_completions=True)
    before = params(masked.model)
    masked.train()
    logs = [h for h in masked.state.log_history if "rl/pg_loss" in h]
    assert logs and all(h["rl/pg_loss"] == 0.0 and h["rl/frac_truncated"] == 1.0 for h in logs)
    assert all(torch.equal(before[k], v) for k, v in params(masked.model).items())


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
def test_mrt_candidates_ending_in_the_forced_eos_count_as_cut(tmp_path, family):
    trainer = build(tmp_path, family, "mrt")
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rl/frac_truncated" in h]
    assert len(logs) == 2 and all(h["rl/frac_truncated"] == 1.0 for h in logs)
