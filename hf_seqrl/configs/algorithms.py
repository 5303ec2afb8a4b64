"""The configs of the rewarded trainers: `SeqRLConfig` (SCST, REINFORCE, leave-one-out, clipped reuse), `MRTConfig`
(minimum risk training) and `MixerConfig` (MIXER); each holds only the fields its trainer accepts."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..losses import check_loss_normalization
from .base import Range, check_choice
from .rollout import BaselineConfig, RolloutConfig

MRT_CANDIDATES = ("sample", "beam", "sample+beam")


@dataclass
class SeqRLConfig(BaselineConfig):
    r"""
    Arguments of [`ReinforceTrainer`] and [`SCSTTrainer`]: [`BaselineConfig`] (on top of [`RolloutConfig`]), plus how
    the policy gradient adds up and reuses rollouts.

    loss_normalization (`str`, *optional*, defaults to `"sequence"`):
        How per-token terms of the policy gradient add up to the loss. `"sequence"`: mean over sequences of each
        sequence's sum (or mean, with `length_normalize`) over its tokens, `-(1/N) sum_i A_i sum_t log p_it`.
        `"token"`: sum over every sampled token of the batch divided by their count,
        `-sum_it A_i log p_it / sum_it 1` (long samples weigh more; not with `length_normalize`).

    > Clipped multi-update steps

    num_iterations (`int`, *optional*, defaults to `1`):
        Optimizer steps per rollout (μ). With `μ > 1` every group of batches of one optimizer step is drawn `μ` times
        in a row (warm-up steps included), it is decoded and scored once, and the `μ` steps on it use the clipped
        surrogate of PPO/GRPO with the token ratio `p_θ / p_old`, `p_old` taken at rollout time. An incomplete last
        group of an epoch is dropped.
    epsilon (`float`, *optional*, defaults to `0.2`):
        Lower clipping range: the ratio is clipped to `[1 - epsilon, 1 + epsilon_high]` (only with `μ > 1`).
    epsilon_high (`float`, *optional*, defaults to `None`):
        Upper clipping range; `None` takes `epsilon`.
    importance_sampling_level (`str`, *optional*, defaults to `"token"`):
        The ratio that is clipped (TRL's name): `"token"`, one per token; `"sequence"` (GSPO, Zheng et al., 2025), one
        per sample, `exp(mean_t log(p_θ / p_old))` over its tokens, clipped per sample, its gradient reaching every
        token of the sample. With `"sequence"` even `num_iterations=1` trains through it (ratio 1: the gradient of the
        length-normalized policy gradient). It needs `loss_normalization="sequence"` and `length_normalize=False`:
        the sequence ratio is already a mean over tokens, and a token-level sum would weigh samples by length.
    delta (`float`, *optional*, defaults to `None`):
        Upper bound of the ratio in the unclipped term (TRL's name; two-sided clipping as in INTELLECT-2): with a
        negative advantage the surrogate `min(r A, clip(r) A)` grows with `r` without bound, `delta` caps it. Must
        exceed `1 + epsilon_high`. Token or sequence level alike.
    """

    loss_normalization: str = field(default="sequence", metadata={"help": "sequence | token"})
    num_iterations: int = field(default=1, metadata={"help": "Optimizer steps per rollout (clipped when > 1)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clipping range of the token ratio."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clipping range (None: epsilon)."})
    importance_sampling_level: str = field(default="token", metadata={"help": "token | sequence (GSPO): the ratio "
                                                                              "that is clipped."})
    delta: float | None = field(default=None, metadata={"help": "Cap of the unclipped ratio (negative advantages)."})

    FIELD_RANGES = {"num_iterations": Range(1), "epsilon": Range(0, low_open=True),
                    "epsilon_high": Range(0, low_open=True), "delta": Range(1, low_open=True)}

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        check_loss_normalization(self.loss_normalization, self.length_normalize, self.importance_sampling_level,
                                 owner=name)
        high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        if self.delta is not None and not self.delta > 1 + high:
            raise ValueError(f"{name}.delta={self.delta} must exceed 1 + epsilon_high = {1 + high} (the band's top), "
                             "or be None.")


@dataclass
class MRTConfig(RolloutConfig):
    r"""
    Arguments of [`MRTTrainer`] (minimum risk training), on top of [`RolloutConfig`].

    The candidate set `S` of a source is its `num_samples` samples, plus its greedy decode and its reference when
    asked, each distinct token sequence counted once. The loss is the risk `sum_{y in S} Q(y) (1 - r(y))`,
    `Q ∝ p(y|x)^mrt_alpha` over `S`, mixed with cross-entropy by `rl_weight`. `Q` uses the model's own
    probabilities (temperature 1), whatever `temperature` the candidates were sampled at; with `length_normalize`
    it uses the mean token log-prob instead of the sum. MRT has no baseline and no advantages: `Q`'s
    renormalization over each source's candidates plays their part.

    num_samples (`int`, *optional*, defaults to `4`):
        Candidates per source drawn by `mrt_candidates`: samples, or the n-best of the beam.
    mrt_candidates (`str`, *optional*, defaults to `"sample"`):
        Where the candidates come from: `"sample"` (`num_samples` samples of the rollout decode), `"beam"` (the
        `num_samples`-best list of a beam search of width `mrt_beam_size` from the current model, as fairseq's and
        Nematus' sequence-level training draw them: `generate` with the model's own generation config, e.g. its
        length penalty and banned tokens) or `"sample+beam"` (both, `2 * num_samples`).
    mrt_beam_size (`int`, *optional*, defaults to `4`):
        Beam width of `"beam"` candidates; at least `num_samples`.
    max_len_a (`float`, *optional*, defaults to `0.0`), max_len_b (`int`, *optional*, defaults to `None`):
        A candidate length limit relative to the source (fairseq's names): at most
        `int(max_len_a * source_tokens + max_len_b)` tokens, EOS included (at least 1); a longer sample ends with
        EOS there, and the beam search is forced to end there. `None` turns it off.
    mrt_alpha (`float`, *optional*, defaults to `0.005`):
        Sharpness α of `Q`; 0.005 suits summed log-probs (Shen et al., 2016). Larger values concentrate `Q` on the
        likeliest candidates; with `length_normalize`, values near 1 are comparable.
    mrt_include_greedy (`bool`, *optional*, defaults to `False`):
        Add the greedy decode of each source to its candidates.
    mrt_include_reference (`bool`, *optional*, defaults to `False`):
        Add the tokenized label of each source (needs `labels` in the dataset) to its candidates.
    """

    num_samples: int = field(default=4, metadata={"help": "Candidates per source: samples or the beam's n-best."})
    mrt_candidates: str = field(default="sample", metadata={"help": "sample | beam | sample+beam"})
    mrt_beam_size: int = field(default=4, metadata={"help": "Beam width of the 'beam' candidates."})
    max_len_a: float = field(default=0.0, metadata={"help": "Candidate length limit: max_len_a * source + max_len_b."})
    max_len_b: int | None = field(default=None, metadata={"help": "Candidate length limit (None: off)."})
    mrt_alpha: float = field(default=0.005, metadata={"help": "Sharpness of Q ∝ p^alpha over the candidates."})
    mrt_include_greedy: bool = field(default=False, metadata={"help": "Add the greedy decode to the candidates."})
    mrt_include_reference: bool = field(default=False, metadata={"help": "Add the label to the candidates."})

    FIELD_RANGES = {"mrt_beam_size": Range(1), "max_len_a": Range(0), "max_len_b": Range(0),
                    "mrt_alpha": Range(0, low_open=True)}

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "mrt_candidates", MRT_CANDIDATES)
        if "beam" in self.mrt_candidates and self.mrt_beam_size < self.num_samples:
            raise ValueError(
                f"MRTConfig.mrt_beam_size={self.mrt_beam_size} is below num_samples={self.num_samples}: a beam keeps "
                "at most its width of hypotheses; raise mrt_beam_size or lower num_samples.")
        if self.mrt_candidates == "beam" and self.mrt_include_greedy:
            raise ValueError(
                "MRTConfig.mrt_include_greedy=True with mrt_candidates='beam': the greedy decode comes with the "
                "sampling decode, which 'beam' skips; use mrt_candidates='sample+beam' or mrt_include_greedy=False.")
        if self.max_len_b is None and self.max_len_a:
            raise ValueError(f"MRTConfig.max_len_a={self.max_len_a} needs max_len_b (the limit is max_len_a * source "
                             "tokens + max_len_b): set max_len_b, e.g. 10.")
        if self.max_len_b is not None and self.max_len_a * 1 + self.max_len_b < 1:
            raise ValueError(f"MRTConfig: the length limit max_len_a={self.max_len_a} * source + max_len_b="
                             f"{self.max_len_b} must allow at least one token.")
        drawn = self.num_samples * (2 if self.mrt_candidates == "sample+beam" else 1)
        candidates = drawn + int(self.mrt_include_greedy) + int(self.mrt_include_reference)
        if candidates < 2:
            raise ValueError(
                f"MRTConfig has {candidates} candidate per source (num_samples={self.num_samples}, "
                f"mrt_include_greedy={self.mrt_include_greedy}, mrt_include_reference={self.mrt_include_reference}): "
                "Q over one candidate is 1 and the risk has no gradient. Set num_samples >= 2.")


@dataclass
class MixerConfig(BaselineConfig):
    r"""
    Arguments of [`MixerTrainer`] (MIXER, Ranzato et al., 2016), on top of [`BaselineConfig`].

    For a target of `T` tokens (EOS included), the first `T - Δ` gold tokens are trained with cross-entropy; from
    that gold prefix the model samples the rest (`num_samples` continuations), trained with REINFORCE on the
    sequence-level reward of prefix + continuation, with any of the baselines (the greedy one continues greedily
    from the same prefix). Δ starts at `mixer_delta` and grows by `mixer_delta` every `mixer_increment_steps`
    optimizer steps after the warm-up, until whole sequences are sampled (then the loss is REINFORCE's). Per row the
    loss is `-Σ_{t<T-Δ} log p(y*_t) - A · Σ_{t>=T-Δ} log p(ŷ_t)` (sums over tokens), averaged over rows, and mixed
    with the whole target's cross-entropy by `rl_weight`. Each micro-batch decodes its own continuations, once: the
    fields of whole-sequence rollouts (`steps_per_generation`, `generation_batch_size`, `length_normalize`) are
    refused.

    mixer_delta (`int`, *optional*, defaults to `2`):
        Δ at the start, and its increment.
    mixer_increment_steps (`int`, *optional*, defaults to `1000`):
        Optimizer steps between two increments of Δ.
    """

    mixer_delta: int = field(default=2, metadata={"help": "Sampled final tokens at the start, and the increment."})
    mixer_increment_steps: int = field(default=1000, metadata={"help": "Optimizer steps between increments."})

    FIELD_RANGES = {"mixer_delta": Range(1), "mixer_increment_steps": Range(1)}

    def __post_init__(self):
        super().__post_init__()
        for name, default in (("steps_per_generation", None), ("generation_batch_size", None),
                              ("length_normalize", False)):
            if getattr(self, name) != default:
                raise ValueError(
                    f"MixerConfig.{name}={getattr(self, name)!r}: MIXER continues each micro-batch's own gold "
                    "prefixes, decoded when the micro-batch trains, and sums the continuation's log-probs; decoding "
                    f"ahead and length normalization do not apply. Leave {name} at {default!r} (SeqRLConfig and "
                    "MRTConfig take it).")
