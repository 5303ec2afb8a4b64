"""The embedded default demo (`hf-seqrl demo --output_dir DIR`): SCST against more cross-entropy, offline.

Task: toy translation into three *dialects* of one target language, generated in code from the seed.
Each dialect is a word-for-word lexicon over the same target word forms, shuffled, so a form that
translates source word "a" in one dialect translates "b" in another: only a (source word, output word)
pair tells which dialect a sentence is in. Every training pair shows one dialect drawn at random; the
three renderings of a source are all its references, so any consistent dialect scores 100 BLEU.

Why sequence-level training has something to fix: cross-entropy asks for the mixture (each source word
has three equally likely translations). A one-layer model learns that mixture long before it learns to
read the dialect off its own prefix, so its greedy output switches dialect mid-sentence: every word is
right in *some* dialect, but bigrams and longer n-grams rarely match any one reference. More
cross-entropy keeps paying for all three dialects (run alone for 8,000 steps, its dev BLEU stayed
between 17 and 31, seed 0); SCST, rewarded by sentence BLEU against all references, only has to commit
to one. With a single dialect there is nothing to fix: cross-entropy reaches 100 BLEU by itself.

Protocol: cross-entropy warm-up until the dev BLEU plateaus -> checkpoint C; from C, the same number of
steps of (a) SCST, (b) cross-entropy (plain `Seq2SeqTrainer`) and (c) scheduled sampling, with the same data
order and learning rate; greedy corpus BLEU and chrF on a held-out test split, against all references.
"""

from __future__ import annotations

import copy
import json
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field

RESULTS_FILE = "demo_results.json"
# The held-out split, for `hf-seqrl diagnose --model DIR --data DIR/heldout_test.jsonl --target_column references`.
HELDOUT_FILE = "heldout_test.jsonl"
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2; pad doubles as the decoder start token
ARMS = ("warmup", "scst", "xe", "ss")
ARM_TITLES = {"warmup": "C: cross-entropy warm-up", "scst": "C + SCST", "xe": "C + cross-entropy",
              "ss": "C + scheduled sampling"}


@dataclass(frozen=True)
class DemoSettings:
    """Sizes and hyper-parameters of one demo run."""

    vocab_size: int = 24  # source words; each dialect maps them onto the same `vocab_size` target forms
    dialects: int = 3
    min_words: int = 4
    max_words: int = 8
    train_size: int = 4000
    dev_size: int = 200  # decides when the warm-up has plateaued
    test_size: int = 300  # the table only
    d_model: int = 64
    d_ff: int = 128
    num_heads: int = 4
    num_layers: int = 1  # small on purpose: the dialect must be hard to read off the prefix
    batch_size: int = 32
    warmup_lr: float = 3e-3
    lr: float = 1e-3  # both arms compared from C
    eval_every: int = 250  # warm-up steps between dev evaluations
    patience: int = 2  # stop after this many dev evaluations without a new best
    max_warmup_steps: int = 2500
    compare_steps: int = 300  # steps of each arm from C
    num_samples: int = 1
    baseline: str = "greedy"  # SCST's self-critical baseline; "mean" needs num_samples >= 2
    rl_weight: float = 0.9


FULL = DemoSettings()
QUICK = DemoSettings(vocab_size=12, train_size=1000, dev_size=60, test_size=60, max_words=6, eval_every=100,
                     max_warmup_steps=300, compare_steps=20)


# ---- the task ---------------------------------------------------------------------------------------


def _pseudo_words(rng: random.Random, count: int, syllables: int, taken: set[str]) -> list[str]:
    """Returns `count` new pronounceable words of `syllables` consonant-vowel syllables."""
    words = []
    while len(words) < count:
        word = "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(syllables))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


def _dialect_lexicons(rng: random.Random, forms: list[str], dialects: int) -> list[list[str]]:
    """Returns one shuffled copy of `forms` per dialect, no two dialects translating a word alike."""
    lexicons: list[list[str]] = []
    while len(lexicons) < dialects:
        candidate = rng.sample(forms, len(forms))
        # Rejection keeps the references of a source distinct word by word (about e^-k tries each).
        if all(a != b for lexicon in lexicons for a, b in zip(candidate, lexicon)):
            lexicons.append(candidate)
    return lexicons


def make_task(seed: int, settings: DemoSettings) -> dict:
    """Returns the task: `words` (vocabulary) and `train` / `dev` / `test` rows.

    A row is `{"source": str, "target": str, "references": list[str]}`: `target` is the rendering in one
    random dialect (the training label), `references` the renderings in all dialects.
    """
    rng = random.Random(seed)
    taken: set[str] = set()
    source_words = _pseudo_words(rng, settings.vocab_size, 2, taken)
    target_forms = _pseudo_words(rng, settings.vocab_size, 3, taken)
    lexicons = _dialect_lexicons(rng, target_forms, settings.dialects)

    def row() -> dict:
        ids = [rng.randrange(settings.vocab_size) for _ in range(rng.randint(settings.min_words, settings.max_words))]
        references = [" ".join(lexicon[i] for i in ids) for lexicon in lexicons]
        return {"source": " ".join(source_words[i] for i in ids), "target": rng.choice(references),
                "references": references}

    sizes = {"train": settings.train_size, "dev": settings.dev_size, "test": settings.test_size}
    task = {name: [row() for _ in range(size)] for name, size in sizes.items()}
    task["words"] = source_words + target_forms
    return task


# ---- tokenizer, model, data -------------------------------------------------------------------------


def build_tokenizer(words: list[str]):
    """Returns a word-level `PreTrainedTokenizerFast` over `words` that appends `</s>` to every text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for word in words:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def build_model(tokenizer, settings: DemoSettings, max_new_tokens: int):
    """Returns a freshly initialized tiny `MarianMTModel` (sinusoidal positions) for `tokenizer`."""
    from ..models.tiny import build_tiny_model

    model = build_tiny_model(
        "marian", tokenizer=tokenizer, d_model=settings.d_model, layers=settings.num_layers, heads=settings.num_heads,
        ffn=settings.d_ff, max_positions=2 * max_new_tokens, activation_function="relu",
        # At the default 0.02 the token embeddings are dwarfed by the unit-scale sinusoidal positions and
        # the model ignores the source for ~2,000 steps before it learns anything.
        init_std=0.1,
    )
    model.generation_config.max_new_tokens = max_new_tokens
    return model


def to_dataset(rows: list[dict], tokenizer, max_source_length: int | None = None, max_target_length: int | None = None,
               decoder_start_token_id: int | None = None):
    """Returns a `datasets.Dataset` with `input_ids`, `attention_mask`, `labels` (of each row's `target`, less a
    leading `decoder_start_token_id`) and all `references` of `rows` (dicts with `source`, `target`, `references`)."""
    from datasets import Dataset

    from ..data import strip_start_token

    sources = tokenizer([r["source"] for r in rows], truncation=max_source_length is not None,
                        max_length=max_source_length)
    labels = tokenizer(text_target=[r["target"] for r in rows], truncation=max_target_length is not None,
                       max_length=max_target_length)["input_ids"]
    return Dataset.from_dict({"input_ids": sources["input_ids"], "attention_mask": sources["attention_mask"],
                              "labels": strip_start_token(labels, decoder_start_token_id),
                              "references": [r["references"] for r in rows]})


# ---- evaluation ------------------------------------------------------------------------------------


def greedy_scores(model, tokenizer, rows: list[dict], desc: str) -> dict[str, float]:
    """Returns greedy corpus BLEU and chrF of `model` on `rows`, against all references of each source."""
    from ..evaluation import evaluate_model

    scores, _ = evaluate_model(model, tokenizer, [r["source"] for r in rows], [r["references"] for r in rows],
                               ("bleu", "chrf"), batch_size=100, desc=desc)
    return scores


# ---- training --------------------------------------------------------------------------------------


def _training_args(config_class, work_dir: str, seed: int, steps: int, lr: float, settings: DemoSettings, **extra):
    """Returns trainer arguments shared by every phase: constant LR, fixed data order, nothing saved.

    The CPU is used even where an accelerator is present: kernel launches cost a model this small more
    than they save, and the table stays comparable from one machine to the next.
    """
    return config_class(output_dir=work_dir, max_steps=steps, per_device_train_batch_size=settings.batch_size,
                        learning_rate=lr, lr_scheduler_type="constant", seed=seed, data_seed=seed,
                        logging_steps=max(steps // 5, 1), save_strategy="no", report_to=[], use_cpu=True,
                        dataloader_pin_memory=False, **extra)


def xe_trainer(model, tokenizer, dataset, args):
    """Returns a plain cross-entropy `Seq2SeqTrainer` (its collator pads `labels` with -100)."""
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer

    return Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                          data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))


def warm_up(model, tokenizer, dataset, dev_rows, settings: DemoSettings, work_dir: str, seed: int) -> dict:
    """Trains `model` with cross-entropy until dev BLEU plateaus and loads the best weights (checkpoint C).

    Returns the warm-up record: steps run, the step of C, and the dev BLEU history.
    """
    from transformers import Seq2SeqTrainingArguments

    from ..callbacks import PlateauStopper

    args = _training_args(Seq2SeqTrainingArguments, work_dir, seed, settings.max_warmup_steps, settings.warmup_lr,
                          settings)
    trainer = xe_trainer(model, tokenizer, dataset, args)
    stopper = PlateauStopper(lambda m: greedy_scores(m, tokenizer, dev_rows, "dev BLEU")["bleu"],
                             settings.eval_every, settings.patience)
    trainer.add_callback(stopper)
    trainer.train()
    stopper.restore_best(model)
    return {"steps_run": trainer.state.global_step, "steps": stopper.best_step or trainer.state.global_step,
            "dev_bleu_history": [(step, round(bleu, 2)) for step, bleu in stopper.history],
            "criterion": f"dev greedy BLEU every {settings.eval_every} steps; stop after {settings.patience} "
                         f"evaluations without a new best (cap {settings.max_warmup_steps} steps); C = best"}


def train_scst(model, tokenizer, dataset, settings: DemoSettings, work_dir: str, seed: int, max_new_tokens: int):
    """Trains `model` with SCST for `settings.compare_steps` steps; returns the trainer's log history."""
    from ..configs import SeqRLConfig
    from ..trainers import SCSTTrainer

    args = _training_args(SeqRLConfig, work_dir, seed, settings.compare_steps, settings.lr, settings,
                          baseline=settings.baseline, num_samples=settings.num_samples,
                          rl_weight=settings.rl_weight, max_new_tokens=max_new_tokens)
    trainer = SCSTTrainer(model=model, args=args, reward_funcs="bleu", train_dataset=dataset,
                          processing_class=tokenizer)
    trainer.train()
    return trainer.state.log_history


def train_scheduled_sampling(model, tokenizer, dataset, settings: DemoSettings, work_dir: str, seed: int):
    """Trains `model` with scheduled sampling for `settings.compare_steps` steps; returns the log history.

    ε decays linearly from 1 to 0.5 over the first half of the steps, then stays at 0.5.
    """
    from ..configs import ScheduledSamplingConfig
    from ..trainers import ScheduledSamplingTrainer

    args = _training_args(ScheduledSamplingConfig, work_dir, seed, settings.compare_steps, settings.lr, settings,
                          schedule="linear", schedule_k=settings.compare_steps, min_teacher_forcing_ratio=0.5)
    trainer = ScheduledSamplingTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    return trainer.state.log_history


def train_xe(model, tokenizer, dataset, settings: DemoSettings, work_dir: str, seed: int):
    """Trains `model` with cross-entropy for `settings.compare_steps` steps; returns the log history."""
    from transformers import Seq2SeqTrainingArguments

    args = _training_args(Seq2SeqTrainingArguments, work_dir, seed, settings.compare_steps, settings.lr, settings)
    trainer = xe_trainer(model, tokenizer, dataset, args)
    trainer.train()
    return trainer.state.log_history


# ---- report ----------------------------------------------------------------------------------------


def format_report(results: dict) -> str:
    """Returns the held-out comparison table, the warm-up's dev history and one example, as text."""
    lines = ["", f"{'held-out test: greedy, all references':<40}{'steps':>7}{'BLEU':>8}{'chrF':>8}{'seconds':>9}"]
    for arm in ARMS:
        row = results["arms"][arm]
        lines.append(f"{ARM_TITLES[arm]:<40}{row['steps']:>7}{row['bleu']:>8.1f}{row['chrf']:>8.1f}"
                     f"{row['seconds']:>9.0f}")
    history = ", ".join(f"{step}: {bleu:.1f}" for step, bleu in results["warmup"]["dev_bleu_history"])
    example = results["task"]["example"]
    lines += ["", f"warm-up dev BLEU by step ({results['warmup']['criterion']}):", f"  {history}", "",
              f"source      {example['source']}"]
    lines += [f"reference   {ref}" for ref in example["references"]]
    lines += [f"{arm:<12}{results['arms'][arm]['example_output']}" for arm in ARMS]
    return "\n".join(lines)


def _rl_rewards(log_history: list[dict]) -> list[float]:
    """Returns the logged mean SCST sample rewards (`rl/reward`, sentence BLEU / 100) in step order."""
    return [round(entry["rl/reward"], 4) for entry in log_history if "rl/reward" in entry]


def run_demo(output_dir: str, seed: int = 0, quick: bool = False) -> dict:
    """Runs the demo, prints the comparison table, saves the SCST model and `demo_results.json`.

    `quick=True` runs a much smaller version (under a minute), for tests. Returns the results: per arm
    (`warmup` = checkpoint C, `scst`, `xe`) the optimizer steps, held-out BLEU / chrF, wall seconds of the
    phase (with its evaluations) and the translation of one test source; plus the task, settings and the
    warm-up record.
    """
    return run_with_settings(output_dir, seed, QUICK if quick else FULL, quick=quick)


def run_with_settings(output_dir: str, seed: int, settings: DemoSettings, quick: bool = False) -> dict:
    """`run_demo` with explicit `settings` (to try other sizes and hyper-parameters)."""
    import torch

    threads = torch.get_num_threads()
    # Tiny matrices gain nothing from threads, and OpenMP threads competing with other processes for
    # the same cores make every step many times slower; one thread also leaves CPU to others.
    torch.set_num_threads(1)
    try:
        results, model, tokenizer, test_rows = compare(seed, settings)
    finally:
        torch.set_num_threads(threads)
    results["quick"] = quick
    print(format_report(results))
    os.makedirs(output_dir, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    with open(os.path.join(output_dir, RESULTS_FILE), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(output_dir, HELDOUT_FILE), "w") as f:
        for row in test_rows:
            f.write(json.dumps({"source": row["source"], "references": row["references"]}) + "\n")
    write_card(output_dir, results, settings)
    return results


def write_card(output_dir: str, results: dict, settings: DemoSettings) -> str:
    """Writes the model card of the saved SCST model (from `model_cards/`) and returns its path."""
    from ..hub import write_model_card
    from ..trainers import SCSTTrainer

    arms = results["arms"]
    metrics = {f"test_{metric}_{arm}": arms[arm][metric] for arm in ARMS for metric in ("bleu", "chrf")}
    rewards = arms["scst"].get("train_rewards") or []
    return write_model_card(
        output_dir, model_name="hf-seqrl-demo-scst", method=SCSTTrainer.method_for(settings.baseline),
        task="translation",
        datasets=[f"generated three-dialect toy translation (hf-seqrl demo, seed {results['seed']})"],
        reward="bleu",
        settings={"warmup_xe_steps (C)": results["warmup"]["steps"], "rl_steps": settings.compare_steps,
                  "num_samples": settings.num_samples, "rl_weight": settings.rl_weight,
                  "learning_rate": settings.lr, "per_device_train_batch_size": settings.batch_size},
        metrics=metrics, curve=[("rl/reward", rewards[0], rewards[-1])] if rewards else [],
        repo_id=output_dir, example_input=results["task"]["example"]["source"],
        algorithm_detail="from a cross-entropy checkpoint that had plateaued",
    )


def compare(seed: int, settings: DemoSettings):
    """Returns `(results, SCST model, tokenizer, held-out test rows)`: warm-up to C, then the arms from C."""
    from transformers import set_seed

    from ..evaluation import generate_texts

    start = time.time()
    task = make_task(seed, settings)
    tokenizer = build_tokenizer(task["words"])
    max_new_tokens = settings.max_words + 4
    set_seed(seed)
    model = build_model(tokenizer, settings, max_new_tokens)
    dataset = to_dataset(task["train"], tokenizer)
    example = task["test"][0]
    results = {"seed": seed, "settings": asdict(settings), "arms": {},
               "task": {"dialects": settings.dialects, "train": len(task["train"]), "dev": len(task["dev"]),
                        "test": len(task["test"]), "example": example},
               "model": {"type": "MarianMTModel", "parameters": sum(p.numel() for p in model.parameters())}}

    def record(arm: str, trained, steps: int, clock: float, **extra) -> None:
        scores = greedy_scores(trained, tokenizer, task["test"], f"test: {ARM_TITLES[arm]}")
        results["arms"][arm] = {"steps": steps, "seconds": time.time() - clock, **scores,
                                "example_output": generate_texts(trained, tokenizer, [example["source"]],
                                                                 desc="example")[0],
                                **extra}

    with tempfile.TemporaryDirectory() as work_dir:
        clock = time.time()
        results["warmup"] = warm_up(model, tokenizer, dataset, task["dev"], settings, work_dir, seed)
        record("warmup", model, results["warmup"]["steps"], clock)
        xe_model = copy.deepcopy(model)  # checkpoint C, for the cross-entropy arm
        ss_model = copy.deepcopy(model)  # and for the scheduled-sampling arm

        clock = time.time()
        scst_log = train_scst(model, tokenizer, dataset, settings, work_dir, seed, max_new_tokens)
        record("scst", model, settings.compare_steps, clock, train_rewards=_rl_rewards(scst_log))

        clock = time.time()
        train_xe(xe_model, tokenizer, dataset, settings, work_dir, seed)
        record("xe", xe_model, settings.compare_steps, clock)

        clock = time.time()
        train_scheduled_sampling(ss_model, tokenizer, dataset, settings, work_dir, seed)
        record("ss", ss_model, settings.compare_steps, clock)

    results["wall_seconds"] = time.time() - start
    return results, model, tokenizer, task["test"]


@dataclass
class DemoArguments:
    """`hf-seqrl demo`: where the results go, and how big the run is."""

    output_dir: str = field(default="hf_seqrl_demo", metadata={"help": "Where the model, tokenizer, card and "
                                                                       "results go."})
    seed: int = field(default=0, metadata={"help": "Seed of the generated task and of training."})
    quick: bool = field(default=False, metadata={"help": "A much smaller run (under a minute), for smoke tests."})


def main(argv: list[str] | None = None) -> int:
    """Returns the exit status of `hf-seqrl demo` run with `argv` (default: sys.argv[1:])."""
    from . import parse_command

    args = parse_command("demo", DemoArguments, argv)
    run_demo(args.output_dir, seed=args.seed, quick=args.quick)
    return 0
