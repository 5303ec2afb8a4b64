"""Subprocess for the crash-resume tests: trains a tiny model, optionally SIGKILLs itself at a step.

usage: python resume_worker.py OUTPUT_DIR KILL_AT_STEP(-1 = never) RESUME(0|1)
With RESUME_WORKER_MODEL=causal in the environment, a tiny decoder-only Llama trains on prompt + completion rows
instead of a tiny T5.
With kl_coef > 0 the KL reference is rebuilt from the initial weights on resume, not from the checkpoint.
Writes OUTPUT_DIR/final.pt (parameters) and OUTPUT_DIR/history.json (logged rl/reward per step) when it finishes.
"""

import json
import os
import signal
import sys

import torch
from transformers import TrainerCallback

sys.path.insert(0, os.path.dirname(__file__))
from conftest import (byt5_tokenizer, prompt_completion_dataset, tiny_causal_model, tiny_model,  # noqa: E402
                      toy_dataset, toy_pairs)

from hf_seqrl import ReinforceTrainer, SeqRLConfig  # noqa: E402


class KillAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    out, kill_at, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    causal = os.environ.get("RESUME_WORKER_MODEL", "seq2seq") == "causal"
    tok = byt5_tokenizer()
    src, tgt = toy_pairs(48, seed=0, alphabet="abcd", lengths=(2, 5))
    if causal:
        model, data = tiny_causal_model("llama", seed=0), prompt_completion_dataset(tok, n=48, seed=0, task="copy")
    else:
        model, data = tiny_model("t5", seed=0), toy_dataset(tok, src, tgt)
    args = SeqRLConfig(output_dir=out, per_device_train_batch_size=4, max_steps=20, learning_rate=1e-3,
                       warmup_xe_steps=10, num_samples=2, max_new_tokens=6, logging_steps=1,
                       kl_coef=0.05,
                       save_strategy="steps", save_steps=5, report_to=[], disable_tqdm=True, seed=0,
                       dataloader_pin_memory=False)
    trainer = ReinforceTrainer(model=model, args=args, train_dataset=data,
                               reward_funcs="chrf", processing_class=tok, callbacks=[KillAt(kill_at)] if kill_at >= 0 else None)
    trainer.train(resume_from_checkpoint=True if resume else None)
    torch.save(trainer.model.state_dict(), os.path.join(out, "final.pt"))
    history = {h["step"]: h["rl/reward"] for h in trainer.state.log_history if "rl/reward" in h}
    with open(os.path.join(out, "history.json"), "w") as f:
        json.dump({"rewards": history, "baseline_ema": trainer.baseline_ema}, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
