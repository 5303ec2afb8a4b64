"""Professor forcing: the losses by hand, training on T5 / BART / Marian, the discriminator's checkpoint, bad input."""

from functools import partial
import math

import pytest
import torch

from helpers import make_config, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import ProfessorForcingConfig, ProfessorForcingTrainer
from hf_seqrl.functional.adversarial import adversarial_loss, discriminator_loss
from hf_seqrl.trainers.professor_forcing import HiddenStateDiscriminator

# config(tmp_path, **overrides)
config = partial(make_config, ProfessorForcingConfig, max_steps=3, max_new_tokens=6, lr_scheduler_type="linear",
                 discriminator_hidden_size=16, discriminator_learning_rate=1e-2)


def copy_data(tokenizer, n=12, seed=0):
    src, tgt = toy_pairs(n, seed=seed, alphabet="abcd", lengths=(2, 5))
    return toy_dataset(tokenizer, src, tgt)


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_losses_by_hand():
    # real logits [0, 2] labelled 1, fake logit [-1] labelled 0:
    # mean(softplus(-0), softplus(-2), softplus(-1)) = mean(0.693147, 0.126928, 0.313262) = 0.377779
    loss = discriminator_loss(torch.tensor([0.0, 2.0]), torch.tensor([-1.0]))
    assert loss.item() == pytest.approx((math.log(2) + math.log1p(math.exp(-2)) + math.log1p(math.exp(-1))) / 3)
    # the model wants its free-running rows taken for real: softplus(-logit), logits [0, 3] -> (0.693147 + 0.048587)/2
    adv = adversarial_loss(torch.tensor([0.0, 3.0]))
    assert adv.item() == pytest.approx((math.log(2) + math.log1p(math.exp(-3))) / 2)


@pytest.mark.parametrize("kind", ["gru", "transformer"])
def test_discriminator_reads_only_valid_positions(kind):
    torch.manual_seed(0)
    disc = HiddenStateDiscriminator(8, 6, kind)
    hidden = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    garbage = hidden.clone()
    garbage[0, 3:] = 100.0  # padding positions of row 0 change; its logit must not
    assert torch.allclose(disc(hidden, mask), disc(garbage, mask), atol=1e-6)
    assert disc(hidden, mask).shape == (2,)


@pytest.mark.parametrize("arch", ["t5", "bart", "marian"])
def test_trains_and_logs(tmp_path, tokenizer, arch):
    model = tiny_model(arch)
    before = state(model)
    trainer = ProfessorForcingTrainer(model=model, args=config(tmp_path, warmup_xe_steps=1),
                                      train_dataset=copy_data(tokenizer), processing_class=tokenizer)
    d_before = state(trainer.discriminator)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["rl/phase"] for h in logs] == [0.0, 1.0, 1.0]
    for name in ("pf/d_loss", "pf/d_accuracy", "pf/adv_loss", "pf/xe_loss"):
        assert math.isfinite(logs[-1][name]), name
    assert 0.0 <= logs[-1]["pf/d_accuracy"] <= 1.0
    after, d_after = state(model), state(trainer.discriminator)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert any(not torch.equal(d_before[k], d_after[k]) for k in d_before)
    assert trainer.method.name == "Professor forcing"


def test_adversarial_term_reaches_the_model(tmp_path, tokenizer):
    # Same batch, same starting point: with adversarial_weight 0 the update is plain cross-entropy; with a large
    # weight the update differs, so the adversarial gradient flows back through the free-running hidden states.
    results = []
    for weight in (0.0, 50.0):
        model = tiny_model("t5", seed=3)
        args = config(tmp_path / str(weight), max_steps=1, adversarial_weight=weight, optim="sgd", learning_rate=0.1)
        ProfessorForcingTrainer(model=model, args=args, train_dataset=copy_data(tokenizer, n=4),
                                processing_class=tokenizer).train()
        results.append(state(model))
    assert any(not torch.allclose(results[0][k], results[1][k]) for k in results[0])


def test_discriminator_learns_to_tell_own_outputs_apart(tmp_path, tokenizer):
    # An untrained model's own outputs are nothing like the copy targets: the discriminator separates them.
    trainer = ProfessorForcingTrainer(model=tiny_model("t5"), args=config(tmp_path, max_steps=20, adversarial_weight=0.0,
                                                                          learning_rate=0.0, per_device_train_batch_size=8),
                                      train_dataset=copy_data(tokenizer, n=32), processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "pf/d_loss" in h]
    assert sum(h["pf/d_loss"] for h in logs[-5:]) < sum(h["pf/d_loss"] for h in logs[:5])
    assert logs[-1]["pf/d_accuracy"] > 0.5


def test_checkpoint_restores_the_discriminator(tmp_path, tokenizer):
    data = copy_data(tokenizer, n=24)

    def run(resume=None):
        model = tiny_model("t5", seed=2)
        args = config(tmp_path, max_steps=6, save_strategy="steps", save_steps=3)
        trainer = ProfessorForcingTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
        trainer.train(resume_from_checkpoint=resume)
        return state(model), state(trainer.discriminator), trainer.discriminator_optimizer.state_dict()

    full, full_d, full_opt = run()
    checkpoint = tmp_path / "out" / "checkpoint-3"
    assert (checkpoint / "discriminator.safetensors").exists() and (checkpoint / "seqrl_state.json").exists()
    resumed, resumed_d, resumed_opt = run(resume=str(checkpoint))
    for key in full:
        torch.testing.assert_close(resumed[key], full[key], atol=1e-6, rtol=1e-6)
    for key in full_d:
        torch.testing.assert_close(resumed_d[key], full_d[key], atol=1e-6, rtol=1e-6)
    assert resumed_opt["state"][0]["step"] == full_opt["state"][0]["step"] == 6


@pytest.mark.parametrize("field,value,message", [
    ("adversarial_weight", -1.0, "adversarial_weight must be >= 0"),
    ("discriminator", "lstm", "discriminator='lstm'"),
    ("sampling", "beam", "sampling='beam'"),
    ("max_new_tokens", 0, "max_new_tokens must be >= 1"),
])
def test_bad_settings_name_the_field(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **{field: value})


def test_model_without_hidden_states_is_refused(tmp_path, tokenizer):
    from transformers import T5ForConditionalGeneration

    class NoHiddenStates(T5ForConditionalGeneration):
        def forward(self, input_ids=None, attention_mask=None, labels=None):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels)

    model = NoHiddenStates(tiny_model("t5").config)
    with pytest.raises(ValueError, match="model: NoHiddenStates.forward takes no `output_hidden_states`"):
        ProfessorForcingTrainer(model=model, args=config(tmp_path), train_dataset=copy_data(tokenizer),
                                processing_class=tokenizer)
