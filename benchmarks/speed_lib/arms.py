"""The arms of the speed benchmark, one step function each: cross-entropy, hf-seqrl's `SCSTTrainer.training_step`
(greedy baseline, or leave-one-out over 4 samples) and a plain reference SCST loop; `Timer` sums a step's parts."""

from __future__ import annotations

import contextlib
import time

import torch

from .models import TASKS, on_accelerator, synchronize

ARMS = ("xe", "seqrl_scst", "seqrl_loo4", "reference_scst", "reference_loo4")


def reward_fn(task: str):
    from hf_seqrl.rewards import get_reward

    return get_reward("rougeL" if task == "summarization" else "bleu")


def reference_reward(task: str, predictions, references):
    """Per-pair calls to the reference implementations, as most SCST code does."""
    if task == "summarization":
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
        return [scorer.score_multi(r, p)["rougeL"].fmeasure for p, r in zip(predictions, references)]
    import sacrebleu

    return [sacrebleu.sentence_bleu(p, r).score / 100 for p, r in zip(predictions, references)]


class Timer:
    """Sums the wall time of named spans of a step (`with timer("decode"): ...`), synchronizing the device around
    them."""

    def __init__(self, device):
        self.device, self.parts = device, {}

    @contextlib.contextmanager
    def __call__(self, name):
        synchronize(self.device)
        start = time.perf_counter()
        yield
        synchronize(self.device)
        self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - start


def step_xe(model, tok, src, attn, labels, refs, task, n, timer, trainer=None):
    with timer("forward_backward"):
        model(input_ids=src, attention_mask=attn, labels=labels).loss.backward()
    return None, labels.shape[1]


def seqrl_trainer(model, tok, task, n, device):
    """Returns the `SCSTTrainer` an hf-seqrl arm steps: greedy baseline at `n = 1`, leave-one-out over `n` samples
    otherwise, past its warm-up, its decode and reward calls timed (`trainer.timer`)."""
    import tempfile

    from datasets import Dataset

    from hf_seqrl import SCSTTrainer, SeqRLConfig

    fields = dict(baseline="greedy") if n == 1 else dict(baseline="mean", num_samples=n)
    args = SeqRLConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=1,
                       max_new_tokens=TASKS[task]["tgt_len"], report_to=[], save_strategy="no", logging_steps=10**6, disable_tqdm=True,
                       use_cpu=not on_accelerator(device), dataloader_pin_memory=False, seed=0, **fields)
    placeholder = Dataset.from_dict({"input_ids": [[3, 1]], "references": ["w3"]})
    trainer = SCSTTrainer(model=model, args=args, train_dataset=placeholder, processing_class=tok,
                          reward_funcs=reward_fn(task))
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    trainer.current_gradient_accumulation_steps = 1  # what `train()` sets before its first step
    trainer.timer = None
    sample, rewards = trainer.family.sample, trainer.reward_values

    def timed(name, call):
        def run(*a, **k):
            if trainer.timer is None:
                return call(*a, **k)
            with trainer.timer(name):
                return call(*a, **k)
        return run

    def sample_and_width(*a, **k):
        rollout = sample(*a, **k)
        trainer.decoded_width = rollout.sample_ids.shape[1]
        return rollout

    trainer.family.sample = timed("decode", sample_and_width)
    trainer.reward_values = timed("reward", rewards)
    trainer.family.score = timed("forward_backward", trainer.family.score)  # the scoring pass, then its backward
    trainer.accelerator.backward = timed("forward_backward", trainer.accelerator.backward)
    return trainer


def step_seqrl(model, tok, src, attn, labels, refs, task, n, timer, trainer=None):
    """One `SCSTTrainer.training_step` on the batch: what a user's step costs, every part of it."""
    trainer.timer = timer
    inputs = {"input_ids": src, "attention_mask": attn, "references": refs}
    try:
        loss = trainer.training_step(model, inputs)
    finally:
        trainer.timer = None
    return float(loss), trainer.decoded_width


def step_reference(model, tok, src, attn, labels, refs, task, n, timer, trainer=None):
    """A straightforward SCST step: separate decodes, encoder re-run per sample, full log-softmax, per-pair rewards."""
    from hf_seqrl.models.tokens import completion_mask

    max_new = TASKS[task]["tgt_len"]
    model.eval()
    with timer("decode"), torch.no_grad():
        samples = model.generate(input_ids=src, attention_mask=attn, do_sample=True, top_k=0, num_beams=1,
                                 num_return_sequences=n, max_new_tokens=max_new)[:, 1:]
        greedy = model.generate(input_ids=src, attention_mask=attn, do_sample=False, num_beams=1,
                                max_new_tokens=max_new)[:, 1:] if n == 1 else None
    model.train()
    with timer("reward"):
        rep = [r for r in refs for _ in range(n)]
        rewards = torch.tensor(reference_reward(task, tok.batch_decode(samples, skip_special_tokens=True), rep),
                               device=src.device)
        if greedy is not None:
            base = torch.tensor(reference_reward(task, tok.batch_decode(greedy, skip_special_tokens=True), refs),
                                device=src.device)
            base = base.repeat_interleave(n)
        else:
            base = (rewards.view(-1, n).sum(1, keepdim=True) - rewards.view(-1, n)).div(n - 1).flatten()
    with timer("forward_backward"):
        mask = completion_mask(samples, [1])
        dec_in = torch.cat([torch.zeros_like(samples[:, :1]), samples[:, :-1]], dim=1)
        logits = model(input_ids=src.repeat_interleave(n, 0), attention_mask=attn.repeat_interleave(n, 0),
                       decoder_input_ids=dec_in).logits
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, samples.unsqueeze(-1)).squeeze(-1)
        seq = (logp * mask).sum(1)
        loss = -((rewards - base) * seq).mean()
        loss.backward()
    return loss.item(), samples.shape[1]


STEPS = {"xe": (step_xe, 1), "seqrl_scst": (step_seqrl, 1), "seqrl_loo4": (step_seqrl, 4),
         "reference_scst": (step_reference, 1), "reference_loo4": (step_reference, 4)}
