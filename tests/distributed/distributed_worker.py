"""Run by tests/test_distributed.py under `accelerate launch --multi_gpu --num_processes 2` (CPU, gloo).

Each rank writes `OUT/<phase>_rank<i>.pt` with its parameters after training, and the main rank's log history:

- `one_step`: one SGD step of a deterministic SCST setup (argmax "sampling" via top_k=1, no baseline, no dropout,
  equal-length targets) on a dataset of exactly 8 rows with per-device batch 4, so the two ranks' batches together
  are the 8 rows that a single process sees in one batch of 8.
- `pipeline`: a few steps of the recipe's own code path (hf_seqrl.cli.train, tiny offline translation config:
  teacher-forced warm-up, then sampled rollouts) with AdamW; the ranks see different data and sample differently.
- `causal_one_step`, `causal_pipeline`: the same two runs with a tiny decoder-only Llama (prompt + completion rows;
  the tiny offline causal config).

With the mode `reuse_and_mrt` it runs instead:

- `reuse`: the `one_step` setup over 2 optimizer steps with `num_iterations=2` (one rollout, two clipped steps).
- `mrt`: 2 steps of `MRTTrainer` (samples, greedy decode and reference as candidates, mixed with cross-entropy).

With the mode `input_schedules`: one step each of noise-level forcing and of an exact k-step rollout
(`run_input_schedule_step`). With `causal_trainers`: MRT and the exact k-step rollout on the tiny Llama. With
`zero3` (launched with recipes/accelerate_configs/deepspeed_zero3.yaml): `one_step` and `causal_one_step` on
parameters sharded by DeepSpeed ZeRO-3, dumped gathered, and `causal_eval`: an evaluation with generation after it.

Usage: python tests/distributed_worker.py OUT_DIR REPO_ROOT [SUITE]   (SUITE: a key of `SUITES`)
"""

from __future__ import annotations

import os
import sys

import torch

torch.set_num_threads(1)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from helpers import (byt5_tokenizer, prompt_completion_dataset, skip_deepspeed_shm_build, tiny_causal_model,  # noqa: E402
                     tiny_classifier, tiny_model, toy_dataset, toy_pairs, whole_state_dict)


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


def run_model_reward(output_dir: str, **overrides):
    """Returns the trainer after one step of the `one_step` setup scored by a reward model (a one-output classifier
    built from a config, placed on each process) with the advantages scaled by their std over every process."""
    from hf_seqrl import SCSTTrainer
    from hf_seqrl.rewards import RewardModelReward

    tokenizer = byt5_tokenizer()
    reward = RewardModelReward(tiny_classifier(), tokenizer=tokenizer, pair="prediction-reference")
    trainer = SCSTTrainer(model=tiny_model("t5", seed=1), args=one_step_args(output_dir, scale_rewards="batch",
                                                                             **overrides),
                          reward_funcs=reward, train_dataset=one_step_data(tokenizer), processing_class=tokenizer)
    trainer.train()
    return trainer


def run_batched_rollouts(output_dir: str, steps_per_generation: int = 2):
    """Returns the trainer after one step of the `one_step` setup in 2 micro-batches of 2, sampling (not top-1), their
    rollouts decoded together (or one by one, `steps_per_generation=1`)."""
    return run_one_step(output_dir, per_device_train_batch_size=2, gradient_accumulation_steps=2, top_k=0,
                        num_samples=2, steps_per_generation=steps_per_generation)


def run_reuse(output_dir: str, **overrides):
    """Returns the trainer after 2 steps of the `one_step` setup that share one rollout (`num_iterations=2`)."""
    return run_one_step(output_dir, **{"max_steps": 2, "num_iterations": 2, "epsilon": 0.05, **overrides})


def causal_one_step_data(tokenizer):
    """Returns 8 prompt + completion rows of equal length (the decoder-only `one_step` data)."""
    return prompt_completion_dataset(tokenizer, n=8, seed=5, task="copy", lengths=(4, 4))


def run_mrt(output_dir: str, causal: bool = False):
    """Returns the trainer after 2 steps of MRT on the `one_step` data (sampled candidates: ranks differ), on a tiny
    T5 or, with `causal`, a tiny Llama."""
    from hf_seqrl import MRTConfig, MRTTrainer

    args = MRTConfig(output_dir=output_dir, per_device_train_batch_size=4, max_steps=2, max_new_tokens=8,
                     num_samples=2, mrt_include_greedy=True, mrt_include_reference=True, rl_weight=0.5,
                     learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True,
                     seed=0, dataloader_pin_memory=False, use_cpu=True)
    tokenizer = byt5_tokenizer()
    model = tiny_causal_model("llama", seed=1) if causal else tiny_model("t5", seed=1)
    data = causal_one_step_data(tokenizer) if causal else one_step_data(tokenizer)
    trainer = MRTTrainer(model=model, args=args, reward_funcs=overlap_reward, train_dataset=data,
                         processing_class=tokenizer)
    trainer.train()
    return trainer


def run_one_step_causal(output_dir: str, **overrides):
    """Returns the trainer after one optimizer step of the equivalence setup on a tiny decoder-only model."""
    from hf_seqrl import SCSTTrainer

    tokenizer = byt5_tokenizer()
    trainer = SCSTTrainer(model=tiny_causal_model("llama", seed=1), args=one_step_args(output_dir, **overrides),
                          reward_funcs=overlap_reward, train_dataset=causal_one_step_data(tokenizer),
                          processing_class=tokenizer)
    trainer.train()
    return trainer


def run_pipeline(output_dir: str, repo: str, config: str = "tiny_offline_translation.yaml"):
    """Returns the trainer after a few steps of the recipe's code path on a tiny offline translation config."""
    from hf_seqrl.models import family_for
    from hf_seqrl.cli.train import build_trainer, load_model_and_tokenizer, load_splits, parse_args

    data = os.path.join(repo, "recipes", "data")
    script_args, training_args = parse_args([
        "--config", os.path.join(repo, "recipes", "configs", config),
        "--output_dir", output_dir, "--max_steps", "4", "--warmup_xe_steps", "2", "--num_samples", "2",
        "--per_device_train_batch_size", "4", "--eval_strategy", "no", "--tiny_d_model", "32", "--logging_steps", "1",
        "--train_file", os.path.join(data, "toy_de_en.train.txt"), "--validation_file",
        os.path.join(data, "toy_de_en.validation.tsv"), "--test_file", os.path.join(data, "toy_de_en.test.txt"),
    ])
    model, tokenizer = load_model_and_tokenizer(script_args, training_args)
    family = family_for(model)
    with training_args.main_process_first():
        splits = load_splits(script_args, training_args, tokenizer, family=family)
    trainer = build_trainer(script_args, training_args, model, tokenizer, splits)
    trainer.train()
    return trainer


def teacher_record(trainer) -> dict | None:
    """Returns what a distillation run's teacher ended as: its class (never a DDP wrapper), whether any of its
    parameters trains or sits in the optimizer, and its weights; None without a teacher."""
    frozen = getattr(trainer, "frozen_models", {}).get("teacher")
    if frozen is None:
        return None
    ids = {id(p) for p in frozen.model.parameters()}
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    return {"class": type(frozen.model).__name__, "trainable": any(p.requires_grad for p in frozen.model.parameters()),
            "in_optimizer": bool(ids & optimized),
            "params": {k: v.clone() for k, v in frozen.model.state_dict().items()}}


def dump(trainer, path: str) -> None:
    model = trainer.accelerator.unwrap_model(trainer.model)
    torch.save({
        "world_size": trainer.args.world_size,
        "process_index": trainer.args.process_index,
        "params": whole_state_dict(model),
        "log_history": trainer.state.log_history,
        "rewards_seen": list(REWARDS_SEEN),
        "teacher": teacher_record(trainer),
    }, path)
    REWARDS_SEEN.clear()


def main(out: str, repo: str) -> None:
    from hf_seqrl.cli.processes import destroy_process_group

    trainer = run_one_step(os.path.join(out, "one_step"))
    rank = trainer.args.process_index
    dump(trainer, os.path.join(out, f"one_step_rank{rank}.pt"))
    trainer = run_pipeline(os.path.join(out, "pipeline"), repo)
    dump(trainer, os.path.join(out, f"pipeline_rank{rank}.pt"))
    trainer = run_one_step_causal(os.path.join(out, "causal_one_step"))
    dump(trainer, os.path.join(out, f"causal_one_step_rank{rank}.pt"))
    trainer = run_pipeline(os.path.join(out, "causal_pipeline"), repo, "tiny_offline_causal_translation.yaml")
    dump(trainer, os.path.join(out, f"causal_pipeline_rank{rank}.pt"))
    del trainer  # its DDP wrapper must not hold the group's last reference
    destroy_process_group()


def run_professor_forcing(output_dir: str):
    """Returns the trainer after 2 steps of professor forcing on the `one_step` data (free-running outputs differ
    between ranks, and so do their discriminator gradients until they are averaged)."""
    from hf_seqrl import ProfessorForcingConfig, ProfessorForcingTrainer

    args = ProfessorForcingConfig(output_dir=output_dir, per_device_train_batch_size=4, max_steps=2, max_new_tokens=8,
                                  learning_rate=1e-2, discriminator_hidden_size=16, discriminator_learning_rate=1e-2,
                                  logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True, seed=0,
                                  dataloader_pin_memory=False, use_cpu=True)
    tokenizer = byt5_tokenizer()
    trainer = ProfessorForcingTrainer(model=tiny_model("t5", seed=1), args=args,
                                      train_dataset=one_step_data(tokenizer), processing_class=tokenizer)
    trainer.train()
    return trainer


def run_mixer(output_dir: str):
    """Returns the trainer after 2 steps of MIXER (Δ = 2: gold prefixes, sampled last tokens) on the `one_step` data,
    its samples logged (`OUT/mixer/completions/step-N.jsonl`, written by the main rank)."""
    from hf_seqrl import MixerConfig, MixerTrainer

    args = MixerConfig(output_dir=output_dir, per_device_train_batch_size=4, max_steps=2, max_new_tokens=8,
                       num_samples=2, baseline="greedy", mixer_delta=2, learning_rate=1e-2, logging_steps=1,
                       report_to=[], save_strategy="no", disable_tqdm=True, seed=0, dataloader_pin_memory=False,
                       use_cpu=True, log_completions=True, num_completions_to_print=0)
    tokenizer = byt5_tokenizer()
    trainer = MixerTrainer(model=tiny_model("t5", seed=1), args=args, reward_funcs=overlap_reward,
                           train_dataset=one_step_data(tokenizer), processing_class=tokenizer)
    trainer.train()
    return trainer


def run_input_schedule_step(output_dir: str, kind: str, causal: bool = False, **overrides):
    """Returns the trainer after one SGD step of noise-level forcing (`noise_level`: random replacements) or of an
    exact 3-step greedy rollout (`kstep`, deterministic) on the 8 equal-length rows of `one_step_data` (a tiny T5),
    or with `causal` of `causal_one_step_data` (a tiny Llama)."""
    from hf_seqrl import KStepRolloutConfig, KStepRolloutTrainer, PrefixCorruptionConfig, PrefixCorruptionTrainer

    settings = dict(output_dir=output_dir, per_device_train_batch_size=4, max_steps=1, optim="sgd", learning_rate=0.5,
                    max_grad_norm=0.0, lr_scheduler_type="constant", logging_steps=1, report_to=[], save_strategy="no",
                    disable_tqdm=True, seed=0, dataloader_pin_memory=False, use_cpu=True)
    settings.update(overrides)
    if kind == "noise_level":
        trainer_cls, args = PrefixCorruptionTrainer, PrefixCorruptionConfig(**settings, corruption_rate=0.8,
                                                                            per_token_levels=True)
    else:
        trainer_cls, args = KStepRolloutTrainer, KStepRolloutConfig(**settings, rollout_steps=3)
    tokenizer = byt5_tokenizer()
    model = tiny_causal_model("llama", seed=1) if causal else tiny_model("t5", seed=1)
    data = causal_one_step_data(tokenizer) if causal else one_step_data(tokenizer)
    trainer = trainer_cls(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    return trainer


def run_causal_evaluation(output_dir: str):
    """Returns the `causal_one_step` trainer after an evaluation with generation on prompts of 1 to 6 characters
    (its metrics in the log history)."""
    trainer = run_one_step_causal(output_dir, max_grad_norm=1.0, predict_with_generate=True, generation_max_length=8,
                                  per_device_eval_batch_size=4)
    trainer.evaluate(eval_dataset=prompt_completion_dataset(byt5_tokenizer(), n=8, seed=3, lengths=(1, 6)))
    return trainer


def run_distillation(output_dir: str, **overrides):
    """Returns the trainer after 2 steps of on-policy distillation (generalized JSD, 2 samples per source) toward a
    tiny T5 teacher, on the `one_step` data. Each process samples from its own stream of keys, so the samples are
    the most likely tokens (`top_k=1`), as one process would draw them too; the student's EOS is banned, so every
    sample runs to `max_new_tokens`: each process counts as many tokens, and the mean over each process's tokens,
    averaged over the processes, is the mean over the global batch's. Plain SGD at a constant rate without clipping,
    as the other equivalence runs: Adam's normalization would magnify summation-order differences."""
    from hf_seqrl import DistillationConfig, DistillationTrainer

    args = DistillationConfig(output_dir=output_dir, **{
        "per_device_train_batch_size": 4, "max_steps": 2, "max_new_tokens": 8, "num_samples": 2, "beta": 0.5,
        "top_k": 1, "optim": "sgd", "learning_rate": 0.5, "max_grad_norm": 0.0, "lr_scheduler_type": "constant",
        "logging_steps": 1, "report_to": [], "save_strategy": "no", "disable_tqdm": True, "seed": 0,
        "dataloader_pin_memory": False, "use_cpu": True, **overrides})
    tokenizer = byt5_tokenizer()
    student = tiny_model("t5", seed=1)
    student.generation_config.bad_words_ids = [[tokenizer.eos_token_id]]
    trainer = DistillationTrainer(model=student, args=args, train_dataset=one_step_data(tokenizer),
                                  processing_class=tokenizer, teacher_model=tiny_model("t5", seed=2))
    trainer.train()
    return trainer


# Groups of runs a test launches on 2 processes at once: name -> (run name, function of the output folder).
SUITES = {"reuse_and_mrt": (("reuse", run_reuse), ("mrt", run_mrt)),
          "mixer_and_pf": (("mixer", run_mixer), ("pf", run_professor_forcing), ("distill", run_distillation)),
          "input_schedules": (("noise_level", lambda out: run_input_schedule_step(out, "noise_level")),
                              ("kstep", lambda out: run_input_schedule_step(out, "kstep"))),
          # The accelerate config's gradient_clipping (1.0) must equal the Trainer's max_grad_norm under DeepSpeed.
          "zero3": (("one_step", lambda out: run_one_step(out, max_grad_norm=1.0)),
                    ("causal_one_step", lambda out: run_one_step_causal(out, max_grad_norm=1.0)),
                    ("causal_eval", run_causal_evaluation)),
          "model_reward_and_batched": (("model_reward", run_model_reward), ("batched", run_batched_rollouts),
                                       ("unbatched", lambda out: run_batched_rollouts(out, 1))),
          "causal_trainers": (("causal_mrt", lambda out: run_mrt(out, causal=True)),
                              ("causal_kstep", lambda out: run_input_schedule_step(out, "kstep", causal=True)))}


def main_suite(out: str, suite: str) -> None:
    from hf_seqrl.cli.processes import destroy_process_group

    if suite == "zero3":
        skip_deepspeed_shm_build()  # before the Trainer's arguments set up DeepSpeed's process group
    for name, run in SUITES[suite]:
        trainer = run(os.path.join(out, name))
        dump(trainer, os.path.join(out, f"{name}_rank{trainer.args.process_index}.pt"))
        discriminator = getattr(trainer, "discriminator", None)
        if discriminator is not None:
            torch.save(discriminator.state_dict(), os.path.join(out, f"{name}_discriminator_rank"
                                                                     f"{trainer.args.process_index}.pt"))
        del trainer, discriminator  # no DDP wrapper may hold the group's last reference
    destroy_process_group()


if __name__ == "__main__":
    if sys.argv[3:4] and sys.argv[3] in SUITES:
        main_suite(sys.argv[1], sys.argv[3])
    else:
        main(sys.argv[1], sys.argv[2])
    # Every result is saved and the group destroyed: skip the interpreter's teardown, where a native thread
    # left by the backend can abort the process ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
