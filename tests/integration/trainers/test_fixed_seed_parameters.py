"""The numbers each rewarded algorithm computes, pinned: a few fixed-seed optimizer steps on tiny models with dropout on
end in the parameters recorded in `tests/fixtures/fixed_seed_parameters.json`.

Seven runs, one per rewarded algorithm: SCST, leave-one-out with clipped reuse (`num_iterations=2`), SCST mixed with
cross-entropy and a KL penalty, MRT, MIXER, on-policy distillation toward a frozen teacher of another seed, and
leave-one-out on a decoder-only model. Each trains 3 steps on text columns (`source` / `target`, `prompt` /
`completion`) with dropout 0.1 in the model config and `disable_dropout=False`, so the scoring passes draw dropout
masks and the KL reference and the reused rollout replay them. The fixture holds, per run and per named parameter,
the float64 sum and sum of squares of the final tensor and of its change from the initial weights, and the first and
last 4 entries of the flattened final tensor; it also holds the loss logged at each step and the distinct texts the
reward scored (the samples, greedy decodes and MIXER's continuations). A run passes when all of them match to
`rtol=1e-5, atol=1e-6` and every trainable parameter moved.

The optimizer is plain SGD without gradient clipping: a parameter's change is then the learning rate times its
summed gradient, so a loss scaled or normalized differently shows up, where Adam's first step (about the sign of the
gradient times the learning rate) and clipping to a norm would hide it.

Regenerate the fixture (only when the numbers are meant to change, never as part of a normal run) with

    HF_SEQRL_RECORD_PARAMETERS=1 python -m pytest -q tests/integration/trainers/test_fixed_seed_parameters.py

which writes each run's values instead of comparing them. The values come from float32 CPU kernels; another vector
width (AVX2 / AVX-512) or another torch / transformers version may sum in another order and move them by more than
the tolerance: record them again there, on unchanged library code, before comparing code changes.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re

import pytest
import torch
import transformers

from helpers import REPO, byt5_tokenizer, make_config, overlap_reward, text_pairs, tiny_causal_model, tiny_model
from hf_seqrl import (DistillationConfig, DistillationTrainer, MixerConfig, MixerTrainer, MRTConfig, MRTTrainer,
                      ReinforceTrainer, SCSTTrainer, SeqRLConfig)

FIXTURE = REPO / "tests" / "fixtures" / "fixed_seed_parameters.json"
RECORD = os.environ.get("HF_SEQRL_RECORD_PARAMETERS") == "1"
COMMAND = "HF_SEQRL_RECORD_PARAMETERS=1 python -m pytest -q tests/integration/trainers/test_fixed_seed_parameters.py"
RTOL, ATOL = 1e-5, 1e-6
DROPOUT = 0.1
# Every run: 3 SGD steps of 4 sources, nothing saved or reported, dropout kept on.
SETTINGS = dict(max_steps=3, per_device_train_batch_size=4, optim="sgd", learning_rate=0.5, max_grad_norm=0.0,
                lr_scheduler_type="constant", max_new_tokens=6, seed=0, use_cpu=True, report_to="none",
                save_strategy="no", logging_steps=1, disable_dropout=False)

# name: (trainer, config, the model's architecture, its settings on top of SETTINGS)
RUNS = {
    "scst": (SCSTTrainer, SeqRLConfig, "t5", dict(baseline="greedy", num_samples=2)),
    "leave_one_out_clipped_reuse": (ReinforceTrainer, SeqRLConfig, "marian",
                                    dict(baseline="mean", num_samples=3, num_iterations=2)),
    "scst_cross_entropy_kl": (SCSTTrainer, SeqRLConfig, "bart",
                              dict(baseline="greedy", num_samples=2, rl_weight=0.5, kl_coef=0.1)),
    "mrt": (MRTTrainer, MRTConfig, "t5", dict(num_samples=3)),
    "mixer": (MixerTrainer, MixerConfig, "bart", dict(baseline="greedy", num_samples=2, mixer_delta=2)),
    "distillation_on_policy": (DistillationTrainer, DistillationConfig, "t5", dict(lmbda=1.0, beta=0.5)),
    "causal_leave_one_out": (ReinforceTrainer, SeqRLConfig, "llama", dict(baseline="mean", num_samples=3)),
}


def recording(reward, seen: set):
    """Returns `reward`, under its own name and signature, adding every text it scores to `seen`."""

    @functools.wraps(reward)
    def scored(predictions, *args, **kwargs):
        seen.update(predictions)
        return reward(predictions, *args, **kwargs)

    return scored


def fingerprint(final: torch.Tensor, initial: torch.Tensor) -> list[float]:
    """Returns `[sum, sum of squares, sum of the change, sum of squares of the change, first 4, last 4 entries]` of
    a parameter, in float64."""
    final, change = final.detach().double().flatten(), (final.detach().double() - initial.double()).flatten()
    return [final.sum().item(), final.square().sum().item(), change.sum().item(), change.square().sum().item(),
            *final[:4].tolist(), *final[-4:].tolist()]


def train(name: str, tmp_path) -> dict:
    """Trains run `name` from its fixed seeds; returns its parameters' fingerprints, logged losses and scored texts."""
    trainer_class, config_class, arch, settings = RUNS[name]
    causal = arch == "llama"
    torch.manual_seed(0)
    model = tiny_causal_model(arch, seed=1, dropout=DROPOUT) if causal else tiny_model(arch, seed=1, dropout=DROPOUT)
    initial = {key: value.detach().clone() for key, value in model.named_parameters()}
    seen: set[str] = set()
    extra = {"reward_funcs": recording(overlap_reward, seen)}
    if trainer_class is DistillationTrainer:
        extra = {"teacher_model": tiny_model(arch, seed=2, dropout=DROPOUT)}
    args = make_config(config_class, tmp_path, **{**SETTINGS, **settings})
    trainer = trainer_class(model=model, args=args, train_dataset=text_pairs(causal, n=12),
                            processing_class=byt5_tokenizer(), **extra)
    trainer.train()
    parameters = dict(trainer.model.named_parameters())
    return {"parameters": {key: fingerprint(value, initial[key]) for key, value in parameters.items()},
            "trainable": sorted(key for key, value in parameters.items() if value.requires_grad),
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "texts": sorted(seen)}


def mismatches(name: str, got: dict, want: dict) -> list[str]:
    """Returns one line per value of run `name` that differs from the recorded one beyond the tolerance."""
    lines = []
    if sorted(got["parameters"]) != sorted(want["parameters"]):
        lines.append(f"{name}: parameter names {sorted(got['parameters'])} != recorded {sorted(want['parameters'])}")
    for key in sorted(set(got["parameters"]) & set(want["parameters"])):
        g, w = torch.tensor(got["parameters"][key], dtype=torch.float64), torch.tensor(want["parameters"][key],
                                                                                           dtype=torch.float64)
        if not torch.allclose(g, w, rtol=RTOL, atol=ATOL):
            lines.append(f"{name}: parameter {key}: [sum, sumsq, change sum, change sumsq, first 4, last 4] = "
                         f"{g.tolist()}, recorded {w.tolist()}")
    if len(got["losses"]) != len(want["losses"]) or not torch.allclose(
            torch.tensor(got["losses"], dtype=torch.float64), torch.tensor(want["losses"], dtype=torch.float64),
            rtol=RTOL, atol=ATOL):
        lines.append(f"{name}: logged losses {got['losses']}, recorded {want['losses']}")
    if got["texts"] != want["texts"]:
        lines.append(f"{name}: scored texts {got['texts']}, recorded {want['texts']}")
    return lines


def record(name: str, values: dict) -> None:
    """Writes run `name`'s values into the fixture, keeping the other runs'."""
    recorded = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
    recorded["command"] = COMMAND
    recorded["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    recorded.setdefault("runs", {})[name] = values
    recorded["runs"] = dict(sorted(recorded["runs"].items()))
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(recorded, indent=1)
    # One line per list of numbers: a parameter's fingerprint, a run's losses.
    text = re.sub(r"\[\s+([^\[\]{}\"]*?)\s+\]", lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    FIXTURE.write_text(text + "\n")


@pytest.mark.parametrize("name", list(RUNS))
def test_fixed_seed_run_ends_in_the_recorded_parameters(tmp_path, name):
    values = train(name, tmp_path)
    # Not vacuous: every trainable parameter moved (Marian's sinusoidal positions are fixed), the numbers are finite.
    still = [key for key in values.pop("trainable") if values["parameters"][key][3] == 0.0]
    assert not still, f"{name}: parameters that did not move: {still}"
    assert all(math.isfinite(x) for stats in values["parameters"].values() for x in stats) and values["losses"]
    if RECORD:
        record(name, values)
        return
    assert FIXTURE.exists(), f"{FIXTURE} is missing: record it with {COMMAND}"
    want = json.loads(FIXTURE.read_text())["runs"].get(name)
    assert want is not None, f"{FIXTURE} has no run {name!r}: record it with {COMMAND}"
    lines = mismatches(name, values, want)
    assert not lines, "\n".join(lines)
