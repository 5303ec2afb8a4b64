"""The embedded default demo (`hf-seqrl demo --output-dir DIR`): SCST against more cross-entropy, offline.

Task: toy translation into three *dialects* of one target language, generated in code from the seed.
Each dialect is a word-for-word lexicon over the same target word forms, shuffled, so a form that
translates source word "a" in one dialect translates "b" in another: only a (source word, output word)
pair tells which dialect a sentence is in. Every training pair shows one dialect drawn at random; the
three renderings of a source are all its references, so any consistent dialect scores 100 BLEU.

Why sequence-level training has something to fix: cross-entropy asks for the mixture (each source word
has three equally likely translations). A one-layer model learns that mixture long before it learns to
read the dialect off its own prefix, so its greedy output switches dialect mid-sentence: every word is
right in *some* dialect, but bigrams and longer n-grams rarely match any one reference. More
cross-entropy keeps paying for all three dialects; SCST, rewarded by sentence BLEU against all
references, only has to commit to one.

Protocol: cross-entropy warm-up until the dev BLEU plateaus -> checkpoint C; from C, the same number of
steps of (a) SCST and (b) cross-entropy (plain `Seq2SeqTrainer`), with the same data order and learning
rate; greedy corpus BLEU and chrF on a held-out test split, against all references, for C, (a) and (b).
"""

from __future__ import annotations

import copy
import json
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass

RESULTS_FILE = "demo_results.json"
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2: pad doubles as T5's decoder start token
ARMS = ("warmup", "scst", "xe")
ARM_TITLES = {"warmup": "C: cross-entropy warm-up", "scst": "C + SCST", "xe": "C + cross-entropy"}


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
    eval_every: int = 200  # warm-up steps between dev evaluations
    patience: int = 2  # stop after this many dev evaluations without a new best
    max_warmup_steps: int = 2500
    compare_steps: int = 300  # steps of each arm from C
    num_samples: int = 1
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
    """Returns a freshly initialized tiny `T5ForConditionalGeneration` for `tokenizer`."""
    from transformers import T5Config, T5ForConditionalGeneration

    ids = {"decoder_start_token_id": tokenizer.pad_token_id, "pad_token_id": tokenizer.pad_token_id,
           "eos_token_id": tokenizer.eos_token_id}
    config = T5Config(vocab_size=len(tokenizer), d_model=settings.d_model, d_kv=settings.d_model // settings.num_heads,
                      d_ff=settings.d_ff, num_layers=settings.num_layers, num_heads=settings.num_heads,
                      feed_forward_proj="relu", dropout_rate=0.0, relative_attention_num_buckets=16, **ids)
    model = T5ForConditionalGeneration(config)
    # transformers 5 reads these from the generation config, not from the model config.
    for name, value in ids.items():
        setattr(model.generation_config, name, value)
    model.generation_config.max_new_tokens = max_new_tokens
    return model


def to_dataset(rows: list[dict], tokenizer):
    """Returns a `datasets.Dataset` with `input_ids`, `attention_mask`, `labels` and all `references`."""
    from datasets import Dataset

    sources = tokenizer([r["source"] for r in rows])
    labels = tokenizer(text_target=[r["target"] for r in rows])
    return Dataset.from_dict({"input_ids": sources["input_ids"], "attention_mask": sources["attention_mask"],
                              "labels": labels["input_ids"], "references": [r["references"] for r in rows]})


# ---- evaluation ------------------------------------------------------------------------------------


def translate(model, tokenizer, sources: list[str], desc: str, batch_size: int = 100) -> list[str]:
    """Returns the greedy translations of `sources`."""
    import torch
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    outputs = []
    with torch.no_grad():
        for start in tqdm(range(0, len(sources), batch_size), desc=desc, leave=False):
            batch = tokenizer(sources[start:start + batch_size], return_tensors="pt", padding=True)
            generated = model.generate(**batch, do_sample=False, num_beams=1)
            outputs += tokenizer.batch_decode(generated, skip_special_tokens=True)
    model.train(was_training)
    return outputs


def corpus_scores(model, tokenizer, rows: list[dict], desc: str) -> dict[str, float]:
    """Returns greedy corpus BLEU and chrF of `model` on `rows`, against all references of each source."""
    import sacrebleu

    hypotheses = translate(model, tokenizer, [r["source"] for r in rows], desc)
    # sacrebleu takes one stream per reference index; every source has the same number of dialects.
    streams = [list(refs) for refs in zip(*(r["references"] for r in rows))]
    return {"bleu": sacrebleu.corpus_bleu(hypotheses, streams).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, streams).score}


# ---- training --------------------------------------------------------------------------------------


def _plateau_stopper(tokenizer, dev_rows: list[dict], every: int, patience: int):
    """Returns a callback that scores dev BLEU every `every` steps, keeps the best weights, and stops the
    Trainer after `patience` evaluations in a row without a new best."""
    from transformers import TrainerCallback

    class PlateauStopper(TrainerCallback):
        def __init__(self):
            self.history: list[tuple[int, float]] = []
            self.best_bleu, self.best_step, self.best_state, self.stale = -1.0, 0, None, 0

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every:
                return
            bleu = corpus_scores(model, tokenizer, dev_rows, f"dev BLEU @ step {state.global_step}")["bleu"]
            self.history.append((state.global_step, round(bleu, 2)))
            if bleu > self.best_bleu:
                self.best_bleu, self.best_step, self.stale = bleu, state.global_step, 0
                self.best_state = copy.deepcopy(model.state_dict())
            else:
                self.stale += 1
                control.should_training_stop = self.stale >= patience

    return PlateauStopper()


def _training_args(config_class, work_dir: str, seed: int, steps: int, lr: float, settings: DemoSettings, **extra):
    """Returns trainer arguments shared by every phase: constant LR, fixed data order, nothing saved."""
    return config_class(output_dir=work_dir, max_steps=steps, per_device_train_batch_size=settings.batch_size,
                        learning_rate=lr, lr_scheduler_type="constant", seed=seed, data_seed=seed,
                        logging_steps=max(steps // 5, 1), save_strategy="no", report_to=[], **extra)


def _xe_trainer(model, tokenizer, dataset, args):
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer

    return Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                          data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))


def warm_up(model, tokenizer, dataset, dev_rows, settings: DemoSettings, work_dir: str, seed: int) -> dict:
    """Trains `model` with cross-entropy until dev BLEU plateaus and loads the best weights (checkpoint C).

    Returns the warm-up record: steps run, the step of C, and the dev BLEU history.
    """
    from transformers import Seq2SeqTrainingArguments

    args = _training_args(Seq2SeqTrainingArguments, work_dir, seed, settings.max_warmup_steps, settings.warmup_lr,
                          settings)
    trainer = _xe_trainer(model, tokenizer, dataset, args)
    stopper = _plateau_stopper(tokenizer, dev_rows, settings.eval_every, settings.patience)
    trainer.add_callback(stopper)
    trainer.train()
    if stopper.best_state is not None:
        model.load_state_dict(stopper.best_state)
    return {"steps_run": trainer.state.global_step, "steps": stopper.best_step or trainer.state.global_step,
            "dev_bleu_history": stopper.history,
            "criterion": f"dev greedy BLEU every {settings.eval_every} steps; stop after {settings.patience} "
                         f"evaluations without a new best (cap {settings.max_warmup_steps} steps); C = best"}


def train_scst(model, tokenizer, dataset, settings: DemoSettings, work_dir: str, seed: int, max_new_tokens: int):
    """Trains `model` with SCST for `settings.compare_steps` steps; returns the trainer's log history."""
    from .configs import SeqRLConfig
    from .trainers.scst import SCSTTrainer

    args = _training_args(SeqRLConfig, work_dir, seed, settings.compare_steps, settings.lr, settings,
                          reward="bleu", baseline="greedy", num_samples=settings.num_samples,
                          rl_weight=settings.rl_weight, max_new_tokens=max_new_tokens)
    trainer = SCSTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    return trainer.state.log_history


def train_xe(model, tokenizer, dataset, settings: DemoSettings, work_dir: str, seed: int):
    """Trains `model` with cross-entropy for `settings.compare_steps` steps; returns the log history."""
    from transformers import Seq2SeqTrainingArguments

    args = _training_args(Seq2SeqTrainingArguments, work_dir, seed, settings.compare_steps, settings.lr, settings)
    trainer = _xe_trainer(model, tokenizer, dataset, args)
    trainer.train()
    return trainer.state.log_history


# ---- report ----------------------------------------------------------------------------------------


def format_table(results: dict) -> str:
    """Returns the held-out comparison as a text table."""
    lines = [f"{'held-out test (greedy, all references)':<42}{'steps':>7}{'BLEU':>8}{'chrF':>8}{'seconds':>9}"]
    for arm in ARMS:
        row = results["arms"][arm]
        lines.append(f"{ARM_TITLES[arm]:<42}{row['steps']:>7}{row['bleu']:>8.1f}{row['chrf']:>8.1f}"
                     f"{row['seconds']:>9.0f}")
    return "\n".join(lines)


def _rl_rewards(log_history: list[dict]) -> list[float]:
    return [round(entry["rl/reward"], 4) for entry in log_history if "rl/reward" in entry]


def run_demo(output_dir: str, seed: int = 0, quick: bool = False) -> dict:
    """Runs the demo, prints the comparison table, saves the SCST model and `demo_results.json`.

    Returns the results: per arm (`warmup` = checkpoint C, `scst`, `xe`) the optimizer steps, held-out
    BLEU / chrF and seconds, plus the task, settings and warm-up record.
    """
    import torch
    from transformers import set_seed

    # Tiny matrices gain nothing from threads, and OpenMP threads competing with other processes for
    # the same cores make every step many times slower; one thread also leaves CPU to others.
    torch.set_num_threads(1)
    settings = QUICK if quick else FULL
    start = time.time()
    task = make_task(seed, settings)
    tokenizer = build_tokenizer(task["words"])
    max_new_tokens = settings.max_words + 4
    set_seed(seed)
    model = build_model(tokenizer, settings, max_new_tokens)
    dataset = to_dataset(task["train"], tokenizer)
    results = {"seed": seed, "quick": quick, "settings": asdict(settings), "arms": {},
               "task": {"dialects": settings.dialects, "train": len(task["train"]), "dev": len(task["dev"]),
                        "test": len(task["test"]), "example": task["test"][0]},
               "model": {"type": "T5ForConditionalGeneration", "parameters": sum(p.numel() for p in model.parameters())}}

    with tempfile.TemporaryDirectory() as work_dir:
        clock = time.time()
        results["warmup"] = warm_up(model, tokenizer, dataset, task["dev"], settings, work_dir, seed)
        results["arms"]["warmup"] = {"steps": results["warmup"]["steps"], "seconds": time.time() - clock,
                                     **corpus_scores(model, tokenizer, task["test"], "test: C")}
        checkpoint = copy.deepcopy(model.state_dict())

        clock = time.time()
        scst_log = train_scst(model, tokenizer, dataset, settings, work_dir, seed, max_new_tokens)
        results["arms"]["scst"] = {"steps": settings.compare_steps, "seconds": time.time() - clock,
                                   "train_rewards": _rl_rewards(scst_log),
                                   **corpus_scores(model, tokenizer, task["test"], "test: C + SCST")}

        xe_model = copy.deepcopy(model)
        xe_model.load_state_dict(checkpoint)
        clock = time.time()
        train_xe(xe_model, tokenizer, dataset, settings, work_dir, seed)
        results["arms"]["xe"] = {"steps": settings.compare_steps, "seconds": time.time() - clock,
                                 **corpus_scores(xe_model, tokenizer, task["test"], "test: C + cross-entropy")}

    results["wall_seconds"] = time.time() - start
    print(format_table(results))
    os.makedirs(output_dir, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    with open(os.path.join(output_dir, RESULTS_FILE), "w") as f:
        json.dump(results, f, indent=2)
    return results
