"""What the rewarded trainers share, one linear chain: `RolloutConfig` (rewards, sampling, decoding ahead, mixing,
entropy, KL, sample logs) for all of them, then `BaselineConfig` (baselines and advantages) for the policy gradients
(`SeqRLConfig`, `MixerConfig`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..functional.advantages import AGGREGATIONS, BASELINES, SCALINGS as SCALE_REWARDS, AdvantageSettings
from .base import MAX_NEW_TOKENS_RANGE, Range, SeqRLBaseConfig, check_choice, max_new_tokens_field, parse_init_kwargs


@dataclass
class RolloutConfig(SeqRLBaseConfig):
    r"""
    What every rewarded trainer (SCST, REINFORCE, MRT, MIXER) shares, on top of [`SeqRLBaseConfig`]. Every field is
    plain data (JSON, pickle); the rewards themselves are a trainer argument, `reward_funcs`.

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
    save_on_error (`bool`, *optional*, defaults to `True`):
        When a reward raises, write a checkpoint of the steps done so far (`output_dir/checkpoint-N`, as
        `save_strategy` would) before the error propagates, so that `resume_from_checkpoint` continues from there
        instead of from the last scheduled checkpoint. The error names the reward, the 1-based training step, the
        rows and the checkpoint. Single-process runs only: a checkpoint is a collective on several processes, and a
        reward that raises on one rank leaves the others waiting.
    ds3_gather_for_generation (`bool`, *optional*, defaults to `True`):
        TRL's field. A model sharded by FSDP2 or DeepSpeed ZeRO-3 is gathered once per rollout decode, decodes with
        no collective per token (each rank on its own, not in lockstep) and is sharded again after it
        (`hf_seqrl.models.sharding`). `False` keeps the per-layer path, every forward gathering what it runs: for a
        model too large to hold whole on one device.

    teacher_model_init_kwargs (`dict` or `str`, *optional*, defaults to `None`):
        Keyword arguments of `from_pretrained` when the trainer's `teacher_model` is a Hub id or a folder (TRL's
        name), e.g. `{"dtype": "bfloat16"}` for a teacher held in half precision; a JSON string on the command line.

    > Sampling

    num_samples (`int`, *optional*, defaults to `1`):
        Sampled sequences per source.
    temperature (`float`, *optional*, defaults to `1.0`), top_k (`int`, defaults to `0` = off),
    top_p (`float`, defaults to `1.0` = off), epsilon_cutoff (`float`, defaults to `0.0` = off):
        Sampling distribution of the rollouts (transformers' warpers, in `generate`'s order; `epsilon_cutoff`:
        epsilon sampling, the tokens below that probability left out, as MBR's candidates are drawn).
        Log-probabilities are taken at the same temperature.

    > Loss

    rl_weight (`float`, *optional*, defaults to `1.0`):
        The loss is `rl_weight * RL + (1 - rl_weight) * XE` (Paulus et al., 2017).
    entropy_coef (`float`, *optional*, defaults to `0.0`):
        Subtract `entropy_coef * mean token entropy` of the sampled sequences from the loss.
    kl_coef (`float`, *optional*, defaults to `0.0`):
        Add `kl_coef * KL(policy || reference)` on the sampled positions, the reference being a frozen copy of
        the initial model (built only when > 0). The reference pass runs in the policy pass's mode with the same
        random draws, so that at equal weights the KL is exactly 0 with or without dropout.

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

    > Length and decoding ahead

    max_new_tokens (`int`, *optional*, defaults to `None`):
        Length limit of the sequences the model writes during training; `None` takes `generation_max_length`, then
        the model's default.
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
    length_normalize (`bool`, *optional*, defaults to `False`):
        Score a sequence by the mean instead of the sum of its token log-probs (in the policy gradient; in MRT's `Q`).
    """

    reward_weights: list[float] | None = field(default=None, metadata={"help": "Weights of the reward_funcs."})
    nonfinite_rewards: str = field(default="error", metadata={"help": "'error' or 'drop' on NaN/inf rewards."})
    save_on_error: bool = field(default=True, metadata={
        "help": "Write a resumable checkpoint when a reward raises, before the error propagates."})
    ds3_gather_for_generation: bool = field(default=True, metadata={
        "help": "Gather a sharded (FSDP2, ZeRO-3) model once per rollout decode; False decodes per layer."})
    teacher_model_init_kwargs: dict | str | None = field(default=None, metadata={
        "help": "from_pretrained keyword arguments (JSON) when teacher_model is a Hub id or folder."})
    reward_workers: int = field(default=0, metadata={"help": "Processes scoring big reward batches (0 = in-process)."})
    num_samples: int = field(default=1, metadata={"help": "Sampled sequences per source."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0 = off)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling (1.0 = off)."})
    epsilon_cutoff: float = field(default=0.0, metadata={
        "help": "Epsilon sampling: leave out tokens below this probability (0.0 = off)."})
    rl_weight: float = field(default=1.0, metadata={"help": "loss = rl_weight*RL + (1-rl_weight)*XE."})
    entropy_coef: float = field(default=0.0, metadata={"help": "Entropy bonus coefficient."})
    kl_coef: float = field(default=0.0, metadata={"help": "KL(policy || initial model) coefficient."})
    log_completions: bool = field(default=False, metadata={"help": "Write, print and report the samples at each "
                                                                    "log (output_dir/completions/step-N.jsonl)."})
    num_completions_to_print: int | None = field(default=None, metadata={"help": "Sample rows printed at each log "
                                                                                  "(None: all)."})
    max_new_tokens: int | None = max_new_tokens_field()
    steps_per_generation: int | None = field(default=None, metadata={"help": "Micro-batches decoded together (must "
                                                                              "divide gradient_accumulation_steps)."})
    generation_batch_size: int | None = field(default=None, metadata={"help": "Sources decoded together over all "
                                                                               "processes (or steps_per_generation)."})
    length_normalize: bool = field(default=False, metadata={"help": "Mean instead of sum of token log-probs."})

    FIELD_RANGES = {"reward_workers": Range(0), "num_samples": Range(1), "temperature": Range(0, low_open=True),
                    "top_k": Range(0), "top_p": Range(0, 1, low_open=True), "rl_weight": Range(0, 1),
                    "epsilon_cutoff": Range(0, 1, high_open=True),
                    "entropy_coef": Range(0), "kl_coef": Range(0), "num_completions_to_print": Range(0),
                    "steps_per_generation": Range(1), "generation_batch_size": Range(1), **MAX_NEW_TOKENS_RANGE}

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        if self.reward_weights is not None:
            if not self.reward_weights or any(not math.isfinite(float(w)) for w in self.reward_weights):
                raise ValueError(
                    f"{name}.reward_weights={self.reward_weights!r}: give one finite number per reward of "
                    "reward_funcs, or None for equal weights.")
            self.reward_weights = [float(w) for w in self.reward_weights]
        parse_init_kwargs(self, "teacher_model_init_kwargs")
        check_choice(self, "nonfinite_rewards", ("error", "drop"))
        self._generation_steps = self.resolve_generation_steps()
        if self.log_completions and self.logging_strategy == "no":
            raise ValueError(
                f"{name}.log_completions=True writes the samples at each training log, but logging_strategy='no' "
                "never logs: set logging_strategy='steps' (every logging_steps) or log_completions=False.")

    @property
    def generation_steps(self) -> int:
        """Returns the micro-batches one rollout decode serves: `steps_per_generation`, or what
        `generation_batch_size` means on this run's processes, else 1 (the fields keep what the user set)."""
        return self._generation_steps

    def resolve_generation_steps(self) -> int:
        """Returns `generation_steps` from `steps_per_generation` or `generation_batch_size`, checking that they agree
        with each other and with the batch and accumulation sizes."""
        name = type(self).__name__
        if self.steps_per_generation is None and self.generation_batch_size is None:
            return 1
        per_step = self.per_device_train_batch_size * self.world_size
        if self.generation_batch_size is not None:
            if self.generation_batch_size % per_step:  # >= 1: its FIELD_RANGES
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
        if self.gradient_accumulation_steps % steps:  # steps >= 1: steps_per_generation's FIELD_RANGES
            raise ValueError(
                f"{name}.steps_per_generation={steps} must divide gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps}: one decode serves micro-batches of one optimizer step (for "
                "rollouts that serve several optimizer steps, use num_iterations).")
        return steps


@dataclass
class BaselineConfig(RolloutConfig):
    r"""
    Baselines and advantages of the policy-gradient trainers (SCST, REINFORCE, MIXER), on top of [`RolloutConfig`].

    baseline (`str`, *optional*, defaults to `None`):
        `"greedy"` (self-critical: the reward of the greedy decode), `"mean"` (leave-one-out mean of the other
        samples of the same source; needs `num_samples >= 2`), `"moving_average"` (exponential moving average
        of past batch rewards) or `"none"`. `None` takes the trainer's default: `"greedy"` for
        `SCSTTrainer`, `"moving_average"` for `ReinforceTrainer` and `MixerTrainer`.
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
    multi_objective_aggregation (`str`, *optional*, defaults to `"sum_then_normalize"`):
        How several `reward_funcs` make one advantage (TRL's name). `"sum_then_normalize"`: the weighted sum of the
        rewards is the reward, its advantage then centered / scaled as set above. `"normalize_then_sum"` (GDPO):
        each reward's advantage (its values minus the same baseline of its own values) is divided by its standard
        deviation over the source's samples before the weighted sum, so that a lexical and a neural reward weigh
        what their weights say whatever their scales (a single reward is normalized alike). Needs `num_samples >= 2`
        and a per-source baseline (`"greedy"`, `"mean"` or `"none"`).
    mask_truncated_completions (`bool`, *optional*, defaults to `False`):
        Leave the samples cut at the length limit (the model chose no EOS before it; an EOS the model's
        `forced_eos_token_id` forces at the limit counts as a cut) out of the loss and its normalisation, entropy bonus
        and KL term included (TRL's name): their reward judges an unfinished output. They still count in
        `rl/frac_truncated`, and they leave their siblings' leave-one-out baselines as samples without a reward do.
    token_reward_to_go (`bool`, *optional*, defaults to `False`):
        What a token-level reward (docs/rewards.md, "Token-level rewards") adds to each token's advantage: its own
        value (`False`: credit where the reward points), or the sum of the values from it to the end of the sample
        (`True`: the unbiased estimate of the gradient of the expected total, since a token moves the ones after it).
        The sentence part's advantage, over the baseline, is on every token either way. `DistillationTrainer`'s
        sampled estimator reads it too.
    """

    baseline: str | None = field(
        default=None, metadata={"help": "greedy | mean | moving_average | none (default: the trainer's)."}
    )
    baseline_ema_decay: float = field(default=0.9, metadata={"help": "Decay of the moving-average baseline."})
    center_advantages: bool = field(default=False, metadata={"help": "Subtract the batch mean of the advantages."})
    scale_rewards: str = field(default="none", metadata={"help": "none | group | batch: divide the advantages by "
                                                                  "their std over the source or the batch."})
    multi_objective_aggregation: str = field(default="sum_then_normalize", metadata={
        "help": "sum_then_normalize | normalize_then_sum (each reward's advantages normalized, then weighted)."})
    mask_truncated_completions: bool = field(default=False, metadata={
        "help": "Leave samples cut at the length limit (no EOS) out of the loss."})
    token_reward_to_go: bool = field(default=False, metadata={
        "help": "Per-token values (token-level rewards, distillation's log-ratios) summed to the end of the sample."})

    FIELD_RANGES = {"baseline_ema_decay": Range(0, 1, high_open=True)}

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        self.scale_rewards = str(self.scale_rewards).lower()
        if self.scale_rewards in ("true", "false"):
            self.scale_rewards = "batch" if self.scale_rewards == "true" else "none"
        check_choice(self, "scale_rewards", SCALE_REWARDS)
        if self.scale_rewards == "group" and self.num_samples < 2:
            raise ValueError(
                f"{name}.scale_rewards='group' divides by the std of each source's samples, which needs "
                f"num_samples >= 2 (got {self.num_samples}): raise num_samples or use scale_rewards='batch'.")
        if self.baseline is not None:
            check_choice(self, "baseline", BASELINES)
        if self.baseline == "mean" and self.num_samples < 2:
            raise ValueError(
                f"{name}.baseline='mean' (leave-one-out) needs at least two samples per source: set "
                f"num_samples >= 2 (got {self.num_samples}), or use baseline='greedy'.")
        check_choice(self, "multi_objective_aggregation", AGGREGATIONS)
        check_aggregation(self, self.baseline)

    def advantage_settings(self, baseline: str) -> AdvantageSettings:
        """Returns what `hf_seqrl.functional.advantages.sample_advantages` reads of this config, with `baseline` (the
        trainer's when the config leaves it to the trainer)."""
        return AdvantageSettings(baseline, self.center_advantages, self.scale_rewards,
                                 self.multi_objective_aggregation, self.mask_truncated_completions)


def check_aggregation(config: BaselineConfig, baseline: str | None) -> None:
    """Raises a ValueError naming `config`'s class unless its `multi_objective_aggregation` applies with `baseline`
    (the config's, or the trainer's default when the config leaves it to the trainer): `"normalize_then_sum"` needs
    `num_samples >= 2` and a per-source baseline."""
    if config.multi_objective_aggregation == "normalize_then_sum" and (
            config.num_samples < 2 or baseline == "moving_average"):
        whose = "" if config.baseline is not None or baseline is None else " (the trainer's default: set baseline=)"
        raise ValueError(
            f"{type(config).__name__}.multi_objective_aggregation='normalize_then_sum' divides each reward's "
            f"advantages by their std over a source's samples: it needs num_samples >= 2 (got {config.num_samples}) "
            f"and a per-source baseline ('greedy', 'mean' or 'none'), and the baseline is {baseline!r}{whose}.")
