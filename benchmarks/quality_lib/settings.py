"""The quality benchmark's settings: the `Settings` of each task (full and `--quick`), the arms' names, and the
`--set FIELD=VALUE` overrides with the run names they give."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace

from hf_seqrl.demo import FULL, QUICK, DemoSettings

# The benchmarks folder: its cache/ and results/ hold the runs, and the shared data sits two levels above it.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data"))
ARMS = ("xe", "ss", "scst", "loo4")
TITLES = {"C": "C (cross-entropy to plateau)", "xe": "C + cross-entropy", "ss": "C + scheduled sampling",
          "pf": "C + professor forcing", "mixer": "C + MIXER", "pc": "C + prefix corruption (σ 0.15)",
          "noise": "C + noise-level forcing (σ_t ~ U(0, 0.3))", "kstep2": "C + 2-step rollout",
          "kstep4": "C + 4-step rollout",
          "scst": "C + SCST (greedy baseline)", "loo4": "C + leave-one-out (4 samples)",
          "scst_clip": "C + SCST, clipped multi-update", "loo4_clip": "C + leave-one-out (4), clipped multi-update",
          "mrt": "C + minimum risk training",
          "mrt_beam": "C + MRT over the beam's n-best",
          "scst_tokens": "C + SCST, token_match (token-level)", "loo4_tokens": "C + leave-one-out (4), token_match",
          "kd_word": "C + word-level KD (gold prefixes)", "kd_seq": "C + sequence-level KD (teacher beams)",
          "distill": "C + on-policy distillation (reverse KL)", "gkd": "C + GKD (λ 0.5, JSD β 0.5)",
          "distill_bleu": "C + on-policy distillation + BLEU",
          "mbr_offline": "C + MBR self-training (offline picks)", "mbr_online": "C + MBR fine-tuning (online)"}
RL_ARMS = {"scst": {"baseline": "greedy", "num_samples": 1}, "loo4": {"baseline": "mean", "num_samples": 4},
           "scst_clip": {"baseline": "greedy", "num_samples": 1}, "loo4_clip": {"baseline": "mean", "num_samples": 4},
           "scst_tokens": {"baseline": "greedy", "num_samples": 1},
           "loo4_tokens": {"baseline": "mean", "num_samples": 4}}
# The RL arms rewarded with `token_match` (sentence chrF plus a penalty on each word the reference does not align to,
# mapped to its tokens) instead of `reward`: token-level advantages.
TOKEN_ARMS = ("scst_tokens", "loo4_tokens")
# The arms that distill from the teacher (a C of `teacher_*` sizes trained by the same protocol on the same
# tokenizer): (lmbda, beta) of `DistillationConfig`. `kd_seq` is cross-entropy on the teacher's beam decodes.
DISTILL_ARMS = {"kd_word": (0.0, 0.0), "distill": (1.0, 1.0), "gkd": (0.5, 0.5), "distill_bleu": (1.0, 1.0)}
TEACHER_ARMS = (*DISTILL_ARMS, "kd_seq")
# The arms trained by cross-entropy on C's own MBR picks (Finkelstein et al., 2024): `mbr_offline` on picks of the first
# `mbr_train_sources` training sources decoded once, `mbr_online` on the picks among each batch's fresh samples.
MBR_ARMS = ("mbr_offline", "mbr_online")
# The arms that take several optimizer steps per rollout (`clip_iterations`, the clipped surrogate).
CLIPPED_ARMS = ("scst_clip", "loo4_clip")
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
    c_max_steps: int = 20000  # (C) the first stage's cap: C stops on its dev plateau or here, whatever the device
    anneal_lr: float | None = 2e-4  # (C) then cross-entropy at this LR until dev plateaus again (None: skip)
    anneal_max_steps: int = 3000  # (C) the annealing stage's cap
    arm_lr: float = 2e-4
    rl_lr: float = 0.0  # learning rate of the SCST / leave-one-out arms; 0 = arm_lr
    budget_positions: int = 1_000_000  # decoder token positions per arm
    rl_weight: float = 0.7
    center_advantages: bool = False  # RL arms: subtract the batch mean of the advantages
    rl_temperature: float = 1.0  # RL arms: sampling temperature of the rollouts (log-probabilities at the same one)
    disable_dropout: bool = True  # RL arms and MRT: SeqRLConfig.disable_dropout (false: C's dropout stays on)
    rl_max_new_tokens: int = 0  # rewarded arms: length limit of the rollouts (0 = max_new_tokens, the evaluation's)
    mask_truncated_completions: bool = False  # RL arms: samples cut at rl_max_new_tokens leave the loss
    multi_objective_aggregation: str = "sum_then_normalize"  # RL arms, several rewards: or normalize_then_sum
    reward: str = ""  # rewarded arms: "" = metrics[0]; else names joined by "+" (their mean): a metric, embedding, bertscore
    extra_metrics: tuple[str, ...] = ()  # also scored on every split: embedding, bertscore (MiniLM), source_copy,
    # target_language (% of letters in guard_lang), repetition (% repeated word 3-grams)
    guards: tuple[str, ...] = ()  # rewarded arms: the reward gated by these (rewards.guard): source_copy, repetition,
    # length_ratio, target_language (guard_lang)
    guard_lang: str = "en"  # the target_language guard's and metric's language
    ss_min_ratio: float = 0.75
    clip_iterations: int = 2  # clipped arms: optimizer steps per rollout (the ratio clipped to 1 ± clip_epsilon)
    clip_epsilon: float = 0.2  # clipped arms
    clip_epsilon_high: float = 0.0  # clipped arms: upper clip 1 + clip_epsilon_high (0 = clip_epsilon)
    importance_sampling_level: str = "token"  # clipped arms: the ratio clipped, per token or per sequence (GSPO)
    length_normalize: bool = False  # RL arms: each sample's log-prob a mean over its tokens, not their sum
    mrt_alpha: float = 0.005  # mrt: Q ∝ p(y|x)^alpha over each source's candidates (summed log-probs)
    mrt_samples: int = 4  # mrt: sampled candidates per source; the greedy decode is added to them (mrt_beam: n-best)
    mrt_beam_size: int = 4  # mrt_beam: beam width of the candidates (the beam's decoder positions count in the budget)
    pf_adversarial_weight: float = 1.0  # pf: weight of the adversarial loss beside cross-entropy
    eval_batch: int = 64
    beams: tuple[int, ...] = (1, 4)
    diag_examples: int = 200
    diag_horizon: int = 12
    diag_inject: tuple[int, ...] = (0, 1, 2, 4, 8)  # positions of the injected mistakes
    token_penalty: float = 0.1  # token arms: token_match's value on each unaligned prediction word
    token_reward_to_go: bool = False  # token arms: each token's value summed from it to the end of the sample
    record_predictions: bool = False  # keep the greedy test outputs of C and of every unit (token arms' analysis)
    teacher_d_model: int = 256  # (T) the teacher's sizes: a C of these trained by C's protocol, C's tokenizer
    teacher_ffn: int = 1024  # (T)
    teacher_layers: int = 3  # (T)
    teacher_heads: int = 4  # (T)
    teacher_max_steps: int | None = None  # (T) the teacher's first-stage cap (None: c_max_steps); the plateau stops it
    teacher_lr: float | None = None  # (T) the teacher's first-stage learning rate (None: c_lr); annealing: anneal_lr
    teacher_dropout: float | None = None  # (T) the teacher's dropout while it trains (None: dropout)
    mbr_samples: int = 16  # MBR arms: samples per source whose MBR pick is trained on
    mbr_utility: str = "chrf"  # MBR arms: the utility of the picks (a reward name)
    mbr_epsilon: float = 0.02  # MBR arms: the samples' epsilon_cutoff (temperature 1)
    mbr_rl_weight: float = 1.0  # mbr_online: the picks' cross-entropy weight; the rest goes to the gold targets'
    mbr_train_sources: int = 5000  # mbr_offline: the first training sources whose picks are decoded (in its budget)
    kd_weight: float = 0.5  # kd_word: the divergence's share beside cross-entropy (Kim & Rush); on-policy: rl_weight
    seeds: tuple[int, ...] = (0, 1)
    device: str = "cpu"  # where every phase runs (--device); the budget counts positions, not seconds


C_FIELDS = ("task", "train_limit", "max_source_tokens", "max_target_tokens", "vocab_size", "d_model", "ffn",
            "layers", "heads", "dropout", "cross_attention_init", "batch_size", "c_lr", "c_warmup_steps",
            "eval_every", "patience", "c_max_steps")
ANNEAL_FIELDS = ("anneal_lr", "anneal_max_steps")
TEACHER_FIELDS = ("teacher_d_model", "teacher_ffn", "teacher_layers", "teacher_heads", "teacher_max_steps",
                  "teacher_lr", "teacher_dropout")

TRANSLATION = Settings(task="translation", metrics=("bleu", "chrf"), c_max_steps=5000)
SUMMARIZATION = Settings(
    task="summarization", metrics=("rougeL", "rouge1", "rouge2"), dev_size=150, max_source_tokens=128,
    max_target_tokens=64, max_new_tokens=48, batch_size=8, c_lr=1e-4, c_warmup_steps=50, eval_every=125,
    patience=4, cross_attention_init="self", anneal_lr=None, arm_lr=2e-5,
    budget_positions=100_000, diag_examples=50, diag_horizon=8)


def demo_task(demo: DemoSettings, **fields) -> Settings:
    """Returns the `Settings` of the demo's task (`hf_seqrl.demo`) with the demo's sizes and learning rates, and
    `fields` for what the demo has no setting of."""
    return Settings(task="demo", metrics=("bleu", "chrf"), train_limit=demo.train_size, dev_size=demo.dev_size,
                    test_limit=demo.test_size, max_new_tokens=demo.max_new_tokens, vocab_size=demo.vocab_size,
                    d_model=demo.d_model, ffn=demo.d_ff, layers=demo.num_layers, heads=demo.num_heads,
                    batch_size=demo.batch_size, c_lr=demo.warmup_lr, eval_every=demo.eval_every,
                    patience=demo.patience, c_max_steps=demo.max_warmup_steps, arm_lr=demo.lr,
                    rl_weight=demo.rl_weight, **fields)


def demo_settings(settings: Settings) -> DemoSettings:
    """Returns the `hf_seqrl.demo.DemoSettings` of the demo task's sizes (sentence lengths stay the demo's
    defaults)."""
    return DemoSettings(vocab_size=settings.vocab_size, train_size=settings.train_limit, dev_size=settings.dev_size,
                        test_size=settings.test_limit, d_model=settings.d_model, d_ff=settings.ffn,
                        num_heads=settings.heads, num_layers=settings.layers)


# What the demo does not set: the benchmark's truncation, budget and evaluation sizes (the demo's scheduled
# sampling floor is 0.5 and it scores 100 rows at a time).
DEMO_FIELDS = dict(max_source_tokens=16, max_target_tokens=16, dropout=0.0, c_warmup_steps=0,
                   anneal_lr=None, budget_positions=100_000, ss_min_ratio=0.5, eval_batch=100, diag_examples=100,
                   diag_horizon=8, diag_inject=(0, 1, 2, 4))
SETTINGS = {
    ("demo", False): demo_task(FULL, **DEMO_FIELDS),
    ("demo", True): demo_task(QUICK, **{**DEMO_FIELDS, "budget_positions": 2500,
                                        "diag_examples": 20, "diag_horizon": 4, "diag_inject": (0, 2), "seeds": (0,)}),
    ("translation", False): TRANSLATION,
    ("translation", True): replace(TRANSLATION, train_limit=3000, dev_size=100, test_limit=100, vocab_size=1000,
                                   d_model=64, ffn=128, layers=1, eval_every=40, c_max_steps=200, c_warmup_steps=20,
                                   anneal_max_steps=80, budget_positions=8000, teacher_d_model=128,
                                   teacher_ffn=256, teacher_layers=1,
                                   diag_examples=20, diag_horizon=4,
                                   diag_inject=(0, 2), seeds=(0,)),
    ("summarization", False): SUMMARIZATION,
    ("summarization", True): replace(SUMMARIZATION, train_limit=32, dev_size=8, test_limit=8, max_source_tokens=48,
                                     max_target_tokens=16, max_new_tokens=10, eval_every=2, c_max_steps=4,
                                     budget_positions=400,
                                     diag_examples=4, diag_horizon=3, diag_inject=(0,), seeds=(0,), eval_batch=8),
}


def rollout_tokens(settings: Settings) -> int:
    """Returns the length limit of the rewarded arms' rollouts."""
    return settings.rl_max_new_tokens or settings.max_new_tokens


def default_work_dir(task: str, quick: bool = False) -> str:
    """Returns the folder of a task's checkpoint C, tokenizer and finished units, which the benchmarks share."""
    return os.path.join(HERE, "cache", f"quality_{task}" + ("_quick" if quick else ""))


def stage_fields(stage: str) -> tuple[str, ...]:
    """Returns the settings that define a stage of C (and its cache)."""
    return C_FIELDS + (ANNEAL_FIELDS if stage == "C_annealed" else ())


# The arms that sample and reward (MIXER's sampled suffix is trained as the SCST arm's samples are).
REWARDED_ARMS = (*SEQUENCE_ARMS, "mixer", "distill", "gkd", "distill_bleu")
# Fields that only some arms read: runs of the other arms are shared with the unchanged settings.
ARM_ONLY = {**dict.fromkeys(("rl_lr", "rl_weight", "rl_temperature"), REWARDED_ARMS),
            "center_advantages": (*RL_ARMS, "mixer", "distill_bleu"), "ss_min_ratio": ("ss",),
            "disable_dropout": (*SEQUENCE_ARMS, *DISTILL_ARMS),
            "rl_max_new_tokens": REWARDED_ARMS,
            **dict.fromkeys(("mask_truncated_completions", "multi_objective_aggregation", "length_normalize"), RL_ARMS),
            **dict.fromkeys(("clip_iterations", "clip_epsilon", "clip_epsilon_high", "importance_sampling_level"), CLIPPED_ARMS),
            **dict.fromkeys(("mrt_alpha", "mrt_samples"), ("mrt", "mrt_beam")), "mrt_beam_size": ("mrt_beam",),
            "pf_adversarial_weight": ("pf",),
            **dict.fromkeys(("reward", "guards"), tuple(a for a in REWARDED_ARMS
                                                         if a not in (*TOKEN_ARMS, "distill", "gkd"))),
            "guard_lang": REWARDED_ARMS,
            **dict.fromkeys(("token_penalty", "token_reward_to_go"), TOKEN_ARMS), "kd_weight": ("kd_word",),
            **dict.fromkeys(TEACHER_FIELDS, TEACHER_ARMS),
            **dict.fromkeys(("mbr_samples", "mbr_utility", "mbr_epsilon"), MBR_ARMS),
            "mbr_train_sources": ("mbr_offline",), "mbr_rl_weight": ("mbr_online",)}


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
            element = str if "str" in Settings.__dataclass_fields__[key].type else int
            changes[key] = tuple(element(v) for v in value.split(",") if v)
        else:
            changes[key] = kind(value)
    return replace(settings, **changes), changes
