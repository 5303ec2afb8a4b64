"""hf-seqrl next to TRL (`RLOOTrainer`, `GRPOTrainer`) on one tiny causal model built from a config.

Same Llama-shaped model (2 layers, width 64, RoPE), same character-level tokenizer built in code, same prompts and
references (reverse a list of letters: `"a c b ="` → `"b c a"`), 4 generations per prompt, leave-one-out baseline,
no KL, 12 completion tokens at most, temperature 1, AdamW at a constant learning rate, 4 prompts per step.

    python benchmarks/vs_trl.py equivalence         # loss and gradient of one step on identical samples (seconds)
    python benchmarks/vs_trl.py speed --repeats 5   # median step time and RSS, each arm in a fresh process (~8 min)
    python benchmarks/vs_trl.py learning            # held-out sentence-BLEU curves from one warm start, 2 seeds (~6 min)
    python benchmarks/vs_trl.py all                 # the three; each writes its section of benchmarks/results/vs_trl.json

Speed: one thread per process (`torch.set_num_threads(1)`, `OMP_NUM_THREADS=1`); a step is timed from the end of
the previous one (data, rollout, rewards, loss, backward, optimizer); the first 3 steps of each process are dropped;
the arms run in turn, repeat after repeat, so that they share the machine's load alike. Memory: the process's peak
RSS (`ru_maxrss`), and that peak minus the RSS just before `train()` (what training adds: activations, optimizer
state, generation caches).

TRL is a `bench` extra (`pip install -e ".[bench]"`), never a dependency of the library.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

ALPHABET = "abcdef"
NUM_GENERATIONS, PROMPTS_PER_STEP, MAX_COMPLETION, LR = 4, 4, 12, 1e-3
WARM_START_STEPS, LEARNING_LR = 40, 5e-4  # a half-trained start, room to improve (its BLEU: docs/vs_trl.md)
RESULTS = os.path.join(HERE, "results", "vs_trl.json")


def char_tokenizer():
    """Returns a character-level `PreTrainedTokenizerFast` (pad 0, EOS 1, no special tokens added to text)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, " ": 3, "=": 4, **{c: 5 + i for i, c in enumerate(ALPHABET)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def toy_rows(n: int, seed: int) -> tuple[list[str], list[str]]:
    """Returns `(prompts, references)`: 2 to 5 letters and " =", and the letters reversed."""
    rng = random.Random(seed)
    words = [[rng.choice(ALPHABET) for _ in range(rng.randint(2, 5))] for _ in range(n)]
    return [" ".join(w) + " =" for w in words], [" ".join(reversed(w)) for w in words]


def build_model(tokenizer, seed: int = 0):
    from hf_seqrl.models.tiny import build_tiny_model

    return build_tiny_model("llama", tokenizer=tokenizer, d_model=64, layers=2, heads=4, ffn=128, max_positions=64,
                            seed=seed)


def bleu(predictions: list[str], references: list[str]) -> list[float]:
    from hf_seqrl.rewards import get_reward

    return get_reward("bleu")(predictions, [[r] for r in references])


def trl_bleu(prompts, completions, reference, **kwargs) -> list[float]:
    """TRL's reward signature: the `reference` column arrives as a keyword."""
    return bleu(completions, reference)


def hf_data(tokenizer, prompts, references):
    from datasets import Dataset

    from hf_seqrl.data import tokenize_prompt_completion

    raw = Dataset.from_dict({"prompt": prompts, "completion": references})
    return raw.map(tokenize_prompt_completion, batched=True, remove_columns=raw.column_names,
                   fn_kwargs=dict(tokenizer=tokenizer))


DEVICE = ["cpu"]  # --device: where every arm trains (the Trainer places the model and the batches there)


def common_args(out: str, steps: int, seed: int, lr: float = LR) -> dict:
    return dict(output_dir=out, max_steps=steps, learning_rate=lr, lr_scheduler_type="constant", logging_steps=10**6,
                report_to=[], save_strategy="no", disable_tqdm=True, seed=seed,
                use_cpu=torch.device(DEVICE[0]).type == "cpu", bf16=False, dataloader_pin_memory=False)


def make_trainer(kind: str, model, tokenizer, prompts, references, steps: int, seed: int, out: str, callbacks=(),
                 lr: float = LR):
    """Returns the trainer of one arm: "hf-seqrl" (SCSTTrainer, leave-one-out), "trl-rloo", "trl-grpo" (TRL's
    defaults, gradient checkpointing on) or "trl-rloo-nogc" (RLOO without gradient checkpointing)."""
    if kind == "hf-seqrl":
        from hf_seqrl import SCSTTrainer, SeqRLConfig

        args = SeqRLConfig(per_device_train_batch_size=PROMPTS_PER_STEP, num_samples=NUM_GENERATIONS, baseline="mean",
                           max_new_tokens=MAX_COMPLETION, **common_args(out, steps, seed, lr))
        return SCSTTrainer(model=model, args=args, reward_funcs="bleu", processing_class=tokenizer,
                           train_dataset=hf_data(tokenizer, prompts, references), callbacks=list(callbacks))
    from datasets import Dataset

    import trl

    config_class, trainer_class = ((trl.GRPOConfig, trl.GRPOTrainer) if kind == "trl-grpo"
                                   else (trl.RLOOConfig, trl.RLOOTrainer))
    checkpointing = {"gradient_checkpointing": False} if kind == "trl-rloo-nogc" else {}
    args = config_class(per_device_train_batch_size=PROMPTS_PER_STEP * NUM_GENERATIONS,
                        num_generations=NUM_GENERATIONS, max_completion_length=MAX_COMPLETION, beta=0.0,
                        temperature=1.0, **checkpointing, **common_args(out, steps, seed, lr))
    return trainer_class(model=model, args=args, reward_funcs=trl_bleu, processing_class=tokenizer,
                         train_dataset=Dataset.from_dict({"prompt": prompts, "reference": references}),
                         callbacks=list(callbacks))


# ---- equivalence: one step on identical samples ------------------------------------------------------------------

def equivalence() -> dict:
    """Returns the leave-one-out advantages, losses and gradients of hf-seqrl and TRL's RLOO on the same samples."""
    from hf_seqrl.models.causal import sample_causal

    tokenizer = char_tokenizer()
    prompts, references = toy_rows(PROMPTS_PER_STEP, seed=7)
    with tempfile.TemporaryDirectory() as out:
        ours = make_trainer("hf-seqrl", build_model(tokenizer, seed=3), tokenizer, prompts, references, 1, 0, out)
        theirs = make_trainer("trl-rloo", build_model(tokenizer, seed=3), tokenizer, prompts, references, 1, 0, out)
    batch = ours.data_collator([ours.train_dataset[i] for i in range(PROMPTS_PER_STEP)])
    torch.manual_seed(0)
    rollout = sample_causal(ours.model, batch["input_ids"], batch["attention_mask"], batch["labels"],
                            ours.rollout_config, NUM_GENERATIONS)
    ours.family.sample = lambda *args, **kwargs: rollout  # identical samples for both
    ours.model.train()
    our_loss = ours.compute_loss(ours.model, dict(batch))
    our_loss.backward()
    # TRL receives the same completions (EOS included, nothing after it) in its own layout.
    completions = [ids[mask].tolist() for ids, mask in zip(rollout.sample_ids, rollout.sample_mask)]
    theirs._generate_single_turn = lambda *args, **kwargs: completions
    theirs.model.train()
    rows = [{"prompt": p, "reference": r} for p, r in zip(prompts, references) for _ in range(NUM_GENERATIONS)]
    scored = theirs._generate_and_score_completions(rows)
    their_loss = theirs.compute_loss(theirs.model, scored)
    their_loss.backward()
    from hf_seqrl import losses

    rewards = torch.tensor(bleu(ours.processing_class.batch_decode(rollout.sample_ids, skip_special_tokens=True),
                                [r for r in references for _ in range(NUM_GENERATIONS)]))
    our_adv = rewards - losses.leave_one_out_baseline(rewards, NUM_GENERATIONS)
    differences = [(p.grad - q.grad).abs().max().item() for p, q in zip(ours.model.parameters(),
                                                                         theirs.model.parameters())]
    scale = max(p.grad.abs().max().item() for p in ours.model.parameters())
    return dict(
        samples=len(completions), advantages_max_abs_diff=(our_adv - scored["advantages"].cpu()).abs().max().item(),
        loss_hf_seqrl=our_loss.item(), loss_trl_rloo=their_loss.item(),
        loss_note="TRL's loss is -mean(A * ratio) with ratio = 1 on-policy, hf-seqrl's -mean(A * sum log p): "
                  "different values, the same gradient",
        grad_max_abs_diff=max(differences), grad_max_abs=scale,
        grad_equal=bool(max(differences) <= 1e-5 * max(scale, 1.0)))


# ---- one arm in a fresh process: step times, memory, reward curve ------------------------------------------------

def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def run_arm(kind: str, steps: int, seed: int, init: str | None, eval_every: int) -> dict:
    """Returns step times (s), RSS before training and peak RSS (MB), and held-out BLEU every `eval_every` steps."""
    from transformers import AutoModelForCausalLM, TrainerCallback

    from hf_seqrl.models import family_for

    torch.set_num_threads(1)
    tokenizer = char_tokenizer()
    prompts, references = toy_rows(400, seed=0)
    held_prompts, held_references = toy_rows(128, seed=99)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(init) if init else build_model(tokenizer, seed=seed)
    held = tokenizer(held_prompts, padding=True, return_tensors="pt")
    times, curve = [], []

    def heldout_bleu(m) -> float:
        was_training = m.training
        m.eval()
        with torch.no_grad():
            ids = family_for(m).generate(m, dict(held), do_sample=False, max_new_tokens=MAX_COMPLETION)
        m.train(was_training)
        return statistics.fmean(bleu(tokenizer.batch_decode(ids, skip_special_tokens=True), held_references))

    class Clock(TrainerCallback):
        """Times each optimizer step from the end of the previous one: data, rollout, rewards, loss, update."""

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            now = time.perf_counter()
            times.append(now - self.last)
            if eval_every and state.global_step % eval_every == 0:
                curve.append((state.global_step, heldout_bleu(model)))
            self.last = time.perf_counter()  # evaluation is not part of the step

    with tempfile.TemporaryDirectory() as out:
        trainer = make_trainer(kind, model, tokenizer, prompts, references, steps, seed, out, [Clock()],
                               LEARNING_LR if init else LR)
        if eval_every:
            curve.append((0, heldout_bleu(trainer.model)))
        before = rss_mb()
        trainer.train()
    return dict(kind=kind, seed=seed, step_times=times, rss_before_train_mb=before,
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, curve=curve)


def spawn(kind: str, steps: int, seed: int, init: str | None = None, eval_every: int = 0) -> dict:
    command = [sys.executable, __file__, "arm", "--kind", kind, "--steps", str(steps), "--seed", str(seed),
               "--eval_every", str(eval_every), "--device", DEVICE[0]] + (["--init", init] if init else [])
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{kind} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def speed(repeats: int = 3, steps: int = 25, skip: int = 3) -> dict:
    """Returns per-arm medians over `repeats` fresh processes (arms interleaved), the first `skip` steps dropped."""
    arms = ("hf-seqrl", "trl-rloo", "trl-rloo-nogc", "trl-grpo")
    runs = {kind: [] for kind in arms}
    for repeat in range(repeats):
        for kind in arms:
            runs[kind].append(spawn(kind, steps, seed=repeat))
            print(f"speed: repeat {repeat} {kind} done", file=sys.stderr)
    table = {}
    for kind, results in runs.items():
        times = [t for r in results for t in r["step_times"][skip:]]
        table[kind] = dict(median_step_s=statistics.median(times),
                           peak_rss_mb=statistics.median(r["peak_rss_mb"] for r in results),
                           train_rss_mb=statistics.median(r["peak_rss_mb"] - r["rss_before_train_mb"] for r in results),
                           steps_timed=len(times))
    for kind in arms[1:]:
        table[kind]["hf_seqrl_time_ratio"] = table["hf-seqrl"]["median_step_s"] / table[kind]["median_step_s"]
    return dict(repeats=repeats, steps=steps, skipped_steps=skip, arms=table)


def warm_start(folder: str, steps: int = WARM_START_STEPS) -> str:
    """Returns the folder of a checkpoint after `steps` teacher-forced steps (the start of both learning arms)."""
    from hf_seqrl import SCSTTrainer, SeqRLConfig

    tokenizer = char_tokenizer()
    prompts, references = toy_rows(400, seed=0)
    model = build_model(tokenizer, seed=0)
    args = SeqRLConfig(per_device_train_batch_size=16, warmup_xe_steps=10**6,
                       **{**common_args(folder, steps, 0), "learning_rate": 3e-3})
    SCSTTrainer(model=model, args=args, reward_funcs="bleu", processing_class=tokenizer,
                train_dataset=hf_data(tokenizer, prompts, references)).train()
    model.save_pretrained(folder)
    return folder


def learning(seeds=(0, 1), steps: int = 300, eval_every: int = 50) -> dict:
    """Returns the held-out greedy sentence-BLEU curves of hf-seqrl and TRL's RLOO from one warm start."""
    with tempfile.TemporaryDirectory() as folder:
        init = warm_start(folder)
        curves = {f"{kind}/seed{seed}": spawn(kind, steps, seed, init, eval_every)["curve"]
                  for seed in seeds for kind in ("hf-seqrl", "trl-rloo")}
    return dict(steps=steps, eval_every=eval_every, seeds=list(seeds), warm_start_steps=WARM_START_STEPS,
                learning_rate=LEARNING_LR, curves=curves)


def format_table(results: dict) -> str:
    """Returns the results as markdown tables: speed and memory per arm, then the learning curves."""
    lines = []
    if "speed" in results:
        lines += ["| arm | median step (s) | hf-seqrl time / arm time | peak RSS (MB) | RSS added by training (MB) |",
                  "|---|---|---|---|---|"]
        for kind, row in results["speed"]["arms"].items():
            ratio = row.get("hf_seqrl_time_ratio")
            lines.append(f"| {kind} | {row['median_step_s']:.4f} | {'' if ratio is None else f'{ratio:.2f}'} | "
                         f"{row['peak_rss_mb']:.0f} | {row['train_rss_mb']:.0f} |")
    if "learning" in results:
        curves = results["learning"]["curves"]
        steps = [step for step, _ in next(iter(curves.values()))]
        lines += ["", "| held-out BLEU at step | " + " | ".join(map(str, steps)) + " |",
                  "|---|" + "---|" * len(steps)]
        lines += [f"| {name} | " + " | ".join(f"{value:.3f}" for _, value in curve) + " |"
                  for name, curve in sorted(curves.items())]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["equivalence", "speed", "learning", "all", "arm"])
    parser.add_argument("--kind", default="hf-seqrl")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init")
    parser.add_argument("--eval_every", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="a torch device: cpu, cuda, ...")
    args = parser.parse_args(argv)
    DEVICE[0] = args.device
    if args.what == "arm":
        print(json.dumps(run_arm(args.kind, args.steps, args.seed, args.init, args.eval_every)))
        return
    results = json.load(open(RESULTS)) if os.path.isfile(RESULTS) else {}
    import trl
    import transformers

    results["versions"] = dict(trl=trl.__version__, transformers=transformers.__version__, torch=torch.__version__)
    results["command"] = " ".join(["python", "benchmarks/vs_trl.py", *(sys.argv[1:] if argv is None else argv)])
    results["device"] = args.device
    sections = {"equivalence": equivalence, "speed": lambda: speed(args.repeats), "learning": learning}
    for name, measure in sections.items():
        if args.what in (name, "all"):
            results[name] = measure()
            os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
            with open(RESULTS, "w") as f:  # after each section, so that a later failure keeps it
                json.dump(results, f, indent=1)
    print(format_table(results))


if __name__ == "__main__":
    main()
