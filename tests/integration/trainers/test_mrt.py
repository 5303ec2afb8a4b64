"""MRTTrainer: candidate sets, integration on tiny models, learning on the copy task, settings."""

from functools import partial
import math

import pytest
import torch

from helpers import copy_dataset, heldout_chrf, make_config, params, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import MRTConfig, MRTTrainer
from hf_seqrl.functional.risk import first_occurrence_mask
from hf_seqrl.models.tokens import completion_mask
from hf_seqrl.models import family_for
from hf_seqrl.objectives.minimum_risk import candidate_set

config = partial(make_config, MRTConfig, max_steps=3)  # config(tmp_path, **overrides)

MRT_METRICS = ["mrt/risk", "mrt/q_entropy", "mrt/distinct_candidates", "rl/reward", "rl/reward_std",
               "rl/sample_length", "rl/entropy", "rl/kl", "rl/xe_loss", "rl/phase"]


def test_candidate_set_pads_alike_and_finds_duplicates():
    pad, eos = 0, 1
    # one source, 2 samples (the second equals the reference), then the greedy decode and the reference label
    samples = torch.tensor([[5, 6, eos, pad], [7, eos, pad, pad]])
    sample_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    greedy, greedy_mask = torch.tensor([[5, 6, eos]]), torch.tensor([[1, 1, 1]], dtype=torch.bool)
    reference = torch.tensor([[7, eos, -100, -100, -100]])  # -100: label padding
    ids, mask, is_sample = candidate_set([(samples, sample_mask, 2), (greedy, greedy_mask, 1),
                                          (reference, reference != -100, 1)], 2, pad)
    # every candidate widened to the longest (5), pad after its last counted token
    assert ids.tolist() == [[5, 6, eos, pad, pad], [7, eos, pad, pad, pad], [5, 6, eos, pad, pad],
                            [7, eos, pad, pad, pad]]
    assert mask.sum(dim=1).tolist() == [3, 2, 3, 2] and is_sample.tolist() == [True, True, False, False]
    # the greedy decode repeats sample 0 and the reference repeats sample 1: two distinct candidates
    assert first_occurrence_mask(ids, 4).tolist() == [True, True, False, False]


def test_reference_candidate_scores_like_the_gold_labels(tokenizer):
    # MRTTrainer takes the cross-entropy from the reference candidate's row: the same log-probs as the gold row's.
    model = tiny_model("t5", seed=5)
    enc = tokenizer(["abc", "da"], return_tensors="pt", padding=True)
    labels = tokenizer(text_target=["abc", "d"], return_tensors="pt", padding=True)["input_ids"]
    labels = labels.masked_fill(labels == 0, -100)
    samples = torch.tensor([[100, 101, 1, 0, 0, 0, 0], [102, 1, 0, 0, 0, 0, 0]])
    ids, mask, _ = candidate_set([(samples, samples != 0, 1), (labels, labels != -100, 1)], 1, pad=0)
    scored = family_for(model).score(model, enc, ids, 2, None, 1.0)
    gold = family_for(model).score(model, enc, samples, 1, labels, 1.0)
    from_candidates = scored.token_logprobs.view(2, 2, -1)[:, -1, : labels.shape[1]]
    counted = labels != -100
    torch.testing.assert_close(from_candidates[counted], gold.gold_logprobs[counted], atol=1e-5, rtol=1e-5)


def test_mrt_trains_a_tiny_t5_and_logs_its_metrics(tmp_path, tokenizer):
    model = tiny_model("t5")
    before = params(model)
    args = config(tmp_path, num_samples=3, mrt_include_greedy=True, mrt_include_reference=True, rl_weight=0.7,
                  kl_coef=0.05, entropy_coef=0.01, warmup_xe_steps=1)
    trainer = MRTTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=copy_dataset(tokenizer),
                         processing_class=tokenizer)
    assert trainer.method.name == "Minimum risk training" and trainer.method.baseline is None
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["rl/phase"] for h in logs] == [0.0, 1.0, 1.0]
    for name in MRT_METRICS:
        assert name in logs[-1] and math.isfinite(logs[-1][name]), name
    # 3 samples + greedy + reference; the risk is an expected cost in [0, 1] and Q's entropy at most log 5
    assert 1.0 <= logs[-1]["mrt/distinct_candidates"] <= 5.0
    assert 0.0 <= logs[-1]["mrt/risk"] <= 1.0 and 0.0 <= logs[-1]["mrt/q_entropy"] <= math.log(5) + 1e-6
    after = params(model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    trainer.save_model(str(tmp_path / "saved"))
    card = (tmp_path / "saved" / "README.md").read_text()
    assert "- Algorithm: Minimum risk training" in card and "Shen et al., 2016" in card


def test_identical_candidates_count_once(tmp_path, tokenizer):
    # top_k=1 samples the argmax: every sample and the greedy decode are one sequence, so Q = 1 on it.
    args = config(tmp_path, max_steps=2, num_samples=3, mrt_include_greedy=True, top_k=1)
    trainer = MRTTrainer(model=tiny_model("t5"), args=args, reward_funcs="chrf", train_dataset=copy_dataset(tokenizer),
                         processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "mrt/risk" in h]
    assert all(h["mrt/distinct_candidates"] == 1.0 and h["mrt/q_entropy"] == 0.0 for h in logs)


def test_mrt_learns_the_copy_task(tmp_path, tokenizer):
    """From scratch, MRT over 4 samples + the reference lowers the risk and raises sample and held-out reward.

    Mean token log-probs (`length_normalize`) with α = 1 keep Q away from uniform on an untrained model; with
    summed log-probs α would be about 1/length of that. Measured: risk 0.68 -> 0.26, held-out chrF 0 -> 0.33.
    """
    model = tiny_model("t5")
    src, tgt = toy_pairs(400, seed=0, alphabet="abcd", lengths=(2, 5))
    h_src, h_tgt = toy_pairs(64, seed=99, alphabet="abcd", lengths=(2, 5))
    before = heldout_chrf(model, tokenizer, h_src, h_tgt)
    args = config(tmp_path, per_device_train_batch_size=16, max_steps=60, learning_rate=3e-3, logging_steps=10,
                  num_samples=4, mrt_include_reference=True, mrt_alpha=1.0, length_normalize=True)
    trainer = MRTTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=toy_dataset(tokenizer, src, tgt),
                         processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "mrt/risk" in h]
    assert logs[-1]["mrt/risk"] < logs[0]["mrt/risk"] - 0.2, [h["mrt/risk"] for h in logs]
    assert logs[-1]["rl/reward"] > logs[0]["rl/reward"] + 0.05, [h["rl/reward"] for h in logs]
    assert heldout_chrf(model, tokenizer, h_src, h_tgt) > before + 0.15


def test_mrt_settings_are_checked(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="mrt_alpha must be > 0"):
        config(tmp_path, mrt_alpha=0.0)
    # MRT has no baseline, advantages, token-level sum or importance ratio: those fields are not MRTConfig's.
    for name, value in (("baseline", "greedy"), ("center_advantages", True), ("scale_rewards", True),
                        ("num_iterations", 2), ("loss_normalization", "token")):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            config(tmp_path, **{name: value})
    with pytest.raises(ValueError, match="1 candidate per source .* Set num_samples >= 2"):
        config(tmp_path, num_samples=1)
    assert config(tmp_path, num_samples=1, mrt_include_reference=True).num_samples == 1  # 2 candidates
    from hf_seqrl import SeqRLConfig

    with pytest.raises(TypeError, match="MRTConfig"):
        MRTTrainer(model=tiny_model("t5"), args=SeqRLConfig(output_dir=str(tmp_path)), reward_funcs="chrf",
                   train_dataset=copy_dataset(tokenizer), processing_class=tokenizer)


def test_reference_candidate_without_labels_names_the_fix(tmp_path, tokenizer):
    src, tgt = toy_pairs(8, seed=1, alphabet="abcd", lengths=(2, 5))
    ds = toy_dataset(tokenizer, src, tgt, references=tgt, with_labels=False)
    trainer = MRTTrainer(model=tiny_model("t5"), args=config(tmp_path, max_steps=1, mrt_include_reference=True),
                         reward_funcs="chrf", train_dataset=ds, processing_class=tokenizer)
    with pytest.raises(ValueError, match="mrt_include_reference=True .* no 'labels'"):
        trainer.train()


# ---- candidates from the beam's n-best list, length limits ------------------------------------------------------

def capture_candidates(trainer):
    """Records the candidate rows of every MRT step (what the scoring pass reads)."""
    seen = []
    score_policy = trainer.score_policy

    def recorded(model, ctx, token_ids, group, *args, **kwargs):
        seen.append((dict(ctx.inputs), token_ids.clone(), group))
        return score_policy(model, ctx, token_ids, group, *args, **kwargs)

    trainer.score_policy = recorded
    return seen


@pytest.mark.parametrize("arch", ["t5", "marian", "llama"])
def test_beam_candidates_are_the_n_best_of_generate(tmp_path, tokenizer, arch):
    from helpers import prompt_completion_dataset, tiny_causal_model
    from hf_seqrl.models.causal import generate_completions

    causal = arch == "llama"
    model = tiny_causal_model("llama") if causal else tiny_model(arch, dropout=0.1)
    data = prompt_completion_dataset(tokenizer, n=8) if causal else copy_dataset(tokenizer, n=8)
    args = config(tmp_path, max_steps=1, per_device_train_batch_size=4, learning_rate=0.0, num_samples=3,
                  mrt_candidates="beam", mrt_beam_size=4, max_new_tokens=6)
    trainer = MRTTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=data, processing_class=tokenizer)
    seen = capture_candidates(trainer)
    trainer.train()
    (inputs, token_ids, group), = seen
    input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
    assert group == 3
    model.eval()
    with torch.no_grad():
        if causal:
            prompt_ids, prompt_mask = family_for(model).prompts(model, inputs)
            expected, expected_mask = generate_completions(model, prompt_ids, prompt_mask, num_beams=4,
                                                           num_return_sequences=3, do_sample=False, max_new_tokens=6)
        else:
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=4,
                                 num_return_sequences=3, do_sample=False, max_new_tokens=6)[:, 1:]
            expected_mask = completion_mask(out, [1])
            expected = out.masked_fill(~expected_mask, 0)
    width = expected.shape[1]
    assert torch.equal(token_ids[:, :width], expected) and (token_ids[:, width:] == 0).all()


def test_sample_and_beam_candidates_count_duplicates_once(tmp_path, tokenizer):
    # top_k=1: every sample is the greedy decode, which is also the beam's best hypothesis (ties aside)
    args = config(tmp_path, max_steps=2, num_samples=2, mrt_candidates="sample+beam", mrt_beam_size=2, top_k=1,
                  max_new_tokens=5)
    trainer = MRTTrainer(model=tiny_model("t5"), args=args, reward_funcs="chrf", train_dataset=copy_dataset(tokenizer),
                         processing_class=tokenizer)
    seen = capture_candidates(trainer)
    trainer.train()
    for _, token_ids, group in seen:
        assert group == 4
        distinct = first_occurrence_mask(token_ids, 4).view(-1, 4).sum(dim=1)
        assert (distinct <= 3).all()  # the two samples are one candidate
    logged = [h["mrt/distinct_candidates"] for h in trainer.state.log_history if "mrt/distinct_candidates" in h]
    assert len(logged) == 2 and all(1 <= d <= 3 for d in logged)


@pytest.mark.parametrize("candidates", ["sample", "beam", "sample+beam"])
def test_the_relative_length_limit_caps_every_candidate(tmp_path, tokenizer, candidates):
    from hf_seqrl.models.beam import length_limits

    args = config(tmp_path, max_steps=1, num_samples=2, mrt_candidates=candidates, mrt_beam_size=2,
                  mrt_include_greedy=candidates != "beam", max_new_tokens=12, max_len_a=0.5, max_len_b=1)
    trainer = MRTTrainer(model=tiny_model("t5"), args=args, reward_funcs="chrf", train_dataset=copy_dataset(tokenizer),
                         processing_class=tokenizer)
    seen = capture_candidates(trainer)
    trainer.train()
    (inputs, token_ids, group), = seen
    limits = length_limits(inputs["attention_mask"].sum(dim=1), 0.5, 1)  # int(0.5 * source tokens + 1): 2 to 4
    lengths = completion_mask(token_ids, [1]).sum(dim=1)  # up to and including the first EOS
    assert (lengths.view(-1, group) <= limits.unsqueeze(1)).all()
    ends = token_ids.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
    assert (ends == 1).all()  # every candidate ends with EOS by its limit (below max_new_tokens=12)


def test_cap_lengths_by_hand():
    from hf_seqrl.models.beam import cap_lengths, length_limits

    # limits: int(0.5 * [4, 7] + 1) = [3, 4]
    assert length_limits(torch.tensor([4, 7]), 0.5, 1).tolist() == [3, 4]
    ids = torch.tensor([[5, 6, 7, 8, 1], [5, 1, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    capped, capped_mask = cap_lengths(ids, mask, torch.tensor([3, 3]), eos_id=1, pad_id=0)
    # row 0 (5 tokens) keeps 2 and ends with EOS; row 1 (2 tokens) is under its limit
    assert capped.tolist() == [[5, 6, 1, 0, 0], [5, 1, 0, 0, 0]]
    assert capped_mask.sum(dim=1).tolist() == [3, 2]


def test_beam_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="mrt_candidates='nbest' is not one of"):
        config(tmp_path, mrt_candidates="nbest")
    with pytest.raises(ValueError, match="mrt_beam_size=2 is below num_samples=4"):
        config(tmp_path, mrt_candidates="beam", mrt_beam_size=2)
    with pytest.raises(ValueError, match="mrt_include_greedy=True with mrt_candidates='beam'"):
        config(tmp_path, mrt_candidates="beam", mrt_include_greedy=True)
    with pytest.raises(ValueError, match="max_len_a=0.5 needs max_len_b"):
        config(tmp_path, max_len_a=0.5)
