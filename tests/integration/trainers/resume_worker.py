"""Subprocess for the crash-resume tests: trains a tiny model, optionally SIGKILLs itself at a step.

usage: python resume_worker.py OUTPUT_DIR KILL_AT_STEP(-1 = never) RESUME(0|1) [NUM_ITERATIONS] [TRAINER]
TRAINER: `reinforce` (default), or one of `OTHER_TRAINERS` (8 steps, checkpoints every 3, the trainer's own state
saved with them).
With RESUME_WORKER_MODEL=causal in the environment, a tiny decoder-only Llama trains on prompt + completion rows
instead of a tiny T5 (every trainer but professor forcing).
With kl_coef > 0 the KL reference is rebuilt from the initial weights on resume, not from the checkpoint.
With NUM_ITERATIONS > 1: a short run of 8 steps (warm-up 2, checkpoints every 3, 2 accumulation steps) whose
checkpoint-3 falls inside the cycle of steps 2-3, each rollout serving NUM_ITERATIONS clipped steps.
Writes OUTPUT_DIR/final.pt (parameters) and OUTPUT_DIR/history.json (logged rl/reward per step) when it finishes.
"""

import json
import os
import signal
import sys

import torch
from transformers import TrainerCallback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from helpers import (byt5_tokenizer, prompt_completion_dataset, tiny_causal_model, tiny_model,  # noqa: E402
                      toy_dataset, toy_pairs)

from hf_seqrl import ReinforceTrainer, SeqRLConfig  # noqa: E402


class KillAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def other_trainer(name: str, out: str, dataset, tok, callbacks):
    """Returns a short run of `name` (see `OTHER_TRAINERS`) that checkpoints every 3 of its 8 steps."""
    import hf_seqrl

    config_name, trainer_name, extra = OTHER_TRAINERS[name]
    args = getattr(hf_seqrl, config_name)(output_dir=out, per_device_train_batch_size=4, max_steps=8, learning_rate=1e-3,
                                          logging_steps=1, save_strategy="steps", save_steps=3,
                                          report_to=[], disable_tqdm=True, seed=0, dataloader_pin_memory=False,
                                          **extra)
    rewards = {"reward_funcs": "chrf"} if "num_samples" in extra else {}
    build = (lambda seed: tiny_causal_model("llama", seed=seed)) if causal() else (lambda seed: tiny_model("t5", seed=seed))
    if name == "distill":  # a frozen teacher beside the student; a step on-policy or not by the draw of its step
        rewards["teacher_model"] = build(5)
    return getattr(hf_seqrl, trainer_name)(model=build(0), args=args, train_dataset=dataset, processing_class=tok,
                                           callbacks=callbacks, **rewards)


def causal() -> bool:
    """Returns whether RESUME_WORKER_MODEL asks for the tiny decoder-only model."""
    return os.environ.get("RESUME_WORKER_MODEL", "seq2seq") == "causal"


# name -> (config class, trainer class, their own settings)
OTHER_TRAINERS = {
    "mixer": ("MixerConfig", "MixerTrainer", dict(num_samples=2, mixer_delta=1, mixer_increment_steps=2,
                                                  max_new_tokens=6)),
    "pf": ("ProfessorForcingConfig", "ProfessorForcingTrainer", dict(discriminator_hidden_size=16,
                                                                     discriminator_learning_rate=1e-2,
                                                                     max_new_tokens=6)),
    # Every step draws from the RNG (corruption levels and draws, sampled own tokens): a resume matches only if
    # the RNG, the schedule position (σ ramps over steps 2-6) and the data order are restored.
    "noise_level": ("PrefixCorruptionConfig", "PrefixCorruptionTrainer", dict(
        corruption_rate=0.6, per_token_levels=True, replacement="model", sampling="sample", schedule="linear",
        schedule_k=4, warmup_xe_steps=2)),
    "kstep": ("KStepRolloutConfig", "KStepRolloutTrainer", dict(rollout_steps=2, sampling="sample",
                                                                warmup_xe_steps=2)),
    "mrt": ("MRTConfig", "MRTTrainer", dict(num_samples=2, mrt_include_greedy=True, rl_weight=0.7, max_new_tokens=6,
                                            mrt_alpha=0.5, warmup_xe_steps=2)),
    # GKD's mixed setting with a sequence reward beside the teacher: the on-policy draws and the baseline resume.
    "distill": ("DistillationConfig", "DistillationTrainer", dict(num_samples=2, lmbda=0.5, beta=0.5, rl_weight=0.7,
                                                                  max_new_tokens=6, warmup_xe_steps=2)),
}


def main():
    out, kill_at, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    num_iterations = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    name = sys.argv[5] if len(sys.argv) > 5 else "reinforce"
    tok = byt5_tokenizer()
    src, tgt = toy_pairs(48, seed=0, alphabet="abcd", lengths=(2, 5))
    callbacks = [KillAt(kill_at)] if kill_at >= 0 else None
    data = prompt_completion_dataset(tok, n=48, seed=0, task="copy") if causal() else toy_dataset(tok, src, tgt)
    if name != "reinforce":
        trainer = other_trainer(name, out, data, tok, callbacks)
        trainer.train(resume_from_checkpoint=True if resume else None)
        torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))
        history = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
        with open(os.path.join(out, "history.json"), "w") as f:
            json.dump({"losses": history}, f)
        return
    settings = dict(per_device_train_batch_size=4, max_steps=20, warmup_xe_steps=10, save_steps=5)
    if num_iterations > 1:
        settings = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=8, warmup_xe_steps=2,
                        save_steps=3, num_iterations=num_iterations)
    model = tiny_causal_model("llama", seed=0) if causal() else tiny_model("t5", seed=0)
    args = SeqRLConfig(output_dir=out, learning_rate=1e-3,
                       num_samples=2, max_new_tokens=6, logging_steps=1,
                       kl_coef=0.05,
                       save_strategy="steps", report_to=[], disable_tqdm=True, seed=0,
                       dataloader_pin_memory=False, **settings)
    peft_config = None
    if os.environ.get("RESUME_WORKER_LORA") == "1":  # a LoRA adapter on the tiny T5; the KL reference is it disabled
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q", "v"], task_type="SEQ_2_SEQ_LM")
        args.learning_rate = 2e-2
    trainer = ReinforceTrainer(model=model, args=args, train_dataset=data, peft_config=peft_config,
                               reward_funcs="chrf", processing_class=tok, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=True if resume else None)
    torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))
    history = {h["step"]: h["rl/reward"] for h in trainer.state.log_history if "rl/reward" in h}
    with open(os.path.join(out, "history.json"), "w") as f:
        json.dump({"rewards": history, "baseline_ema": trainer.baseline_ema}, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
