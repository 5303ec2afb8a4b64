"""MIXER: the Δ schedule, the loss by hand, continuations of a forced prefix, and the trainer."""

import pytest
import torch

from helpers import params, tiny_model, toy_pairs
from hf_seqrl import losses
from hf_seqrl.models import family_for
from hf_seqrl.models.seq2seq import rollout_generation_config
from hf_seqrl.schedules import mixer_delta


def test_delta_grows_by_delta_every_increment():
    assert [mixer_delta(s, 2, 100) for s in (0, 99, 100, 250, 1000)] == [2, 2, 4, 6, 22]
    with pytest.raises(ValueError, match="delta >= 1"):
        mixer_delta(0, 0, 100)


def test_mixer_loss_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -0.5, -1.0, 0.0]])
    prefix = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    cont = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([0.5, -2.0])
    # row 0: xe = 1 + 2 = 3, pg = -0.5 * (-3 - 4) = 3.5 -> 6.5; row 1: xe = 0.5, pg = 2 * (-0.5 - 1) = -3 -> -2.5
    assert losses.mixer_loss(logp, prefix, cont, adv).item() == pytest.approx((6.5 - 2.5) / 2)
    # no prefix: exactly the policy-gradient loss with sums over tokens
    none = torch.zeros_like(prefix)
    assert losses.mixer_loss(logp, none, cont, adv).item() == pytest.approx(
        losses.policy_gradient_loss(logp, cont, adv).item())


@pytest.mark.parametrize("arch", ["t5", "bart", "marian"])
def test_continuations_start_with_the_forced_prefix(arch, tokenizer):
    model = tiny_model(arch, seed=2)
    sources, _ = toy_pairs(3, seed=4, alphabet="abcd", lengths=(3, 5))
    enc = tokenizer(sources, return_tensors="pt", padding=True)
    prefix = torch.tensor([[5, 6], [7, 8], [9, 10]])
    config = rollout_generation_config(model, max_new_tokens=4)
    out = family_for(model).sample_from_prefix(model, enc, prefix, config, 2, True)
    assert out.sample_ids.shape[0] == 6 and out.greedy_ids.shape[0] == 3
    assert torch.equal(out.sample_ids[:, :2], prefix.repeat_interleave(2, dim=0))
    assert torch.equal(out.greedy_ids[:, :2], prefix)
    assert out.sample_ids.shape[1] <= 2 + 4 and out.sample_mask[:, :2].all()
    # the greedy continuation is the argmax path of the model given the prefix
    forced = torch.cat([torch.full((3, 1), model.generation_config.decoder_start_token_id), prefix], dim=1)
    greedy = model.generate(**enc, decoder_input_ids=forced, do_sample=False, max_new_tokens=4)
    length = out.greedy_ids.shape[1]
    expected = greedy[:, 1:1 + length]
    assert torch.equal(out.greedy_ids[out.greedy_mask], expected[out.greedy_mask])


def test_without_greedy_rows_samples_match_a_plain_rollout_of_the_same_rng(tokenizer):
    # P >= 1 rows continue from the prefix; the sampling itself is generate's, from the global RNG
    model = tiny_model("t5", seed=2)
    sources, _ = toy_pairs(2, seed=4, alphabet="abcd", lengths=(3, 5))
    enc = tokenizer(sources, return_tensors="pt", padding=True)
    config = rollout_generation_config(model, max_new_tokens=5)
    torch.manual_seed(3)
    first = family_for(model).sample_from_prefix(model, enc, torch.tensor([[5], [6]]), config, 3, False)
    torch.manual_seed(3)
    again = family_for(model).sample_from_prefix(model, enc, torch.tensor([[5], [6]]), config, 3, False)
    assert torch.equal(first.sample_ids, again.sample_ids)
    plain = family_for(model).sample(model, enc, config, 3, False)
    assert plain.sample_ids.shape[0] == first.sample_ids.shape[0] == 6


# ---- the trainer ----------------------------------------------------------------------------------------------

def mixer_config(tmp_path, **kwargs):
    from hf_seqrl import MixerConfig

    settings = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3,
                    logging_steps=1, report_to=[], save_strategy="no", max_new_tokens=8, disable_tqdm=True,
                    dataloader_pin_memory=False, seed=0, num_samples=2)
    settings.update(kwargs)
    return MixerConfig(**settings)


def copy_data(tokenizer, n=12, seed=0):
    from helpers import toy_dataset

    src, tgt = toy_pairs(n, seed=seed, alphabet="abcd", lengths=(3, 5))
    return toy_dataset(tokenizer, src, tgt)




def test_prefix_lengths():
    from hf_seqrl.objectives.mixer import prefix_lengths

    labels = torch.tensor([[5, 6, 7, 1], [5, 1, -100, -100]])
    assert prefix_lengths(labels, 2).tolist() == [2, 0]
    assert prefix_lengths(labels, 1).tolist() == [3, 1]


def test_whole_sequences_sampled_is_reinforce(tmp_path, tokenizer):
    from hf_seqrl import MixerTrainer, ReinforceTrainer, SeqRLConfig

    results, losses_seen = [], []
    for cls in (MixerTrainer, ReinforceTrainer):
        model = tiny_model("t5", seed=5)
        kwargs = dict(output_dir=str(tmp_path / cls.__name__), per_device_train_batch_size=4, max_steps=2,
                      optim="sgd", learning_rate=0.5, max_grad_norm=0.0, lr_scheduler_type="constant", logging_steps=1,
                      report_to=[], save_strategy="no", max_new_tokens=8, disable_tqdm=True,
                      dataloader_pin_memory=False, seed=0, num_samples=2, baseline="mean")
        if cls is MixerTrainer:
            args = mixer_config(tmp_path, **kwargs, mixer_delta=100)  # Δ above every target length
        else:
            args = SeqRLConfig(**kwargs)
        trainer = cls(model=model, args=args, reward_funcs="chrf", train_dataset=copy_data(tokenizer),
                      processing_class=tokenizer)
        trainer.train()
        results.append(params(model))
        losses_seen.append([h["loss"] for h in trainer.state.log_history if "loss" in h])
    assert losses_seen[0] == pytest.approx(losses_seen[1], abs=1e-6)
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("arch,baseline", [("t5", "greedy"), ("bart", "moving_average"), ("marian", "mean")])
def test_trains_from_gold_prefixes_and_logs(tmp_path, tokenizer, arch, baseline):
    from hf_seqrl import MixerTrainer

    model = tiny_model(arch)
    before = params(model)
    args = mixer_config(tmp_path, max_steps=5, baseline=baseline, mixer_delta=2, mixer_increment_steps=2,
                        warmup_xe_steps=1, rl_weight=0.9)
    trainer = MixerTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=copy_data(tokenizer),
                           processing_class=tokenizer)
    seen = []
    original = trainer.objective.sample_continuations

    def spy(runner, ctx, labels, prefixes):
        rollout = original(runner, ctx, labels, prefixes)
        seen.append((labels, prefixes, rollout))
        return rollout

    trainer.objective.sample_continuations = spy
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["rl/phase"] for h in logs] == [0.0, 1.0, 1.0, 1.0, 1.0]
    # Δ: 2 for the first 2 steps after the warm-up, then 4
    assert [h["mixer/delta"] for h in logs[1:]] == [2.0, 2.0, 4.0, 4.0]
    assert all(0.0 <= h["mixer/prefix_fraction"] < 1.0 for h in logs[1:])
    assert logs[1]["mixer/prefix_fraction"] > 0.0
    for labels, prefixes, rollout in seen:
        for row, length in enumerate(prefixes.tolist()):
            for sample in range(2):  # every sample of a source starts with its gold prefix
                assert rollout.sample_ids[row * 2 + sample, :length].tolist() == labels[row, :length].tolist()
            if rollout.greedy_ids is not None:
                assert rollout.greedy_ids[row, :length].tolist() == labels[row, :length].tolist()
    after = params(model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert trainer.method.name == "MIXER"


@pytest.mark.parametrize("field,value,message", [
    ("mixer_delta", 0, "mixer_delta must be >= 1"),
    ("mixer_increment_steps", 0, "mixer_increment_steps must be >= 1"),
])
def test_bad_settings_name_the_field(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        mixer_config(tmp_path, **{field: value})


@pytest.mark.parametrize("field,value", [("num_iterations", 2), ("loss_normalization", "token")])
def test_fields_mixer_has_no_use_for_are_not_its_own(tmp_path, field, value):
    # MIXER sums each row's prefix and continuation log-probs, one update per rollout of a micro-batch's own prefixes.
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{field}'"):
        mixer_config(tmp_path, **{field: value})


@pytest.mark.parametrize("field,value", [("length_normalize", True), ("steps_per_generation", 2),
                                         ("generation_batch_size", 8)])
def test_whole_sequence_rollout_fields_are_refused_with_the_reason(tmp_path, field, value):
    # The rewarded trainers share these fields (RolloutConfig); MIXER decodes its continuations when a micro-batch trains.
    with pytest.raises(ValueError, match=rf"MixerConfig\.{field}={value}: MIXER continues each micro-batch's own"):
        mixer_config(tmp_path, gradient_accumulation_steps=2, **{field: value})


def test_checkpoint_resume_matches_uninterrupted_run(tmp_path, tokenizer):
    from hf_seqrl import MixerTrainer

    data = copy_data(tokenizer, n=24)

    def run(resume=None):
        model = tiny_model("t5", seed=2)
        args = mixer_config(tmp_path, max_steps=6, save_strategy="steps", save_steps=3, mixer_delta=1,
                            mixer_increment_steps=2)
        trainer = MixerTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=data,
                               processing_class=tokenizer)
        trainer.train(resume_from_checkpoint=resume)
        return params(model), trainer.baseline_ema

    full, full_ema = run()
    resumed, resumed_ema = run(resume=str(tmp_path / "out" / "checkpoint-3"))
    for key in full:
        torch.testing.assert_close(resumed[key], full[key], atol=1e-6, rtol=1e-6)
    assert resumed_ema == pytest.approx(full_ema, abs=1e-6)
