"""Training arguments of the sequence-level trainers.

Every dataclass extends `transformers.Seq2SeqTrainingArguments`, so every standard field (logging,
`report_to`, checkpoints, mixed precision, gradient accumulation, `push_to_hub`, ...) keeps working.
Rules that involve several fields are checked in `__post_init__` with messages that name the field
and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from transformers import Seq2SeqTrainingArguments

from .losses import LOSS_NORMALIZATIONS
from .schedules import SCHEDULES

BASELINES = ("greedy", "mean", "moving_average", "none")
MRT_CANDIDATES = ("sample", "beam", "sample+beam")
SCALE_REWARDS = ("none", "group", "batch")


class _NoSecretsInPickle:
    """Keeps credentials out of `training_args.bin`, which the Trainer pickles into every checkpoint."""

    def __getstate__(self):
        state = self.__dict__.copy()
        for key in state:
            if key.endswith("_token") and state[key] is not None:
                state[key] = None
        return state


def check_schedule(config) -> None:
    """Raises a ValueError naming the field if `config.schedule`, `schedule_k` or `schedule_unit` is invalid."""
    name = type(config).__name__
    if config.schedule not in SCHEDULES:
        raise ValueError(f"{name}.schedule={config.schedule!r} is not one of {SCHEDULES}.")
    if config.schedule_k <= 0:
        raise ValueError(f"{name}.schedule_k must be > 0, got {config.schedule_k}.")
    if config.schedule == "inverse_sigmoid" and config.schedule_k < 1:
        raise ValueError(f"{name}.schedule_k must be >= 1 for the inverse_sigmoid schedule, got {config.schedule_k}.")
    if config.schedule_unit not in ("step", "epoch"):
        raise ValueError(f"{name}.schedule_unit must be 'step' or 'epoch', got {config.schedule_unit!r}.")


@dataclass
class SeqRLBaseConfig(_NoSecretsInPickle, Seq2SeqTrainingArguments):
    r"""
    The fields every hf-seqrl trainer shares, on top of `Seq2SeqTrainingArguments`; each trainer's config extends it.

    warmup_xe_steps (`int`, *optional*, defaults to `0`):
        Optimizer steps of plain teacher-forced cross-entropy (the `Seq2SeqTrainer` loss) before the trainer's own
        loss takes over.

    > Text datasets (a dataset without `input_ids` is tokenized when the trainer is built)

    source_column (`str`, *optional*, defaults to `None`):
        Encoder-decoder models: the column of the source texts (`None`: `"source"`, else `"prompt"`).
    target_column (`str`, *optional*, defaults to `None`):
        Encoder-decoder models: the column of the targets, a string or a list of references per row (`None`:
        `"target"`, else `"completion"`). Optional when a `references` column gives what rewards compare with.
    max_source_length (`int`, *optional*, defaults to `None`), max_target_length (`int`, *optional*, defaults to
    `None`):
        Encoder-decoder models: truncate sources / targets to this many tokens.
    max_prompt_length (`int`, *optional*, defaults to `None`), max_completion_length (`int`, *optional*, defaults
    to `None`):
        Decoder-only models (TRL's names): keep the last `max_prompt_length` tokens of a prompt (`prompt` column, text
        or chat messages) and the first `max_completion_length` of a completion (`completion`, EOS kept).
    """

    warmup_xe_steps: int = field(default=0, metadata={"help": "Teacher-forced cross-entropy steps before the "
                                                              "trainer's own loss."})
    source_column: str | None = field(default=None, metadata={"help": "Source column (default: source)."})
    target_column: str | None = field(default=None, metadata={"help": "Target column (default: target)."})
    max_source_length: int | None = field(default=None, metadata={"help": "Truncate sources to this many tokens."})
    max_target_length: int | None = field(default=None, metadata={"help": "Truncate targets to this many tokens."})
    max_prompt_length: int | None = field(default=None, metadata={"help": "Decoder-only: keep the prompt's last "
                                                                           "tokens."})
    max_completion_length: int | None = field(default=None, metadata={"help": "Decoder-only: keep the completion's "
                                                                               "first tokens."})

    def __post_init__(self):
        super().__post_init__()
        if self.warmup_xe_steps < 0:
            raise ValueError(f"{type(self).__name__}.warmup_xe_steps must be >= 0 (a number of optimizer steps), got "
                             f"{self.warmup_xe_steps}.")


@dataclass
class SeqRLConfig(SeqRLBaseConfig):
    r"""
    Arguments of [`ReinforceTrainer`] and [`SCSTTrainer`], on top of `Seq2SeqTrainingArguments`.

    Every field is plain data (JSON, pickle). The rewards themselves are a trainer argument, `reward_funcs`.

    > Reward

    reward_weights (`list[float]`, *optional*, defaults to `None`):
        Weights of the trainer's `reward_funcs` (one per reward); `None` gives every reward the same weight (they
        average).
    reward_workers (`int`, *optional*, defaults to `0`):
        With 2 or more, batches of at least 256 predictions are scored in that many worker processes (same values;
        worth it for ROUGE on long outputs with many samples). Custom callables must then be picklable.
    nonfinite_rewards (`str`, *optional*, defaults to `"error"`):
        What to do when a reward returns NaN or inf: `"error"` raises, `"drop"` leaves those samples out as if the
        reward had returned `None` (out of the loss and of their siblings' baselines) and logs their count as
        `rl/nonfinite_rewards`. A reward may always return `None` for a sample it does not apply to; see
        docs/rewards.md.

    > Baseline and advantages

    baseline (`str`, *optional*, defaults to `None`):
        `"greedy"` (self-critical: the reward of the greedy decode), `"mean"` (leave-one-out mean of the other
        samples of the same source; needs `num_samples >= 2`), `"moving_average"` (exponential moving average
        of past batch rewards) or `"none"`. `None` takes the trainer's default: `"greedy"` for
        `SCSTTrainer`, `"moving_average"` for `ReinforceTrainer`.
    baseline_ema_decay (`float`, *optional*, defaults to `0.9`):
        Decay of the `"moving_average"` baseline: `b <- decay * b + (1 - decay) * mean(batch rewards)`.
    center_advantages (`bool`, *optional*, defaults to `False`):
        Subtract the batch mean of the advantages (on each process, after the baseline, before `scale_rewards`).
        With the greedy baseline most advantages are negative while sampling is worse than greedy decoding; the
        offset only adds noise to the gradient, which drifts the policy (samples lengthen, their reward falls).
    scale_rewards (`str`, *optional*, defaults to `"none"`):
        Divide each advantage by a standard deviation of the advantages (TRL's values): `"group"`, that of its
        source's samples (needs `num_samples >= 2`); `"batch"`, that of the micro-batch's samples on every process
        together; `"none"` leaves them. Samples left out (a reward that returned `None`, a dropped non-finite one)
        count in neither; a standard deviation of ~0 or of one value leaves the advantages as they are. `True` /
        `False` mean `"batch"` / `"none"` (TRL reads `True` as `"group"`).

    > Sampling

    num_samples (`int`, *optional*, defaults to `1`):
        Sampled sequences per source.
    max_new_tokens (`int`, *optional*, defaults to `None`):
        Length limit of sampled sequences; `None` takes `generation_max_length`, then the model's default.
    temperature (`float`, *optional*, defaults to `1.0`), top_k (`int`, defaults to `0` = off),
    top_p (`float`, defaults to `1.0` = off):
        Sampling distribution of the rollouts. Log-probabilities are taken at the same temperature.
    steps_per_generation (`int`, *optional*, defaults to `None`):
        Micro-batches whose rollouts one decode serves (TRL's name). With gradient accumulation, the sources of
        `steps_per_generation` consecutive micro-batches of an optimizer step are decoded together before the first
        of them trains, which reads the weights once per token for all of them; each micro-batch then scores and
        trains on its own samples as before. Must divide `gradient_accumulation_steps`. `None` (or 1): every
        micro-batch decodes on its own (TRL's default is `gradient_accumulation_steps`). Either way each sample row
        draws from its own key (seed, process, optimizer step, row), so the samples and gradients do not depend on
        this setting.
    generation_batch_size (`int`, *optional*, defaults to `None`):
        The same in sources over all processes: `per_device_train_batch_size` × processes × `steps_per_generation`
        (TRL's name; TRL counts completions, hf-seqrl sources). Set either; `generation_steps` is what they mean.

    > Loss

    warmup_xe_steps (`int`, *optional*, defaults to `0`):
        Optimizer steps of plain teacher-forced cross-entropy before sequence-level training starts.
    rl_weight (`float`, *optional*, defaults to `1.0`):
        The loss is `rl_weight * RL + (1 - rl_weight) * XE` (Paulus et al., 2017).
    length_normalize (`bool`, *optional*, defaults to `False`):
        Use the mean instead of the sum of token log-probs of a sequence in the policy gradient.
    loss_normalization (`str`, *optional*, defaults to `"sequence"`):
        How per-token terms of the policy gradient add up to the loss. `"sequence"`: mean over sequences of each
        sequence's sum (or mean, with `length_normalize`) over its tokens, `-(1/N) sum_i A_i sum_t log p_it`.
        `"token"`: sum over every sampled token of the batch divided by their count,
        `-sum_it A_i log p_it / sum_it 1` (long samples weigh more; not with `length_normalize`).
    entropy_coef (`float`, *optional*, defaults to `0.0`):
        Subtract `entropy_coef * mean token entropy` of the sampled sequences from the loss.
    kl_coef (`float`, *optional*, defaults to `0.0`):
        Add `kl_coef * KL(policy || reference)` on the sampled positions, the reference being a frozen copy of
        the initial model (built only when > 0). The reference pass runs in the policy pass's mode with the same
        random draws, so that at equal weights the KL is exactly 0 with or without dropout.
    disable_dropout (`bool`, *optional*, defaults to `True`):
        Set every dropout probability of the model to 0 when the trainer is built (TRL's name). Rollouts decode
        without dropout; with dropout left on, the scoring pass computes the log-probs of a randomly thinned network,
        not of the distribution the samples came from, which biases the policy gradient, and a reused rollout's
        ratios move even where the weights do not. See docs/math.md.

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

    > Sample logs

    log_completions (`bool`, *optional*, defaults to `False`):
        At each training log (every `logging_steps`), gather every process's samples of the last optimizer step that
        rolled out (source, references, sample, greedy decode, each reward's value, total reward, baseline,
        advantage, whether it hit the length limit) on the main process, write them all to
        `output_dir/completions/step-N.jsonl`, print some as a table, and hand them to the TensorBoard (text) and
        W&B (table) integrations of `report_to` (TRL's name). See docs/metrics.md.
    num_completions_to_print (`int`, *optional*, defaults to `None`):
        Rows of that table printed on the console (TRL's name); `None` prints every row, `0` none (the file and the
        integrations still get every row).
    """

    reward_weights: list[float] | None = field(default=None, metadata={"help": "Weights of the reward_funcs."})
    nonfinite_rewards: str = field(default="error", metadata={"help": "'error' or 'drop' on NaN/inf rewards."})
    reward_workers: int = field(default=0, metadata={"help": "Processes scoring big reward batches (0 = in-process)."})
    baseline: str | None = field(
        default=None, metadata={"help": "greedy | mean | moving_average | none (default: the trainer's)."}
    )
    baseline_ema_decay: float = field(default=0.9, metadata={"help": "Decay of the moving-average baseline."})
    center_advantages: bool = field(default=False, metadata={"help": "Subtract the batch mean of the advantages."})
    scale_rewards: str = field(default="none", metadata={"help": "none | group | batch: divide the advantages by "
                                                                  "their std over the source or the batch."})
    num_samples: int = field(default=1, metadata={"help": "Sampled sequences per source."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Length limit of sampled sequences."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0 = off)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling (1.0 = off)."})
    steps_per_generation: int | None = field(default=None, metadata={"help": "Micro-batches decoded together (must "
                                                                              "divide gradient_accumulation_steps)."})
    generation_batch_size: int | None = field(default=None, metadata={"help": "Sources decoded together over all "
                                                                               "processes (or steps_per_generation)."})
    rl_weight: float = field(default=1.0, metadata={"help": "loss = rl_weight*RL + (1-rl_weight)*XE."})
    length_normalize: bool = field(default=False, metadata={"help": "Mean instead of sum of token log-probs."})
    entropy_coef: float = field(default=0.0, metadata={"help": "Entropy bonus coefficient."})
    kl_coef: float = field(default=0.0, metadata={"help": "KL(policy || initial model) coefficient."})
    disable_dropout: bool = field(default=True, metadata={"help": "Set the model's dropout to 0 (rollouts decode "
                                                                   "without it; the scoring pass then matches)."})
    loss_normalization: str = field(default="sequence", metadata={"help": "sequence | token"})
    num_iterations: int = field(default=1, metadata={"help": "Optimizer steps per rollout (clipped when > 1)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clipping range of the token ratio."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clipping range (None: epsilon)."})
    log_completions: bool = field(default=False, metadata={"help": "Write, print and report the samples at each "
                                                                    "log (output_dir/completions/step-N.jsonl)."})
    num_completions_to_print: int | None = field(default=None, metadata={"help": "Sample rows printed at each log "
                                                                                  "(None: all)."})

    def __post_init__(self):
        super().__post_init__()
        if self.reward_weights is not None:
            if not self.reward_weights or any(not math.isfinite(float(w)) for w in self.reward_weights):
                raise ValueError(
                    f"SeqRLConfig.reward_weights={self.reward_weights!r}: give one finite number per reward of "
                    "reward_funcs, or None for equal weights.")
            self.reward_weights = [float(w) for w in self.reward_weights]
        self.scale_rewards = str(self.scale_rewards).lower()
        if self.scale_rewards in ("true", "false"):
            self.scale_rewards = "batch" if self.scale_rewards == "true" else "none"
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"SeqRLConfig.scale_rewards={self.scale_rewards!r} is not one of {SCALE_REWARDS}.")
        if self.scale_rewards == "group" and self.num_samples < 2:
            raise ValueError(
                f"SeqRLConfig.scale_rewards='group' divides by the std of each source's samples, which needs "
                f"num_samples >= 2 (got {self.num_samples}): raise num_samples or use scale_rewards='batch'.")
        if self.baseline is not None and self.baseline not in BASELINES:
            raise ValueError(f"SeqRLConfig.baseline={self.baseline!r} is not one of {BASELINES}.")
        if self.num_samples < 1:
            raise ValueError(f"SeqRLConfig.num_samples must be >= 1, got {self.num_samples}.")
        if self.baseline == "mean" and self.num_samples < 2:
            raise ValueError(
                "SeqRLConfig.baseline='mean' (leave-one-out) needs at least two samples per source: set "
                f"num_samples >= 2 (got {self.num_samples}), or use baseline='greedy'."
            )
        if not 0.0 <= self.rl_weight <= 1.0:
            raise ValueError(f"SeqRLConfig.rl_weight must be in [0, 1], got {self.rl_weight}.")
        if not 0.0 <= self.baseline_ema_decay < 1.0:
            raise ValueError(f"SeqRLConfig.baseline_ema_decay must be in [0, 1), got {self.baseline_ema_decay}.")
        if self.temperature <= 0:
            raise ValueError(f"SeqRLConfig.temperature must be > 0, got {self.temperature}.")
        if self.top_k < 0:
            raise ValueError(f"SeqRLConfig.top_k must be >= 0 (0 disables it), got {self.top_k}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SeqRLConfig.top_p must be in (0, 1], got {self.top_p}.")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"SeqRLConfig.max_new_tokens must be >= 1 or None, got {self.max_new_tokens}.")
        if self.reward_workers < 0:
            raise ValueError(
                f"SeqRLConfig.reward_workers must be >= 0 (0 scores in-process), got {self.reward_workers}.")
        if self.entropy_coef < 0 or self.kl_coef < 0:
            raise ValueError("SeqRLConfig.entropy_coef and kl_coef must be >= 0.")
        if self.nonfinite_rewards not in ("error", "drop"):
            raise ValueError(
                f"SeqRLConfig.nonfinite_rewards must be 'error' or 'drop', got {self.nonfinite_rewards!r}."
            )
        if self.loss_normalization not in LOSS_NORMALIZATIONS:
            raise ValueError(
                f"SeqRLConfig.loss_normalization={self.loss_normalization!r} is not one of {LOSS_NORMALIZATIONS}.")
        if self.loss_normalization == "token" and self.length_normalize:
            raise ValueError(
                "SeqRLConfig.loss_normalization='token' already divides by the token count: set "
                "length_normalize=False, or loss_normalization='sequence' for per-sequence means.")
        if self.num_iterations < 1:
            raise ValueError(
                f"SeqRLConfig.num_iterations must be >= 1 (optimizer steps per rollout), got {self.num_iterations}.")
        if not self.epsilon > 0:
            raise ValueError(f"SeqRLConfig.epsilon must be > 0 (the clipping range), got {self.epsilon}.")
        if self.epsilon_high is not None and not self.epsilon_high > 0:
            raise ValueError(f"SeqRLConfig.epsilon_high must be > 0 or None (= epsilon), got {self.epsilon_high}.")
        if self.num_completions_to_print is not None and (isinstance(self.num_completions_to_print, bool) or
                                                          int(self.num_completions_to_print) < 0):
            raise ValueError(
                "SeqRLConfig.num_completions_to_print must be a number of rows >= 0, or None to print every row, got "
                f"{self.num_completions_to_print!r}.")
        if self.log_completions and self.logging_strategy == "no":
            raise ValueError(
                "SeqRLConfig.log_completions=True writes the samples at each training log, but logging_strategy='no' "
                "never logs: set logging_strategy='steps' (every logging_steps) or log_completions=False.")
        self._resolve_generation_batch()

    @property
    def generation_steps(self) -> int:
        """Returns the micro-batches one rollout decode serves: `steps_per_generation`, or what
        `generation_batch_size` means on this run's processes, else 1 (the fields keep what the user set)."""
        return self._generation_steps

    def _resolve_generation_batch(self) -> None:
        """Sets `generation_steps` from `steps_per_generation` or `generation_batch_size` and checks that they agree
        with each other and with the batch and accumulation sizes."""
        name = type(self).__name__
        self._generation_steps = 1
        if self.steps_per_generation is None and self.generation_batch_size is None:
            return
        per_step = self.per_device_train_batch_size * self.world_size
        if self.generation_batch_size is not None:
            if self.generation_batch_size < 1 or self.generation_batch_size % per_step:
                raise ValueError(
                    f"{name}.generation_batch_size={self.generation_batch_size} must be a multiple of "
                    f"per_device_train_batch_size x processes = {per_step}: set it to {per_step} x the micro-batches "
                    "one decode serves, or set steps_per_generation instead.")
            derived = self.generation_batch_size // per_step
            if self.steps_per_generation not in (None, derived):
                raise ValueError(
                    f"{name}.generation_batch_size={self.generation_batch_size} means steps_per_generation={derived} "
                    f"(with {per_step} sources per micro-batch over all processes), but steps_per_generation="
                    f"{self.steps_per_generation}: set only one of the two.")
        steps = self.steps_per_generation if self.generation_batch_size is None else derived
        if steps < 1 or self.gradient_accumulation_steps % steps:
            raise ValueError(
                f"{name}.steps_per_generation={steps} must divide gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps}: one decode serves micro-batches of one optimizer step (for "
                "rollouts that serve several optimizer steps, use num_iterations).")
        self._generation_steps = steps


@dataclass
class MRTConfig(SeqRLConfig):
    r"""
    Arguments of [`MRTTrainer`] (minimum risk training), on top of [`SeqRLConfig`].

    The candidate set `S` of a source is its `num_samples` samples, plus its greedy decode and its reference when
    asked, each distinct token sequence counted once. The loss is the risk `sum_{y in S} Q(y) (1 - r(y))`,
    `Q ∝ p(y|x)^mrt_alpha` over `S`, mixed with cross-entropy by `rl_weight`. `Q` uses the model's own
    probabilities (temperature 1), whatever `temperature` the candidates were sampled at; with `length_normalize`
    it uses the mean token log-prob instead of the sum. MRT has no baseline and no advantages: a `baseline` other
    than `None` / `"none"`, `center_advantages`, `scale_rewards`, `loss_normalization="token"` and
    `num_iterations > 1` are refused.

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

    def __post_init__(self):
        super().__post_init__()
        if not self.mrt_alpha > 0:
            raise ValueError(f"MRTConfig.mrt_alpha must be > 0, got {self.mrt_alpha}.")
        ignored = {"baseline": self.baseline not in (None, "none"), "center_advantages": self.center_advantages,
                   "scale_rewards": self.scale_rewards != "none"}
        for name, is_set in ignored.items():
            if is_set:
                raise ValueError(
                    f"MRTConfig.{name}={getattr(self, name)!r}: minimum risk training has no baseline or advantages "
                    f"(Q renormalizes over each source's candidates); leave {name} at its default.")
        if self.loss_normalization != "sequence":
            raise ValueError(
                f"MRTConfig.loss_normalization={self.loss_normalization!r}: the risk is a mean over sources; leave "
                "loss_normalization='sequence'.")
        if self.num_iterations != 1:
            raise ValueError(
                f"MRTConfig.num_iterations={self.num_iterations}: MRT recomputes Q from the current model over a "
                "fixed candidate set, there is no importance ratio to clip; set num_iterations=1.")
        if self.mrt_candidates not in MRT_CANDIDATES:
            raise ValueError(f"MRTConfig.mrt_candidates={self.mrt_candidates!r} is not one of {MRT_CANDIDATES}.")
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
        if self.max_len_b is not None and (self.max_len_a < 0 or self.max_len_a * 1 + self.max_len_b < 1):
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
class ScheduledSamplingConfig(SeqRLBaseConfig):
    r"""
    Arguments of [`ScheduledSamplingTrainer`], on top of `Seq2SeqTrainingArguments`.

    schedule (`str`, *optional*, defaults to `"linear"`):
        How the teacher-forcing ratio ε (probability of feeding the gold token) decays: `"linear"`,
        `"exponential"`, `"inverse_sigmoid"` or `"constant"`; see `hf_seqrl.schedules`.
    schedule_k (`float`, *optional*, defaults to `1000.0`):
        Time constant of the schedule, in `schedule_unit`s.
    min_teacher_forcing_ratio (`float`, *optional*, defaults to `0.5`):
        Lower bound of ε (the constant schedule's value).
    sampling (`str`, *optional*, defaults to `"argmax"`):
        How pass 1 picks the model's token: `"argmax"` or `"sample"`.
    schedule_unit (`str`, *optional*, defaults to `"step"`):
        `"step"` (optimizer steps) or `"epoch"`.
    warmup_xe_steps (`int`, *optional*, defaults to `0`):
        Optimizer steps of plain teacher forcing before mixing starts.
    """

    schedule: str = field(default="linear", metadata={"help": "linear | exponential | inverse_sigmoid | constant"})
    schedule_k: float = field(default=1000.0, metadata={"help": "Time constant of the schedule."})
    min_teacher_forcing_ratio: float = field(default=0.5, metadata={"help": "Lower bound of the ratio."})
    sampling: str = field(default="argmax", metadata={"help": "argmax | sample"})
    schedule_unit: str = field(default="step", metadata={"help": "step | epoch"})

    def __post_init__(self):
        super().__post_init__()
        check_schedule(self)
        if not 0.0 <= self.min_teacher_forcing_ratio <= 1.0:
            raise ValueError("ScheduledSamplingConfig.min_teacher_forcing_ratio must be in [0, 1].")
        if self.sampling not in ("argmax", "sample"):
            raise ValueError(f"ScheduledSamplingConfig.sampling must be 'argmax' or 'sample', got {self.sampling!r}.")


@dataclass
class MixerConfig(SeqRLConfig):
    r"""
    Arguments of [`MixerTrainer`] (MIXER, Ranzato et al., 2016), on top of [`SeqRLConfig`].

    For a target of `T` tokens (EOS included), the first `T - Δ` gold tokens are trained with cross-entropy; from
    that gold prefix the model samples the rest (`num_samples` continuations), trained with REINFORCE on the
    sequence-level reward of prefix + continuation, with any of the baselines (the greedy one continues greedily
    from the same prefix). Δ starts at `mixer_delta` and grows by `mixer_delta` every `mixer_increment_steps`
    optimizer steps after the warm-up, until whole sequences are sampled (then the loss is REINFORCE's). Per row the
    loss is `-Σ_{t<T-Δ} log p(y*_t) - A · Σ_{t>=T-Δ} log p(ŷ_t)` (sums over tokens), averaged over rows, and mixed
    with the whole target's cross-entropy by `rl_weight`. `length_normalize`, `loss_normalization="token"` and
    `num_iterations > 1` are refused.

    mixer_delta (`int`, *optional*, defaults to `2`):
        Δ at the start, and its increment.
    mixer_increment_steps (`int`, *optional*, defaults to `1000`):
        Optimizer steps between two increments of Δ.
    """

    mixer_delta: int = field(default=2, metadata={"help": "Sampled final tokens at the start, and the increment."})
    mixer_increment_steps: int = field(default=1000, metadata={"help": "Optimizer steps between increments."})

    def __post_init__(self):
        super().__post_init__()
        if self.mixer_delta < 1:
            raise ValueError(f"MixerConfig.mixer_delta must be >= 1 (tokens sampled from the end), got "
                             f"{self.mixer_delta}.")
        if self.mixer_increment_steps < 1:
            raise ValueError(f"MixerConfig.mixer_increment_steps must be >= 1, got {self.mixer_increment_steps}.")
        refused = {"length_normalize": self.length_normalize, "loss_normalization": self.loss_normalization != "sequence",
                   "num_iterations": self.num_iterations != 1,
                   "steps_per_generation": self.generation_steps != 1}
        for name, is_set in refused.items():
            if is_set:
                raise ValueError(
                    f"MixerConfig.{name}={getattr(self, name)!r}: MIXER sums the log-probs of each row's prefix and "
                    f"continuation, one update per rollout of each micro-batch's own gold prefixes; leave {name} at "
                    "its default.")


@dataclass
class ProfessorForcingConfig(SeqRLBaseConfig):
    r"""
    Arguments of [`ProfessorForcingTrainer`], on top of `Seq2SeqTrainingArguments`.

    adversarial_weight (`float`, *optional*, defaults to `1.0`):
        The model's loss is `cross-entropy + adversarial_weight * adversarial loss` (Lamb et al., 2016).
    discriminator (`str`, *optional*, defaults to `"gru"`):
        `"gru"` (a bidirectional GRU) or `"transformer"` (one transformer encoder layer) over the decoder's last
        hidden states, mean-pooled over the positions of each sequence to one logit.
    discriminator_hidden_size (`int`, *optional*, defaults to `128`):
        Width of the discriminator.
    discriminator_learning_rate (`float`, *optional*, defaults to `1e-4`):
        Learning rate of the discriminator's own Adam optimizer (one update per training batch).
    sampling (`str`, *optional*, defaults to `"argmax"`):
        How the model writes its own outputs for the free-running rows: `"argmax"` (greedy) or `"sample"`.
    max_new_tokens (`int`, *optional*, defaults to `None`):
        Length limit of the free-running outputs; `None` takes `generation_max_length`, then the model's default.
    warmup_xe_steps (`int`, *optional*, defaults to `0`):
        Optimizer steps of plain teacher forcing before the adversarial term starts.
    """

    adversarial_weight: float = field(default=1.0, metadata={"help": "Weight of the adversarial loss."})
    discriminator: str = field(default="gru", metadata={"help": "gru | transformer"})
    discriminator_hidden_size: int = field(default=128, metadata={"help": "Width of the discriminator."})
    discriminator_learning_rate: float = field(default=1e-4, metadata={"help": "Discriminator learning rate."})
    sampling: str = field(default="argmax", metadata={"help": "argmax | sample"})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Length limit of free-running outputs."})

    def __post_init__(self):
        super().__post_init__()
        if self.adversarial_weight < 0:
            raise ValueError(f"ProfessorForcingConfig.adversarial_weight must be >= 0, got {self.adversarial_weight}.")
        if self.discriminator not in ("gru", "transformer"):
            raise ValueError(
                f"ProfessorForcingConfig.discriminator={self.discriminator!r}: use 'gru' or 'transformer'.")
        if self.discriminator_hidden_size < 1 or self.discriminator_learning_rate <= 0:
            raise ValueError("ProfessorForcingConfig.discriminator_hidden_size must be >= 1 and "
                             "discriminator_learning_rate > 0.")
        if self.sampling not in ("argmax", "sample"):
            raise ValueError(f"ProfessorForcingConfig.sampling={self.sampling!r}: use 'argmax' or 'sample'.")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"ProfessorForcingConfig.max_new_tokens must be >= 1 or None, got {self.max_new_tokens}.")


@dataclass
class PrefixCorruptionConfig(SeqRLBaseConfig):
    r"""
    Arguments of [`PrefixCorruptionTrainer`] (prefix corruption and noise-level forcing), on top of
    `Seq2SeqTrainingArguments`.

    The loss is always the cross-entropy of the gold next token; only the decoder inputs are corrupted. The start
    token and padding are never corrupted.

    corruption_rate (`float`, *optional*, defaults to `0.15`):
        σ_max in [0, 1]: the probability of corrupting each decoder input once the schedule has ramped up. With
        `per_token_levels`, the upper end of the per-token levels' range.
    replacement (`str`, *optional*, defaults to `"random"`):
        What a corrupted input becomes: `"random"` (a token drawn uniformly from the vocabulary minus pad, EOS, the
        decoder start token and the tokenizer's special tokens; one parallel pass) or `"model"` (the model's own
        prediction at that position from a no-grad teacher-forced pass; two passes, as in scheduled sampling).
    per_token_levels (`bool`, *optional*, defaults to `False`):
        Noise-level forcing: every position of every sequence draws its own level σ_t ~ U(0, σ), then is corrupted
        with probability σ_t (so each input with probability σ/2, independently). `False` corrupts every input with
        probability σ.
    sampling (`str`, *optional*, defaults to `"argmax"`):
        With `replacement="model"`, how the model's token is picked: `"argmax"` or `"sample"`.
    schedule (`str`, *optional*, defaults to `"constant"`):
        How σ ramps up over time s: σ = corruption_rate · (1 − ε(s)), ε being the teacher-forcing ratio of
        `hf_seqrl.schedules` with a lower bound of 0. `"constant"`: σ = corruption_rate; `"linear"`:
        σ = corruption_rate · min(1, s/k); `"exponential"`: σ = corruption_rate · (1 − e^(−s/k));
        `"inverse_sigmoid"`: σ = corruption_rate · e^(s/k) / (k + e^(s/k)), needs k ≥ 1.
    schedule_k (`float`, *optional*, defaults to `1000.0`):
        Time constant k of the schedule, in `schedule_unit`s, counted after the warm-up.
    schedule_unit (`str`, *optional*, defaults to `"step"`):
        `"step"` (optimizer steps) or `"epoch"`.
    warmup_xe_steps (`int`, *optional*, defaults to `0`):
        Optimizer steps of plain teacher forcing before corruption starts.
    """

    corruption_rate: float = field(default=0.15, metadata={"help": "σ: probability of corrupting a decoder input."})
    replacement: str = field(default="random", metadata={"help": "random | model"})
    per_token_levels: bool = field(default=False, metadata={"help": "Noise-level forcing: σ_t ~ U(0, σ) per token."})
    sampling: str = field(default="argmax", metadata={"help": "argmax | sample (replacement='model')"})
    schedule: str = field(default="constant", metadata={"help": "constant | linear | exponential | inverse_sigmoid"})
    schedule_k: float = field(default=1000.0, metadata={"help": "Time constant of the schedule."})
    schedule_unit: str = field(default="step", metadata={"help": "step | epoch"})

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.corruption_rate <= 1.0:
            raise ValueError(f"PrefixCorruptionConfig.corruption_rate must be in [0, 1], got {self.corruption_rate}.")
        if self.replacement not in ("random", "model"):
            raise ValueError(
                f"PrefixCorruptionConfig.replacement must be 'random' or 'model', got {self.replacement!r}.")
        if self.sampling not in ("argmax", "sample"):
            raise ValueError(f"PrefixCorruptionConfig.sampling must be 'argmax' or 'sample', got {self.sampling!r}.")
        check_schedule(self)


ROLLOUT_CONTEXTS = ("exact", "shared_row")


@dataclass
class KStepRolloutConfig(SeqRLBaseConfig):
    r"""
    Arguments of [`KStepRolloutTrainer`], on top of `Seq2SeqTrainingArguments`.

    From anchors every k positions the decoder continues the gold prefix on its own tokens for k positions, each
    trained with the cross-entropy of the gold token, then re-anchors on the gold prefix.

    rollout_steps (`int`, *optional*, defaults to `4`):
        k ≥ 1: positions per anchor. The anchor position is predicted from the gold prefix, the next k − 1 after
        1 .. k − 1 of the model's own tokens. `1` is teacher forcing exactly.
    sampling (`str`, *optional*, defaults to `"argmax"`):
        How the model's own tokens are picked: `"argmax"` (greedy) or `"sample"`.
    rollout_context (`str`, *optional*, defaults to `"exact"`):
        `"exact"`: every chunk sees the gold prefix up to its anchor, then its own tokens (one decoder row per
        anchor). `"shared_row"`: a cheaper approximation with one row per source, where a chunk also sees the
        model's tokens of the earlier chunks, and only anchor inputs are gold (see docs/math.md).
    warmup_xe_steps (`int`, *optional*, defaults to `0`):
        Optimizer steps of plain teacher forcing before the rollouts start.
    """

    rollout_steps: int = field(default=4, metadata={"help": "k: positions per anchor (1 = teacher forcing)."})
    sampling: str = field(default="argmax", metadata={"help": "argmax | sample"})
    rollout_context: str = field(default="exact", metadata={"help": "exact | shared_row"})

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.rollout_steps, bool) or int(self.rollout_steps) != self.rollout_steps \
                or self.rollout_steps < 1:
            raise ValueError(f"KStepRolloutConfig.rollout_steps must be an integer >= 1, got {self.rollout_steps!r}.")
        self.rollout_steps = int(self.rollout_steps)
        if self.sampling not in ("argmax", "sample"):
            raise ValueError(
                f"KStepRolloutConfig.sampling must be 'argmax' or 'sample', got {self.sampling!r}.")
        if self.rollout_context not in ROLLOUT_CONTEXTS:
            raise ValueError(
                f"KStepRolloutConfig.rollout_context must be one of {ROLLOUT_CONTEXTS}, got {self.rollout_context!r}.")
