"""`MetricXReward` on a tiny mT5 built from a config (no Hub): its values equal MetricX-24's reading spelled out by hand
(one unpadded sequence, EOS removed, decoder fed token 0, the score token's logit at the first position, clamped,
negated), for reference-based and QE inputs; a checkpoint with its own output head (as MetricX's) is read through that
head; duplicates are scored once; and it trains in a trainer."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import byt5_tokenizer, toy_dataset, toy_pairs
from hf_seqrl.rewards import MetricXReward, build_reward

# An extra id of ByT5's 384 ids (bytes end at 258): never an input token, as <extra_id_10> never is in MetricX.
SCORE_ID = 300

PREDICTIONS = ["the cat sat", "a dog", "xyz qq", "the cat sat", "hello"]
REFERENCES = [["the cat sat down", "a cat sat"], ["the dog"], ["zz"], ["the cat sat down", "a cat sat"], []]
SOURCES = ["die Katze sass", "der Hund", "abc", "die Katze sass", "hallo"]


def tiny_mt5(seed: int = 0):
    from transformers import MT5Config, MT5ForConditionalGeneration

    torch.manual_seed(seed)
    config = MT5Config(vocab_size=384, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2, dropout_rate=0.0,
                       pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return MT5ForConditionalGeneration(config).eval()


def last_hidden(model, tokenizer, text: str, with_eos: bool = False) -> torch.Tensor:
    """The decoder's last hidden state at its first position for `text` alone (no padding), EOS removed unless
    `with_eos`, the decoder fed token 0."""
    ids = tokenizer(text).input_ids
    assert ids[-1] == tokenizer.eos_token_id
    ids = ids if with_eos else ids[:-1]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([[0]]), output_hidden_states=True)
    return out.decoder_hidden_states[-1][0, 0]


def by_hand(model, tokenizer, text: str, with_eos: bool = False) -> float:
    """MetricX-24's score of `text`: the score token's logit at the decoder's first position, clamped to [0, 25]."""
    ids = tokenizer(text).input_ids
    ids = ids if with_eos else ids[:-1]
    with torch.no_grad():
        logit = model(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([[0]])).logits[0, 0, SCORE_ID]
    return min(max(logit.item(), 0.0), 25.0)


def aim_head(model, tokenizer, texts, targets) -> None:
    """Sets the score token's output row so that `texts` score about `targets`: a random head puts every score far
    below 0, where the clamp would hide any mistake."""
    hidden = torch.stack([last_hidden(model, tokenizer, text) for text in texts])
    row = torch.linalg.lstsq(hidden, torch.tensor(targets).unsqueeze(1)).solution.squeeze(1)
    with torch.no_grad():
        model.get_output_embeddings().weight[SCORE_ID] = row


def reference_texts():
    return ["source: die Katze sass candidate: the cat sat reference: the cat sat down",
            "source: die Katze sass candidate: the cat sat reference: a cat sat",
            "source: der Hund candidate: a dog reference: the dog",
            "source: abc candidate: xyz qq reference: zz",
            "source: hallo candidate: hello"]


@pytest.fixture(scope="module")
def tokenizer():
    return byt5_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    model = tiny_mt5()
    # two inside the range, one clamped at each end, one more inside
    aim_head(model, tokenizer, reference_texts(), [3.0, 11.0, -4.0, 31.0, 18.0])
    return model


def test_reference_based_values_equal_metricx24_spelled_out(model, tokenizer):
    reward = MetricXReward(model, tokenizer=tokenizer, score_token_id=SCORE_ID, batch_size=2)
    texts, owners = reward.inputs(PREDICTIONS, REFERENCES, SOURCES)
    # one input per reference; a prediction without one is scored without one
    assert texts == [reference_texts()[i] for i in (0, 1, 2, 3, 0, 1, 4)] and owners == [0, 0, 1, 2, 3, 3, 4]
    scores = {text: by_hand(model, tokenizer, text) for text in reference_texts()}
    inside = [s for s in scores.values() if 0.5 < s < 24.5]
    assert len(inside) >= 3 and 0.0 in scores.values() and 25.0 in scores.values()
    first, second, dog, xyz, hello = (scores[t] for t in reference_texts())
    expected = [-min(first, second), -dog, -xyz, -min(first, second), -hello]  # the best (lowest-error) reference
    assert reward(PREDICTIONS, REFERENCES, SOURCES) == pytest.approx(expected, abs=1e-4)
    normalized = MetricXReward(model, tokenizer=tokenizer, score_token_id=SCORE_ID, normalize=True)
    assert normalized(PREDICTIONS, REFERENCES, SOURCES) == pytest.approx([1 + e / 25 for e in expected], abs=1e-5)
    assert reward.__name__ == "metricx"


def test_qe_leaves_the_references_out(model, tokenizer):
    reward = MetricXReward(model, tokenizer=tokenizer, score_token_id=SCORE_ID, qe=True)
    assert reward.__name__ == "metricx_qe"
    texts, owners = reward.inputs(PREDICTIONS[:2], REFERENCES[:2], SOURCES[:2])
    assert texts == ["source: die Katze sass candidate: the cat sat", "source: der Hund candidate: a dog"]
    assert owners == [0, 1]
    values = reward(PREDICTIONS[:2], REFERENCES[:2], SOURCES[:2])
    assert values == pytest.approx([-by_hand(model, tokenizer, t) for t in texts], abs=1e-4)
    assert reward(PREDICTIONS[:2], [["other"], ["refs", "entirely"]], SOURCES[:2]) == values
    with pytest.raises(ValueError, match="qe=True.*needs the sources"):
        reward(PREDICTIONS[:2], REFERENCES[:2])


def test_without_sources_the_source_is_empty(model, tokenizer):
    reward = MetricXReward(model, tokenizer=tokenizer, score_token_id=SCORE_ID)
    texts, _ = reward.inputs(["a dog"], [["the dog"]], None)
    assert texts == ["source:  candidate: a dog reference: the dog"]
    assert reward(["a dog"], [["the dog"]]) == pytest.approx([-by_hand(model, tokenizer, texts[0])], abs=1e-4)


def test_the_eos_the_tokenizer_appends_is_removed(model, tokenizer):
    reward = MetricXReward(model, tokenizer=tokenizer, score_token_id=SCORE_ID)
    text = reference_texts()[0]
    (ids,) = reward.encode([text])
    assert ids == tokenizer(text).input_ids[:-1] and tokenizer.eos_token_id not in ids
    # it matters: the same text read with its EOS scores otherwise
    assert abs(by_hand(model, tokenizer, text, with_eos=True) - by_hand(model, tokenizer, text)) > 0.1
    # truncation keeps max_length tokens, the EOS among them, then drops the EOS (as MetricX-24's prediction)
    short = MetricXReward(model, tokenizer=tokenizer, score_token_id=SCORE_ID, max_length=10)
    assert short.encode([text]) == [tokenizer(text).input_ids[:9]]


def test_each_distinct_input_is_scored_once(model, tokenizer):
    reward = MetricXReward(model, tokenizer=tokenizer, score_token_id=SCORE_ID, batch_size=2)
    rows, forward = [], model.forward

    def counted(*args, **kwargs):
        rows.append(kwargs["input_ids"].shape[0])
        assert kwargs["decoder_input_ids"].tolist() == [[0]] * rows[-1]
        return forward(*args, **kwargs)

    model.forward = counted
    try:
        reward(PREDICTIONS, REFERENCES, SOURCES)
    finally:
        del model.forward
    assert rows == [2, 2, 1]  # 5 distinct texts of the 7 inputs, 2 per forward


def test_a_checkpoint_with_its_own_output_head_is_read_through_that_head(tmp_path, tokenizer):
    """MetricX checkpoints hold `shared.weight` and a different `lm_head.weight` (tie_word_embeddings false), which
    transformers 5's mT5 config would tie: loading must keep the checkpoint's own head."""
    import safetensors.torch

    model = tiny_mt5(seed=1)
    model.save_pretrained(tmp_path)
    weights = safetensors.torch.load_file(tmp_path / "model.safetensors")
    head = torch.randn_like(weights["shared.weight"]) * 0.01
    texts = reference_texts()
    hidden = torch.stack([last_hidden(model, tokenizer, text) for text in texts])
    head[SCORE_ID] = torch.linalg.lstsq(hidden, torch.tensor([[5.0], [9.0], [13.0], [2.0], [20.0]])).solution[:, 0]
    weights["lm_head.weight"] = head
    safetensors.torch.save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(tie_word_embeddings=False, architectures=["MT5ForRegression"])
    (tmp_path / "config.json").write_text(json.dumps(config))

    reward = MetricXReward(str(tmp_path), tokenizer=tokenizer, score_token_id=SCORE_ID, qe=False)
    assert torch.equal(reward.model.get_output_embeddings().weight, head)
    expected = [-min(max(float(h @ head[SCORE_ID]), 0.0), 25.0) for h in hidden]
    assert [-e for e in expected] == pytest.approx([5.0, 9.0, 13.0, 2.0, 20.0], abs=1e-3)
    texts_of = {"the cat sat": 0, "a dog": 2, "xyz qq": 3, "hello": 4}
    predictions = ["a dog", "xyz qq", "hello"]
    values = reward(predictions, [["the dog"], ["zz"], []], ["der Hund", "abc", "hallo"])
    assert values == pytest.approx([expected[texts_of[p]] for p in predictions], abs=1e-4)
    half = MetricXReward(str(tmp_path), tokenizer=tokenizer, score_token_id=SCORE_ID, dtype="bfloat16")
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert half(predictions, [["the dog"], ["zz"], []], ["der Hund", "abc", "hallo"]) == pytest.approx(values, abs=1.0)


def test_a_score_id_outside_the_vocabulary_is_refused(tokenizer):
    with pytest.raises(ValueError, match="score_token_id=250089 is outside the model's vocabulary of 384"):
        MetricXReward(tiny_mt5(), tokenizer=tokenizer)


def test_metricx_trains_beside_chrf(tmp_path, model, tokenizer):
    from helpers import tiny_model
    from hf_seqrl import SCSTTrainer, SeqRLConfig

    src, tgt = toy_pairs(4, seed=3, alphabet="abcd", lengths=(2, 5))
    data = toy_dataset(tokenizer, src, tgt).add_column("sources", src)
    metricx = MetricXReward(model, tokenizer=tokenizer, score_token_id=SCORE_ID, normalize=True)
    args = SeqRLConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=1, logging_steps=1,
                       report_to=[], save_strategy="no", max_new_tokens=6, disable_tqdm=True,
                       dataloader_pin_memory=False, seed=0, reward_weights=[0.5, 0.5])
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs=["chrf", metricx], train_dataset=data,
                          processing_class=tokenizer)
    trainer.train()
    logged = trainer.state.log_history[0]
    assert 0.0 <= logged["rl/rewards/metricx/mean"] <= 1.0
    assert isinstance(build_reward(["chrf", metricx]).rewards[1], MetricXReward)
