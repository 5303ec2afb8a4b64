"""Run by tests/test_distributed.py under `accelerate launch --multi_gpu --num_processes 2` (CPU, gloo).

Each rank writes `OUT/<phase>_rank<i>.pt` with its parameters after training, and the main rank's log history:

- `one_step`: one SGD step of a deterministic SCST setup (argmax "sampling" via top_k=1, no baseline, no dropout,
  equal-length targets) on a dataset of exactly 8 rows with per-device batch 4, so the two ranks' batches together
  are the 8 rows that a single process sees in one batch of 8.
- `pipeline`: a few steps of the recipe's own code path (hf_seqrl.pipeline, tiny offline translation config:
  teacher-forced warm-up, then sampled rollouts) with AdamW; the ranks see different data and sample differently.
- `causal_one_step`, `causal_pipeline`: the same two runs with a tiny decoder-only Llama (prompt + completion rows;
  the tiny offline causal config).

Usage: python tests/distributed_worker.py OUT_DIR REPO_ROOT
"""

from __future__ import annotations

import os
import sys

import torch

torch.set_num_threads(1)

from conftest import (byt5_tokenizer, prompt_completion_dataset, tiny_causal_model, tiny_model,  # noqa: E402
                      toy_dataset, toy_pairs)  # (tests/ is sys.path[0])


REWARDS_SEEN: list[float] = []  # what this process's reward calls returned (its own samples only)


def overlap_reward(predictions, references, sources=None):
    """Returns a deterministic reward that differs between rows even for the untrained model's outputs.

    The character-set overlap of prediction and reference, plus a term of the reference alone (0.1 to 0.19), so
    that the rewards, and the advantages without a baseline, are non-zero and not all equal.
    """
    def overlap(a: str, b: str) -> float:
        return len(set(a) & set(b)) / max(len(set(a) | set(b)), 1)

    rewards = [max(overlap(p, r) + 0.1 + (sum(map(ord, r)) % 10) / 100 for r in refs)
               for p, refs in zip(predictions, references)]
    REWARDS_SEEN.extend(rewards)
    return rewards


def one_step_args(output_dir: str, **overrides):
    """Returns the SeqRLConfig of the one-step equivalence run (shared with the single-process references)."""
    from hf_seqrl import SeqRLConfig

    settings = dict(output_dir=output_dir, per_device_train_batch_size=4, gradient_accumulation_steps=1, max_steps=1,
                    top_k=1, baseline="none", rl_weight=0.5, max_new_tokens=8, optim="sgd",
                    learning_rate=0.5, max_grad_norm=0.0, lr_scheduler_type="constant", logging_steps=1,
                    report_to=[], save_strategy="no", disable_tqdm=True, seed=0, dataloader_pin_memory=False,
                    use_cpu=True)
    settings.update(overrides)
    return SeqRLConfig(**settings)


def one_step_data(tokenizer):
    """Returns 8 rows whose targets all have the same length (so per-batch token means average exactly)."""
    sources, _ = toy_pairs(8, seed=5, alphabet="abcd", lengths=(4, 4))
    return toy_dataset(tokenizer, sources, sources)


def run_one_step(output_dir: str, **overrides):
    """Returns the trainer after one optimizer step of the equivalence setup."""
    from hf_seqrl import SCSTTrainer

    tokenizer = byt5_tokenizer()
    trainer = SCSTTrainer(model=tiny_model("t5", seed=1), args=one_step_args(output_dir, **overrides),
                          reward_funcs=overlap_reward, train_dataset=one_step_data(tokenizer), processing_class=tokenizer)
    trainer.train()
    return trainer


def run_one_step_causal(output_dir: str, **overrides):
    """Returns the trainer after one optimizer step of the equivalence setup on a tiny decoder-only model."""
    from hf_seqrl import SCSTTrainer

    tokenizer = byt5_tokenizer()
    data = prompt_completion_dataset(tokenizer, n=8, seed=5, task="copy", lengths=(4, 4))
    trainer = SCSTTrainer(model=tiny_causal_model("llama", seed=1), args=one_step_args(output_dir, **overrides),
                          reward_funcs=overlap_reward, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    return trainer


def run_pipeline(output_dir: str, repo: str, config: str = "tiny_offline_translation.yaml"):
    """Returns the trainer after a few steps of the recipe's code path on a tiny offline translation config."""
    from hf_seqrl.families import family_for
    from hf_seqrl.pipeline import build_trainer, load_model_and_tokenizer, load_splits, parse_args

    data = os.path.join(repo, "recipes", "data")
    script_args, training_args = parse_args([
        "--config", os.path.join(repo, "recipes", "configs", config),
        "--output_dir", output_dir, "--max_steps", "4", "--warmup_xe_steps", "2", "--num_samples", "2",
        "--per_device_train_batch_size", "4", "--eval_strategy", "no", "--tiny_d_model", "32", "--logging_steps", "1",
        "--train_file", os.path.join(data, "toy_de_en.train.txt"), "--validation_file",
        os.path.join(data, "toy_de_en.validation.tsv"), "--test_file", os.path.join(data, "toy_de_en.test.txt"),
    ])
    model, tokenizer = load_model_and_tokenizer(script_args)
    family = family_for(model)
    with training_args.main_process_first():
        splits = load_splits(script_args, tokenizer, family=family)
    trainer = build_trainer(script_args, training_args, model, tokenizer, splits)
    trainer.train()
    return trainer


def dump(trainer, path: str) -> None:
    model = trainer.accelerator.unwrap_model(trainer.model)
    torch.save({
        "world_size": trainer.args.world_size,
        "process_index": trainer.args.process_index,
        "params": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "log_history": trainer.state.log_history,
        "rewards_seen": list(REWARDS_SEEN),
    }, path)
    REWARDS_SEEN.clear()


def main(out: str, repo: str) -> None:
    trainer = run_one_step(os.path.join(out, "one_step"))
    rank = trainer.args.process_index
    dump(trainer, os.path.join(out, f"one_step_rank{rank}.pt"))
    trainer = run_pipeline(os.path.join(out, "pipeline"), repo)
    dump(trainer, os.path.join(out, f"pipeline_rank{rank}.pt"))
    trainer = run_one_step_causal(os.path.join(out, "causal_one_step"))
    dump(trainer, os.path.join(out, f"causal_one_step_rank{rank}.pt"))
    trainer = run_pipeline(os.path.join(out, "causal_pipeline"), repo, "tiny_offline_causal_translation.yaml")
    dump(trainer, os.path.join(out, f"causal_pipeline_rank{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
