"""Prefix corruption, noise-level forcing and k-step rollout on tiny models: teacher forcing at σ = 0 and k = 1,
the exact k-step contexts against a step-by-step decode, training on T5 / BART / Marian, config errors."""

import pytest
import torch
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.modeling_outputs import BaseModelOutput

from helpers import params, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import KStepRolloutConfig, KStepRolloutTrainer, PrefixCorruptionConfig, PrefixCorruptionTrainer
from hf_seqrl.models.tokens import shift_right
from hf_seqrl.trainers.input_schedules import EncodedBatch

CONFIGS = {"pc": PrefixCorruptionConfig, "ks": KStepRolloutConfig, "plain": Seq2SeqTrainingArguments}
TRAINERS = {"pc": PrefixCorruptionTrainer, "ks": KStepRolloutTrainer}


def make_args(tmp_path, kind, **kwargs):
    base = dict(output_dir=str(tmp_path / kind), per_device_train_batch_size=4, max_steps=1, learning_rate=0.1,
                optim="sgd", report_to=[], save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0,
                max_grad_norm=0.0, dataloader_pin_memory=False)
    base.update(kwargs)
    return CONFIGS[kind](**base)




@pytest.mark.parametrize("arch", ["t5", "bart", "marian"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_zero_rate_and_one_step_rollout_are_teacher_forcing(tmp_path, tokenizer, arch, smoothing):
    """σ = 0 (random replacement) and k = 1 give the loss and the gradient (one SGD step) of plain teacher forcing,
    label smoothing included (the chunked cross-entropy against `LabelSmoother` over the logits)."""
    src, tgt = toy_pairs(8, seed=1)
    ds = toy_dataset(tokenizer, src, tgt)
    model = tiny_model(arch, seed=3)
    plain = Seq2SeqTrainer(model=model, args=make_args(tmp_path, "plain", label_smoothing_factor=smoothing),
                           train_dataset=ds, processing_class=tokenizer,
                           data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
    plain.train()
    expected_loss, expected = plain.state.log_history[0]["loss"], params(model)
    for kind, settings in (("pc", dict(corruption_rate=0.0)), ("ks", dict(rollout_steps=1))):
        model = tiny_model(arch, seed=3)
        trainer = TRAINERS[kind](model=model, args=make_args(tmp_path, kind, label_smoothing_factor=smoothing,
                                                             **settings), train_dataset=ds,
                                 processing_class=tokenizer)
        trainer.train()
        assert trainer.state.log_history[0]["loss"] == pytest.approx(expected_loss, abs=1e-6), kind
        for key, value in params(model).items():
            torch.testing.assert_close(value, expected[key], atol=1e-6, rtol=1e-6)


# ---- k-step rollout: the rows against a step-by-step decode --------------------------------------------------

def variable_length_batch(tokenizer, n=3):
    src, tgt = toy_pairs(n, seed=7, lengths=(2, 8))
    features = toy_dataset(tokenizer, src, tgt).to_list()
    batch = DataCollatorForSeq2Seq(tokenizer)(features)
    return batch["input_ids"], batch["attention_mask"], batch["labels"]


def rollout_rows_of(trainer, model, input_ids, attention_mask, labels):
    """Returns (gold decoder inputs, DecoderRows) the trainer builds for a batch."""
    gold = shift_right(labels, model.config.decoder_start_token_id, model.config.pad_token_id)
    with torch.no_grad():
        states = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    encoded = {"encoder_outputs": BaseModelOutput(last_hidden_state=states), "attention_mask": attention_mask}
    return gold, trainer.decoder_rows(EncodedBatch(trainer.family, model, encoded), gold, labels)


@torch.no_grad()
def step_by_step(model, input_ids, attention_mask, gold_prefix, steps, limit):
    """Returns (inputs, logits) of a plain decode: from `gold_prefix`, feed the argmax back `steps` times
    (no further than `limit` inputs), the whole model run afresh at every step."""
    context = gold_prefix.clone()
    for _ in range(steps):
        if len(context) >= limit:
            break
        logits = model(input_ids=input_ids[None], attention_mask=attention_mask[None],
                       decoder_input_ids=context[None]).logits[0]
        context = torch.cat([context, logits[-1].argmax().view(1)])
    logits = model(input_ids=input_ids[None], attention_mask=attention_mask[None],
                   decoder_input_ids=context[None]).logits[0]
    return context, logits


@pytest.mark.parametrize("arch,k", [("t5", 3), ("bart", 4), ("marian", 2)])
def test_exact_rollout_rows_equal_a_step_by_step_decode_from_each_anchor(tmp_path, tokenizer, arch, k):
    model = tiny_model(arch, seed=5).eval()
    trainer = KStepRolloutTrainer(model=model, args=make_args(tmp_path, "ks", rollout_steps=k),
                                  processing_class=tokenizer)
    input_ids, attention_mask, labels = variable_length_batch(tokenizer)
    gold, rows = rollout_rows_of(trainer, model, input_ids, attention_mask, labels)
    batch, length = labels.shape
    # rows 0..B-1: the gold rows, trained at the anchors 0, k, 2k, ...
    assert torch.equal(rows.input_ids[:batch], gold) and rows.source_index[:batch].tolist() == list(range(batch))
    # one gradient-pass row per anchor whose chunk holds a real target
    lengths = (labels != -100).sum(dim=1)
    expected_rows = [(b, a) for b in range(batch) for a in range(0, length, k) if a + 1 < lengths[b]]
    got_rows = list(zip(rows.source_index[batch:].tolist(),
                        [int(l.ne(-100).nonzero()[0]) - 1 for l in rows.labels[batch:]]))
    assert got_rows == expected_rows
    encoder = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    for row, (b, a) in enumerate(expected_rows, start=batch):
        real_inputs = int(lengths[b])  # inputs 0..L-1 stand for the start token and labels 0..L-2
        context, naive_logits = step_by_step(model, input_ids[b], attention_mask[b], gold[b, : a + 1], k - 1,
                                             real_inputs)
        n = len(context)
        # the row is the gold prefix up to a, then exactly the tokens a step-by-step greedy decode feeds itself
        assert torch.equal(rows.input_ids[row, :n], context), (b, a)
        # it trains the chunk a+1 .. a+k-1 (its real part) on the gold targets
        trained = (rows.labels[row] != -100).nonzero().flatten().tolist()
        assert trained == [t for t in range(a + 1, min(a + k, real_inputs))]
        assert torch.equal(rows.labels[row, trained], labels[b, trained])
        # and the gradient pass predicts those positions as the step-by-step decode does
        pass_logits = model(encoder_outputs=BaseModelOutput(last_hidden_state=encoder[b: b + 1]),
                            attention_mask=attention_mask[b: b + 1], decoder_input_ids=rows.input_ids[row: row + 1]
                            ).logits[0]
        torch.testing.assert_close(pass_logits[trained], naive_logits[trained], atol=1e-5, rtol=1e-4)
    metrics = rows.metrics
    assert metrics["ks/rows_per_source"] == pytest.approx(1 + len(expected_rows) / batch)
    assert 0.0 <= metrics["ks/own_token_accuracy"] <= 1.0


def test_shared_row_first_chunk_is_exact_and_later_chunks_see_own_tokens(tmp_path, tokenizer):
    model = tiny_model("t5", seed=5).eval()
    k = 3
    batch_inputs = variable_length_batch(tokenizer)
    labels = batch_inputs[2]
    trainers = {context: KStepRolloutTrainer(model=model, processing_class=tokenizer, args=make_args(
        tmp_path, "ks", rollout_steps=k, rollout_context=context)) for context in ("exact", "shared_row")}
    gold, exact = rollout_rows_of(trainers["exact"], model, *batch_inputs)
    _, shared = rollout_rows_of(trainers["shared_row"], model, *batch_inputs)
    assert shared.source_index is None and torch.equal(shared.labels, labels)  # one row per source, every target
    replaceable = torch.zeros_like(labels, dtype=torch.bool)
    replaceable[:, 1:] = labels[:, :-1] != -100
    anchors = torch.arange(labels.shape[1]) % k == 0
    # anchors (and padding) stay gold
    assert torch.equal(shared.input_ids[:, anchors], gold[:, anchors])
    assert torch.equal(shared.input_ids[~replaceable], gold[~replaceable])
    for b in range(len(labels)):
        first = next(r for r in range(len(labels), len(exact.input_ids))
                     if exact.source_index[r] == b and exact.labels[r, 1] != -100)
        # chunk 0 has no earlier chunk: its contexts are those of the exact rollout
        assert torch.equal(shared.input_ids[b, :k], exact.input_ids[first, :k])
    # a later chunk sees the own tokens of chunk 0 (they differ from gold: the model is untrained), where the exact
    # rollout re-anchors on the gold prefix
    assert not torch.equal(shared.input_ids[:, 1:k], gold[:, 1:k])


# ---- training under the public API ------------------------------------------------------------------------------

VARIANTS = {
    # σ ramps linearly from 0 to 0.4 over 2 steps: 0.0 at step 0, 0.2 at step 1
    "prefix_corruption": ("pc", dict(corruption_rate=0.4, schedule="linear", schedule_k=2)),
    "noise_level_model": ("pc", dict(corruption_rate=0.8, per_token_levels=True, replacement="model",
                                     sampling="sample")),
    "kstep_exact": ("ks", dict(rollout_steps=3)),
    "kstep_shared_row": ("ks", dict(rollout_steps=2, rollout_context="shared_row", sampling="sample")),
}
ALGORITHMS = {"prefix_corruption": "Prefix corruption", "noise_level_model": "Noise-level forcing",
              "kstep_exact": "k-step rollout", "kstep_shared_row": "k-step rollout"}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("arch", ["t5", "bart", "marian"])
def test_trains_and_logs_its_metrics(tmp_path, tokenizer, arch, variant):
    kind, settings = VARIANTS[variant]
    src, tgt = toy_pairs(8, seed=2)
    model = tiny_model(arch, seed=1)
    before = params(model)
    trainer = TRAINERS[kind](model=model, args=make_args(tmp_path, kind, max_steps=2, learning_rate=0.05, **settings),
                             train_dataset=toy_dataset(tokenizer, src, tgt), processing_class=tokenizer)
    trainer.train()
    assert trainer.method.name == ALGORITHMS[variant]
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(h["rl/phase"] == 1.0 and torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    assert any(not torch.equal(before[k], v) for k, v in params(model).items())
    if variant == "prefix_corruption":
        assert [h["pc/corruption_rate"] for h in logs] == pytest.approx([0.0, 0.2])
        assert logs[0]["pc/replaced_fraction"] == 0.0 and 0.0 <= logs[1]["pc/replaced_fraction"] <= 1.0
    elif variant == "noise_level_model":
        assert all(h["pc/corruption_rate"] == pytest.approx(0.8) for h in logs)
        assert all(0.0 < h["pc/replaced_fraction"] < 1.0 for h in logs)
    else:
        assert all(0.0 <= h["ks/own_token_accuracy"] <= 1.0 for h in logs)
        rows = [h["ks/rows_per_source"] for h in logs]
        # exact: the gold row plus one row per anchor whose chunk holds a target: targets of 4-7 tokens, k = 3,
        # so anchor 0 always (chunk 1-2), anchor 3 for 5+ tokens (chunk 4-5), anchor 6 never (chunk 7-8)
        assert all(2.0 < r <= 3.0 for r in rows) if variant == "kstep_exact" else rows == [1.0, 1.0]


@pytest.mark.parametrize("kind,settings", [("ks", dict(rollout_steps=3)),  # deterministic: greedy own tokens
                                            ("pc", dict(warmup_xe_steps=1))])  # the teacher-forced warm-up step
def test_gradient_accumulation_matches_the_large_batch(tmp_path, tokenizer, kind, settings):
    # Equal-length targets: the mean over each half's tokens, averaged over 2 accumulation steps, is the mean over
    # the 8 rows' tokens. (Given the token count, the Trainer would not divide T5's per-batch mean by the 2 steps.)
    src, _ = toy_pairs(8, seed=5, alphabet="abcd", lengths=(4, 4))
    ds = toy_dataset(tokenizer, src, src)
    results = []
    for batch_size, steps in ((8, 1), (4, 2)):
        model = tiny_model("t5", seed=1)
        args = make_args(tmp_path / f"{batch_size}", kind, per_device_train_batch_size=batch_size,
                         gradient_accumulation_steps=steps, learning_rate=0.5, **settings)
        TRAINERS[kind](model=model, args=args, train_dataset=ds, processing_class=tokenizer).train()
        results.append(params(model))
    for key, value in results[0].items():
        torch.testing.assert_close(results[1][key], value, atol=2e-6, rtol=1e-5)


def test_random_replacements_exclude_every_special_token(tmp_path, tokenizer):
    model = tiny_model("bart")  # decoder start = EOS = 1, BOS 2
    trainer = PrefixCorruptionTrainer(model=model, args=make_args(tmp_path, "pc"), processing_class=tokenizer)
    vocabulary = set(trainer.replacement_vocabulary(model).tolist())
    assert not vocabulary & ({0, 1, 2} | set(tokenizer.all_special_ids))
    assert vocabulary == set(range(len(tokenizer))) - {0, 1, 2} - set(tokenizer.all_special_ids)


@pytest.mark.parametrize("kind,settings,field", [
    ("pc", dict(corruption_rate=1.5), "corruption_rate"),
    ("pc", dict(corruption_rate=-0.1), "corruption_rate"),
    ("pc", dict(replacement="bert"), "replacement"),
    ("pc", dict(schedule="cosine"), "schedule"),
    ("pc", dict(sampling="beam"), "sampling"),
    ("pc", dict(schedule="linear", schedule_k=0), "schedule_k"),
    ("ks", dict(rollout_steps=0), "rollout_steps"),
    ("ks", dict(rollout_steps=1.5), "rollout_steps"),
    ("ks", dict(sampling="beam"), "sampling"),
    ("ks", dict(rollout_context="cached"), "rollout_context"),
])
def test_bad_settings_fail_at_construction_naming_the_field(tmp_path, kind, settings, field):
    with pytest.raises(ValueError, match=rf"{CONFIGS[kind].__name__}\.{field}"):
        make_args(tmp_path, kind, **settings)
