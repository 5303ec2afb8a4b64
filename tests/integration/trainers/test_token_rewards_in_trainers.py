"""Token-level rewards through the trainers: character spans mapped to the tokens of BPE, SentencePiece-style and
byte-level tokenizers (a span across token boundaries, an empty span, Unicode), per-token advantages reaching the loss
of SCST, leave-one-out, REINFORCE, clipped reuse, MIXER and distillation on both families, and MRT refusing them."""

import json
from functools import partial

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tokenizers.implementations import SentencePieceBPETokenizer
from transformers import PreTrainedTokenizerFast

from helpers import byt5_tokenizer, make_config, params, text_pairs, tiny_causal_model, tiny_model
from hf_seqrl import (DistillationConfig, DistillationTrainer, MixerConfig, MixerTrainer, MRTConfig, MRTTrainer,
                      ReinforceTrainer, SCSTTrainer, SeqRLConfig)
from hf_seqrl.trainers.services.reward_scorer import RewardScorer
from hf_seqrl.types import BatchText

TEXTS = ["the café is open", "a cat sat on the mat", "猫 sat on the mat"]


def bpe():
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(TEXTS * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"],
                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def sentencepiece():
    core = SentencePieceBPETokenizer()
    core.train_from_iterator(TEXTS * 20, vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"])
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core._tokenizer, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>")


def word_span(text: str, word: str) -> tuple[int, int]:
    start = text.index(word)
    return start, start + len(word)


@pytest.mark.parametrize("make_tokenizer", [bpe, sentencepiece, byt5_tokenizer], ids=["bpe", "sentencepiece", "byte"])
def test_spans_reach_the_tokens_that_write_their_characters(tmp_path, make_tokenizer):
    tok = make_tokenizer()
    encoded = tok(TEXTS, padding=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"].bool()
    predictions = tok.batch_decode(ids, skip_special_tokens=True)
    assert predictions == TEXTS
    marked = ["café", "cat sat", "猫"]  # one word, two words across a token boundary, a multi-byte character

    def spans(predictions, references, sources=None, **columns):
        return [{"score": 0.5, "spans": [(*word_span(p, w), -1.0), (len(p), len(p), -2.0)]}
                for p, w in zip(predictions, marked)]

    scorer = RewardScorer(spans, make_config(SeqRLConfig, tmp_path))
    values = scorer.score(ids, BatchText([["x"]] * 3, None, {}), tok, step=1, token_mask=mask)
    assert values.rewards.tolist() == [0.5, 0.5, 0.5]
    for row, word in enumerate(marked):
        counted = int(mask[row].sum())
        token_values = values.token_values[row]
        hit = (token_values[:counted - 1] == -1.0).nonzero().flatten().tolist()
        assert hit == list(range(hit[0], hit[-1] + 1))  # one run of tokens
        assert word in tok.decode(ids[row, hit[0]:hit[-1] + 1]).strip()  # that writes the word
        assert tok.decode(ids[row, hit[0] + 1:hit[-1]]).strip() != word  # and no fewer tokens would
        assert token_values[counted - 1] == -2.0  # the empty span at the end: the EOS
        assert (token_values[counted:] == 0).all() and (values.token_values != 0).sum() == sum(
            len((v == -1.0).nonzero()) + 1 for v in values.token_values)


def penalize_vowels(predictions, references, sources=None, **columns):
    """A sentence score (characters in common with the reference), -0.5 on every vowel the prediction writes, and
    -0.5 at its end (an empty span: the last token, whatever a random model writes)."""
    out = []
    for prediction, refs in zip(predictions, references):
        common = len(set(prediction) & set(refs[0])) / max(len(set(prediction) | set(refs[0])), 1)
        spans = [(i, i + 1, -0.5) for i, c in enumerate(prediction) if c in "ae"]
        out.append({"score": common, "spans": spans + [(len(prediction), len(prediction), -0.5)]})
    return out


SETTINGS = {
    "scst": (SCSTTrainer, SeqRLConfig, {}),
    "loo": (SCSTTrainer, SeqRLConfig, dict(baseline="mean", num_samples=2, token_reward_to_go=True)),
    "reinforce": (ReinforceTrainer, SeqRLConfig, dict(num_samples=2)),
    "clipped": (SCSTTrainer, SeqRLConfig, dict(baseline="mean", num_samples=2, num_iterations=2)),
    "mixer": (MixerTrainer, MixerConfig, dict(num_samples=2, baseline="mean", mixer_delta=2)),
    "distill": (DistillationTrainer, DistillationConfig, dict(num_samples=2, baseline="mean")),
}


def spread(advantages, mask):
    """Returns each row's largest minus smallest advantage over its counted tokens (`mask`), 0 for an empty row."""
    high = advantages.masked_fill(~mask, float("-inf")).max(dim=1).values
    low = advantages.masked_fill(~mask, float("inf")).min(dim=1).values
    return torch.where(mask.any(dim=1), high - low, torch.zeros_like(high))


def run(tmp_path, name: str, causal: bool):
    trainer_class, config_class, settings = SETTINGS[name]
    build = partial(tiny_causal_model, "llama") if causal else partial(tiny_model, "t5", dropout=0.1)
    extra = {"teacher_model": build(seed=2)} if name == "distill" else {}
    args = make_config(config_class, tmp_path, max_steps=2, logging_steps=1, per_device_train_batch_size=4,
                       log_completions=True, **settings)
    trainer = trainer_class(model=build(seed=1), args=args, train_dataset=text_pairs(causal, alphabet="abcde"),
                            processing_class=byt5_tokenizer(), reward_funcs=penalize_vowels, **extra)
    seen = []
    stage = trainer.objective.loss

    def recording(scored, batch, ctx):
        seen.append((batch.advantages, batch.loss_mask))
        return stage(scored, batch, ctx)

    trainer.objective.loss = recording
    before = params(trainer.model)
    trainer.train()
    return trainer, seen, before


@pytest.mark.parametrize("name,causal", [("scst", False), ("loo", True)])
def test_per_token_advantages_reach_the_loss(tmp_path, name, causal):
    trainer, seen, before = run(tmp_path, name, causal)
    assert len(seen) == 2 and all(adv.dim() == 2 for adv, _ in seen)
    if not trainer.args.token_reward_to_go:  # within a sample they differ where the reward pointed: its last token
        assert all((spread(adv, mask) > 0.4).all() for adv, mask in seen)
    else:  # summed to the end: a token before a vowel carries its -0.5 too, so the first token is the lowest
        for adv, mask in seen:
            lowest = adv.masked_fill(~mask, float("inf")).min(dim=1).values
            assert (adv[:, 0] <= lowest + 1e-6).all()
        assert any((spread(adv, mask) > 0.4).any() for adv, mask in seen)
    logs = [h for h in trainer.state.log_history if "rl/token_reward" in h]
    assert len(logs) == 2 and all(h["rl/token_reward"] < 0 and 0 < h["rl/frac_tokens_rewarded"] <= 1 for h in logs)
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    # the sample log's `reward` is the number (the sentence score), the spans a field of their own
    rows = [json.loads(line) for line in (tmp_path / "out" / "completions" / "step-2.jsonl").read_text().splitlines()]
    assert rows and all(isinstance(row["reward"], float) and row["rewards"]["penalize_vowels"] == row["reward"]
                        for row in rows)
    assert all([len(row["prediction"]), len(row["prediction"]), -0.5] in row["reward_spans"]["penalize_vowels"]
               for row in rows)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["seq2seq", "causal"])
@pytest.mark.parametrize("name", ["scst", "loo", "reinforce", "clipped", "mixer", "distill"])
def test_every_rewarded_trainer_takes_token_level_rewards(tmp_path, name, causal):
    trainer, seen, before = run(tmp_path, name, causal)
    assert seen and all(adv is not None and adv.dim() == 2 for adv, _ in seen)
    # Within a sample's own tokens the advantages differ where the reward pointed (-0.5 on a vowel and on the last)
    assert any((spread(adv, mask) > 0.4).any() for adv, mask in seen)
    assert any("rl/token_reward" in h for h in trainer.state.log_history)
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_mrt_refuses_token_level_rewards(tmp_path):
    args = make_config(MRTConfig, tmp_path, max_steps=1, num_samples=2)
    trainer = MRTTrainer(model=tiny_model("t5"), args=args, train_dataset=text_pairs(False, alphabet="abcde"),
                         processing_class=byt5_tokenizer(), reward_funcs=penalize_vowels)
    with pytest.raises(ValueError, match="token-level values, which MRT cannot use"):
        trainer.train()


@pytest.mark.parametrize("make_tokenizer", [bpe, sentencepiece], ids=["bpe", "sentencepiece"])
def test_one_pass_of_the_incremental_decoder_gives_the_spans_of_the_decoded_prefixes(make_tokenizer):
    from hf_seqrl.rewards.spans import piece_char_spans, token_char_spans
    from hf_seqrl.trainers.services.reward_scorer import char_spans

    tok = make_tokenizer()
    # Unknown and multi-byte characters, doubled spaces, a leading space; and a random token sequence.
    texts = TEXTS + ["élan vital, 猫!  two  spaces", " the mat", "ca\u0301fe\u0301 猫猫"]
    rows = [tok(text)["input_ids"] for text in texts] + [torch.randint(3, len(tok), (12,)).tolist() + [1]]
    for ids in rows:
        text = tok.decode(ids, skip_special_tokens=True)
        prefixes = tok.batch_decode([ids[:t] for t in range(1, len(ids) + 1)], skip_special_tokens=True)
        assert char_spans(tok, ids, text) == token_char_spans(prefixes, text), text
    # Pieces that do not spell the text (a decoder that cleaned spaces afterwards) leave it to the prefixes.
    assert piece_char_spans(["a", " ,"], "a,") is None
    assert piece_char_spans(["", "é", "", "b"], "éb") == [(0, 1), (0, 1), (1, 2), (1, 2)]
