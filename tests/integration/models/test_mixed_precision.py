"""bf16 on CPU: rollouts and the scoring passes run under autocast as the Trainer's forward does, log-probs in float32."""

import pytest
import torch

from helpers import byt5_tokenizer, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig, losses
from hf_seqrl.models import family_for
from hf_seqrl.models.seq2seq import rollout_generation_config

bf16_autocast = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="CPU autocast needs oneDNN")


def record_dtypes(module) -> list:
    """Returns a list that fills with (grad enabled, output dtype) at every call of `module`."""
    seen = []
    module.register_forward_hook(lambda module, args, output: seen.append((torch.is_grad_enabled(), output.dtype)))
    return seen


def record_head_dtypes(model) -> list:
    """Returns a list that fills with (grad enabled, dtype) of every LM-head output of `model`."""
    return record_dtypes(model.get_output_embeddings())


def sources():
    tok = byt5_tokenizer()
    enc = tok(["hello there", "abc", "a longer source"], return_tensors="pt", padding=True)
    labels = tok(text_target=["ereht olleh", "cba", "ecruos regnol a"], return_tensors="pt", padding=True)["input_ids"]
    return enc["input_ids"], enc["attention_mask"], labels.masked_fill(labels == 0, -100)


@bf16_autocast
@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_bf16_loss_is_close_to_float32_on_the_same_samples(arch):
    model = tiny_model(arch, d_model=64, layers=2)
    ids, attn, labels = sources()
    torch.manual_seed(0)
    rollout = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn},
                                       rollout_generation_config(model, max_new_tokens=12), 4, False)
    advantages = torch.linspace(-1.0, 1.0, rollout.sample_ids.shape[0])

    def loss_and_logprobs():
        scored = family_for(model).score(model, {"input_ids": ids, "attention_mask": attn}, rollout.sample_ids, 4,
                                         labels, 0.9)
        pg = losses.policy_gradient_loss(scored.token_logprobs, rollout.sample_mask, advantages)
        return losses.mix_losses(pg, losses.cross_entropy_from_logprobs(scored.gold_logprobs, labels), 0.5), scored.token_logprobs

    full, full_logprobs = loss_and_logprobs()
    seen = record_head_dtypes(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half, half_logprobs = loss_and_logprobs()
    assert seen == [(True, torch.bfloat16)]  # the forward ran in bf16 ...
    assert full_logprobs.dtype == half_logprobs.dtype == half.dtype == torch.float32  # ... the log-probs did not
    # bf16 keeps 8 bits of mantissa. Observed: token log-probs within 0.017 (T5) and 0.002 (BART) of float32,
    # losses within 2.2e-3 and 4e-5. Stated tolerance: 0.05 per token log-prob, 0.01 + 1% on the loss.
    torch.testing.assert_close(half_logprobs, full_logprobs, atol=0.05, rtol=0.0)
    assert abs(half.item() - full.item()) <= 0.01 + 0.01 * abs(full.item()), (half.item(), full.item())


@bf16_autocast
def test_bf16_rollout_decodes_in_bf16_and_keeps_greedy_rows_valid():
    model = tiny_model("marian", d_model=64, layers=2)
    ids, attn, _ = sources()
    seen = record_head_dtypes(model)
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rollout = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn},
                                           rollout_generation_config(model, max_new_tokens=6), 2, True)
    assert seen and all(dtype == torch.bfloat16 and not grad for grad, dtype in seen)
    assert rollout.sample_ids.dtype == torch.long and rollout.greedy_ids.shape[0] == 3
    assert 0 <= int(rollout.sample_ids.min()) and int(rollout.sample_ids.max()) < model.config.vocab_size


@bf16_autocast
def test_trainer_with_bf16_runs_rollout_and_scoring_under_autocast(tmp_path):
    tok = byt5_tokenizer()
    model = tiny_model("t5")
    args = SeqRLConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, num_samples=2,
                       max_new_tokens=6, bf16=True, use_cpu=True, kl_coef=0.05, report_to=[], save_strategy="no",
                       disable_tqdm=True, logging_steps=1, dataloader_pin_memory=False)
    trainer = SCSTTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=toy_dataset(tok, *toy_pairs(4, alphabet="abcd")),
                          processing_class=tok)
    seen = record_head_dtypes(model)
    reference_seen = record_head_dtypes(trainer.ref_model)
    encoder_seen = record_dtypes(model.encoder.block[0].layer[0].SelfAttention.o)
    trainer.train()
    no_grad = [dtype for grad, dtype in seen if not grad]
    with_grad = [dtype for grad, dtype in seen if grad]
    assert no_grad and set(no_grad) == {torch.bfloat16}  # every decoding step of the rollout
    assert with_grad == [torch.bfloat16]  # the one scoring pass
    # the encoder too: once in the rollout, once in the scoring pass
    assert encoder_seen == [(False, torch.bfloat16), (True, torch.bfloat16)]
    assert reference_seen == [(False, torch.bfloat16)]  # the KL reference's scoring pass, as the policy's
    logged = [h for h in trainer.state.log_history if "rl/pg_loss" in h][-1]
    assert torch.isfinite(torch.tensor([logged["loss"], logged["rl/pg_loss"]])).all()
