"""Best-of-n self-training (`BestOfNTrainer`, `objectives.best_of_n`): the step's update is the cross-entropy of the
selected samples, on both model families; the threshold leaves sources out; MBR ranks by expected utility; it trains
end to end with dropout on, from text columns, through the CLI's algorithm list and the card."""

from __future__ import annotations

import pytest
import torch

from datasets import Dataset

from helpers import (by_hand_mbr, byt5_tokenizer, length_agreement, make_config, overlap_reward, params,
                     source_overlap_reward, text_pairs, tiny_causal_model, tiny_model, toy_pairs)
from hf_seqrl import BestOfNConfig, BestOfNTrainer
from hf_seqrl.objectives.best_of_n import best_rows
from hf_seqrl.trainers import TRAINER_CLASSES


def build(tmp_path, causal: bool, dropout: float = 0.0, reward=overlap_reward, **settings):
    model = tiny_causal_model("llama", seed=1, dropout=dropout) if causal else tiny_model("t5", seed=1, dropout=dropout)
    args = make_config(BestOfNConfig, tmp_path, max_steps=2, per_device_train_batch_size=4, max_new_tokens=6,
                       logging_steps=1, report_to="none", save_strategy="no", **settings)
    return BestOfNTrainer(model=model, args=args, reward_funcs=reward, train_dataset=text_pairs(causal, n=8),
                          processing_class=byt5_tokenizer())


def first_batch(trainer) -> dict:
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer._prepare_inputs(batch)


def selected_rows(trainer) -> list:
    """Returns the list that collects each step's `RolloutBatch` of selected rows from now on."""
    seen, weigh = [], trainer.objective.weigh
    trainer.objective.weigh = lambda runner, rollout, ctx: seen.append(weigh(runner, rollout, ctx)) or seen[-1]
    return seen


def cross_entropy_by_hand(model, family, inputs, ids, mask, causal: bool) -> torch.Tensor:
    """The Seq2SeqTrainer loss with the selected samples as labels: the model's own `labels=` cross-entropy, the mean
    over every label token of the rows kept (a decoder-only row: prompt + sample, the prompt out of the loss)."""
    if not causal:
        labels = ids.masked_fill(~mask, -100)
        return model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels).loss
    prompt_ids, prompt_mask = family.prompts(model, inputs)
    total, count = 0.0, 0
    for i in range(ids.shape[0]):
        n = int(mask[i].sum())
        if n == 0:
            continue
        prompt = prompt_ids[i][prompt_mask[i].bool()]
        row = torch.cat([prompt, ids[i, :n]])[None]
        labels = row.clone()
        labels[:, :prompt.shape[0]] = -100
        total = total + model(input_ids=row, labels=labels).loss * n
        count += n
    return total / count


@pytest.mark.parametrize("causal", [False, True], ids=["seq2seq", "causal"])
def test_the_update_is_the_cross_entropy_of_the_selected_samples(tmp_path, causal):
    trainer = build(tmp_path, causal, num_samples=4, disable_dropout=True)
    model, inputs = trainer.model, first_batch(trainer)
    seen = selected_rows(trainer)
    trainer.state.global_step = 0
    model.train()
    loss = trainer.compute_loss(model, dict(inputs))
    loss.backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    batch = seen[0]
    assert batch.kept.all() and batch.sample_ids.shape[0] == 4
    expected = cross_entropy_by_hand(model, trainer.family, inputs, batch.sample_ids, batch.loss_mask, causal)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(ours[name], p.grad, rtol=1e-4, atol=1e-6)


def test_each_source_trains_on_its_best_sample_and_the_threshold_leaves_sources_out(tmp_path):
    trainer = build(tmp_path, False, num_samples=4)
    seen = selected_rows(trainer)
    scores = []
    values = trainer.reward_values

    def recording(token_ids, text, token_mask=None):
        out = values(token_ids, text, token_mask)
        scores.append(out.rewards.view(-1, 4))
        return out

    trainer.reward_values = recording
    trainer.train()
    for batch, rewards in zip(seen, scores):
        assert torch.equal(batch.rewards, rewards.max(dim=1).values)  # the best sample of each source
    log = [h for h in trainer.state.log_history if "best_of_n/frac_trained" in h]
    assert log and all(h["best_of_n/frac_trained"] == 1.0 and h["best_of_n/length_gain"] > 0 for h in log)

    # A threshold above every reward trains on nothing: the loss is 0 and no parameter moves.
    high = build(tmp_path / "high", False, num_samples=4, best_of_n_threshold=1e6, optim="sgd", learning_rate=0.5)
    before = params(high.model)
    high.train()
    assert all(torch.equal(before[k], v) for k, v in params(high.model).items())
    log = [h for h in high.state.log_history if "best_of_n/frac_trained" in h]
    assert log and all(h["best_of_n/frac_trained"] == 0.0 and h["best_of_n/loss"] == 0.0 for h in log)
    assert not any("best_of_n/length_gain" in h or "best_of_n/score" in h for h in log)  # nothing selected


def test_mbr_selection_picks_the_highest_expected_utility(tmp_path):
    trainer = build(tmp_path, False, num_samples=4, best_of_n_selection="mbr", reward=length_agreement)
    seen = selected_rows(trainer)
    samples = []
    unrewarded = trainer.unrewarded_batch

    def recording(rollout, ctx, predictions=None):
        samples.append(trainer.processing_class.batch_decode(rollout.sample_ids, skip_special_tokens=True))
        return unrewarded(rollout, ctx, predictions)

    trainer.unrewarded_batch = recording
    trainer.train()
    tokenizer = trainer.processing_class
    assert len(seen) == len(samples) == 2
    for batch, texts in zip(seen, samples):
        candidates = [texts[i:i + 4] for i in range(0, len(texts), 4)]
        picked = tokenizer.batch_decode(batch.sample_ids, skip_special_tokens=True)
        assert picked == by_hand_mbr(candidates, length_agreement)
    assert trainer.method.name == "MBR fine-tuning"


def sources_only(causal: bool, n: int = 8) -> Dataset:
    """The toy task's sources alone: a `source` column (encoder-decoder) or a `prompt` one (decoder-only)."""
    sources, _ = toy_pairs(n, seed=0, alphabet="abcd", lengths=(2, 5))
    return Dataset.from_dict({"prompt": [s + "=" for s in sources]} if causal else {"source": sources})


@pytest.mark.parametrize("selection,reward", [("reward", source_overlap_reward), ("mbr", "chrf")], ids=["qe", "mbr"])
@pytest.mark.parametrize("causal", [False, True], ids=["seq2seq", "causal"])
def test_qe_and_mbr_best_of_n_train_from_sources_alone(tmp_path, causal, selection, reward):
    model = tiny_causal_model("llama", seed=1, dropout=0.1) if causal else tiny_model("t5", seed=1, dropout=0.1)
    args = make_config(BestOfNConfig, tmp_path, max_steps=2, per_device_train_batch_size=4, max_new_tokens=6,
                       best_of_n_selection=selection, report_to="none", save_strategy="no", logging_steps=1)
    trainer = BestOfNTrainer(model=model, args=args, reward_funcs=reward, train_dataset=sources_only(causal),
                             processing_class=byt5_tokenizer())
    assert {"labels", "references"}.isdisjoint(trainer.train_dataset.column_names)
    before = params(trainer.model)
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in params(trainer.model).items())
    assert all("best_of_n/loss" in h for h in trainer.state.log_history if "loss" in h)


def test_reward_selection_with_a_reference_reward_refuses_sources_alone_naming_it(tmp_path):
    args = make_config(BestOfNConfig, tmp_path, max_steps=1)
    with pytest.raises(ValueError, match=r"reward_funcs \['chrf'\] scores the samples against references"):
        BestOfNTrainer(model=tiny_model("t5"), args=args, reward_funcs="chrf", train_dataset=sources_only(False),
                       processing_class=byt5_tokenizer())


@pytest.mark.parametrize("causal", [False, True], ids=["seq2seq", "causal"])
def test_it_trains_with_dropout_on_both_families_and_names_itself(tmp_path, causal):
    trainer = build(tmp_path, causal, dropout=0.1, num_samples=3, rl_weight=0.5, log_completions=True)
    assert trainer.args.disable_dropout is None and trainer.default_disable_dropout is False
    before = params(trainer.model)
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in params(trainer.model).items())
    logs = [h for h in trainer.state.log_history if "best_of_n/loss" in h]
    assert logs and all("rl/xe_loss" in h and "rl/reward" in h for h in logs)
    assert trainer.method.name == "Best-of-n self-training"
    assert trainer.training_record()["algorithm"] == "best_of_n"


def test_best_rows_take_the_first_maximum_and_skip_missing_scores():
    nan = float("nan")
    scores = torch.tensor([[0.1, 0.5, 0.5, 0.2], [nan, 0.3, nan, 0.1], [nan, nan, nan, nan]])
    assert best_rows(scores).tolist() == [1, 1, 0]


def test_the_config_refuses_one_sample_and_an_unknown_selection(tmp_path):
    with pytest.raises(ValueError, match=r"BestOfNConfig.num_samples=1: .*num_samples >= 2"):
        make_config(BestOfNConfig, tmp_path, num_samples=1)
    with pytest.raises(ValueError, match=r"best_of_n_selection"):
        make_config(BestOfNConfig, tmp_path, best_of_n_selection="oracle")
    assert BestOfNTrainer in TRAINER_CLASSES and BestOfNTrainer.algorithm_id == "best_of_n"


def test_the_cli_trains_mbr_fine_tuning_and_its_card_and_run_record_say_so(tmp_path, monkeypatch):
    """`hf-seqrl train --algorithm best_of_n --best_of_n_selection mbr` on the tiny YAML: the card names MBR
    fine-tuning and its settings, `seqrl_run.json` the trainer and algorithm."""
    import json
    import os

    from helpers import REPO
    from hf_seqrl.cli import main

    monkeypatch.chdir(REPO)
    config = os.path.join("recipes", "configs", "tiny_offline_translation.yaml")
    out = tmp_path / "out"
    assert main(["train", "--config", config, "--algorithm", "best_of_n", "--best_of_n_selection", "mbr",
                 "--num_samples", "3", "--output_dir", str(out), "--max_steps", "2", "--warmup_xe_steps", "0",
                 "--max_train_samples", "8", "--eval_strategy", "no", "--validation_file", "", "--test_file", "",
                 "--tiny_d_model", "32", "--max_new_tokens", "8"]) == 0
    card = (out / "README.md").read_text()
    training = json.loads((out / "seqrl_run.json").read_text())["training"]
    assert "fine-tuned with **MBR fine-tuning**" in card and "best_of_n_selection" in card
    assert (training["trainer"], training["algorithm"], training["method"]) == (
        "BestOfNTrainer", "best_of_n", "MBR fine-tuning")


@pytest.mark.parametrize("causal", [False, True], ids=["seq2seq", "causal"])
def test_a_lora_adapter_trains_on_selections_that_never_hold_a_banned_token(tmp_path, causal):
    """As checkpoints ship: dropout on, a token banned by the generation config (as opus-mt bans its pad), a LoRA
    adapter; the selected samples never hold the banned token and only the adapter moves."""
    peft = pytest.importorskip("peft")
    model = tiny_causal_model("llama", seed=1, dropout=0.1) if causal else tiny_model("t5", seed=1, dropout=0.1)
    banned = byt5_tokenizer()("e")["input_ids"][0]
    model.generation_config.bad_words_ids = [[banned]]
    base = {k: v.clone() for k, v in model.state_dict().items()}
    modules = ["q_proj", "v_proj"] if causal else ["q", "v"]
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=modules, task_type="CAUSAL_LM" if causal else
                           "SEQ_2_SEQ_LM")
    args = make_config(BestOfNConfig, tmp_path, max_steps=2, per_device_train_batch_size=4, max_new_tokens=6,
                       num_samples=4, learning_rate=5e-2, report_to="none", save_strategy="no", logging_steps=1)
    trainer = BestOfNTrainer(model=model, args=args, reward_funcs=overlap_reward, peft_config=lora,
                             train_dataset=text_pairs(causal, n=8, alphabet="abcde"),
                             processing_class=byt5_tokenizer())
    seen = selected_rows(trainer)
    trainer.train()
    assert seen and all(not (batch.sample_ids[batch.sample_mask] == banned).any() for batch in seen)
    trained = trainer.accelerator.unwrap_model(trainer.model)
    kept = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
            for k, v in trained.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(base[k], kept[k]) for k in base)  # the base weights did not move
    assert any(p.abs().sum() > 0 for n, p in trained.named_parameters() if "lora_B" in n)
