"""`SeqRLTrainer`: teacher-forced warm-up, then sequence-level policy-gradient training.

One RL step follows the diagram of DESIGN.md: rollout → rewards → baseline → advantages → log-probs →
policy-gradient loss mixed with cross-entropy (+ KL, − entropy). The math lives in `hf_seqrl.losses`,
decoding and scoring in `hf_seqrl.rollout`; this class orchestrates and logs.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections import defaultdict

import torch
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging

from .. import losses
from ..configs import SeqRLConfig
from ..data import TEXT_COLUMNS, SeqRLDataCollator, check_rows
from ..families import family_for
from ..hub import CARD_SETTINGS, describe_algorithm, final_eval_metrics, training_curve, write_model_card
from ..rewards import (build_reward, call_reward, check_finite, check_reward_spec, normalize_references,
                       reward_name)
from ..rollout import ended_with_eos, eos_ids
from .inputs import BatchText, check_dataset_columns, check_model_family, load_tokenizer_for, repeat_rows
from .reuse import RolloutBatch, RolloutReuse

STATE_FILE = "seqrl_state.json"
logger = logging.get_logger(__name__)


def last_complete_checkpoint(folder: str) -> str | None:
    """Returns the newest `checkpoint-N` in `folder` whose writing finished, or None.

    A checkpoint counts once `seqrl_state.json` exists: hf-seqrl writes it atomically after everything else,
    so a process killed mid-save leaves a folder that is skipped here.
    """
    if not os.path.isdir(folder):
        return None
    steps = []
    for name in os.listdir(folder):
        match = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", name)
        if match and os.path.isfile(os.path.join(folder, name, STATE_FILE)):
            steps.append((int(match.group(1)), name))
    return os.path.join(folder, max(steps)[1]) if steps else None


class SeqRLBaseTrainer(Seq2SeqTrainer):
    """Orchestration shared by every hf-seqrl trainer.

    Checks the model and data, keeps the `references` / `sources` text columns through collation, runs the
    teacher-forced warm-up (`args.warmup_xe_steps`) with the plain `Seq2SeqTrainer` loss, records metrics and
    logs their means averaged over processes, saves the trainer's own state with checkpoints, and writes a
    model card on save. Subclasses implement `sequence_loss` and set `config_class` / `algorithm`.
    """

    config_class: type = Seq2SeqTrainingArguments
    algorithm = "Cross-entropy"
    # The `hf_seqrl.families` a trainer takes: a trainer opts in to decoder-only models once every pass of its loss
    # goes through `self.family`.
    model_families: tuple[str, ...] = ("seq2seq",)

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, **kwargs):
        if args is None:
            args = self.config_class(output_dir="tmp_trainer")
        if not isinstance(args, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs args={self.config_class.__name__}(...), got {type(args).__name__}: "
                f"{self.config_class.__name__} accepts every Seq2SeqTrainingArguments field plus its own."
            )
        family = family_for(model)
        check_model_family(family, self.model_families, type(self).__name__)
        if processing_class is None:
            processing_class = load_tokenizer_for(model)
        if train_dataset is not None:
            check_dataset_columns(train_dataset, "train_dataset", family)
            check_rows(train_dataset, "train_dataset")
        eval_splits = eval_dataset.items() if isinstance(eval_dataset, dict) else [("eval_dataset", eval_dataset)]
        for split, data in eval_splits:
            if data is not None:
                check_rows(data, split)
        if data_collator is None:
            data_collator = DataCollatorForSeq2Seq(processing_class, model=model)
        if not isinstance(data_collator, SeqRLDataCollator):
            data_collator = SeqRLDataCollator(data_collator)
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, **kwargs)
        super()._set_signature_columns_if_needed()
        if data_collator.model_input_names is None:
            # Every column the model does not take reaches the rewards (as TRL passes a dataset's extra columns).
            data_collator.model_input_names = set(self._signature_columns) - set(TEXT_COLUMNS)
        self._model_input_names = set(data_collator.model_input_names)
        self.family = family
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        for callback in self.callback_handler.callbacks:
            self._bind(callback)

    def _bind(self, callback):
        if not isinstance(callback, type) and hasattr(callback, "bind_trainer"):  # DiagnosticsCallback
            callback.bind_trainer(self)

    def add_callback(self, callback):
        super().add_callback(callback)
        self._bind(callback)

    def _remove_unused_columns(self, dataset, description=None):
        # The collator keeps the columns the model does not take out of its inputs and hands them to the rewards.
        return dataset

    def _get_collator_with_removed_columns(self, data_collator, description=None):
        return data_collator

    @property
    def phase(self) -> str:
        """`"xe"` during the teacher-forced warm-up, then `"rl"`."""
        return "xe" if self.state.global_step < self.args.warmup_xe_steps else "rl"

    # ---- the loss -------------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        text = self.pop_text_columns(inputs)
        if self.phase == "xe" or not model.training or return_outputs:
            # Plain Seq2SeqTrainer loss: warm-up steps and evaluation.
            if model.training:
                self._record("train", {"rl/phase": 0.0})
            return self.per_batch_mean_loss(model, inputs, return_outputs)
        return self.sequence_loss(model, inputs, text, num_items_in_batch)

    def per_batch_mean_loss(self, model, inputs, return_outputs=False):
        """Returns `Seq2SeqTrainer`'s loss of `inputs`: the mean over this batch's target tokens.

        T5, BART and Marian take `**kwargs` yet ignore `num_items_in_batch`; given the count, the Trainer would
        treat their mean as normalized over all accumulated batches and processes (no division by the steps, a
        product with the processes). Without it, the mean is divided by the steps, like the policy-gradient loss.
        """
        self.loss_is_scaled_for_ga = False
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch=None)

    def _xe_from_logits(self, logits, labels, logprobs=None):
        """Returns the Trainer's cross-entropy (label smoothing included) of `logits` `(N, T, V)` aligned with
        `labels` `(N, T)`: the mean over the positions that are not -100. `logprobs` `(N, T)`, the labels' log-probs
        at temperature 1 where a pass computed them already, gives it without another pass over the logits
        (unless label smoothing, which needs the logits, applies)."""
        if self.label_smoother is not None:
            return self.label_smoother({"logits": logits}, labels)
        if logprobs is not None:
            return losses.cross_entropy_from_logprobs(logprobs, labels)
        return losses.cross_entropy(logits, labels)

    def sequence_loss(self, model, inputs, text: BatchText, num_items_in_batch):
        """Returns the loss of a training step after the warm-up (implemented by subclasses)."""
        raise NotImplementedError

    def pop_text_columns(self, inputs) -> BatchText:
        """Returns the batch's `references`, `sources` and other non-model columns, removed from `inputs`."""
        references = inputs.pop("references", None)
        sources = inputs.pop("sources", None)
        if references is not None:
            references = normalize_references(references)
        columns = {key: inputs.pop(key) for key in list(inputs) if key not in self._model_input_names}
        return BatchText(references, sources, columns)

    # ---- evaluation ----------------------------------------------------------------------------

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        text = self.pop_text_columns(inputs)
        loss, generated, labels = self.family.prediction_step(self, super().prediction_step, model, inputs,
                                                              prediction_loss_only, ignore_keys, **gen_kwargs)
        if self.args.predict_with_generate and not prediction_loss_only and generated is not None:
            self.on_generated(generated, inputs, text)
        return loss, generated, labels

    def on_generated(self, generated, inputs, text: BatchText) -> None:
        """Called with the generated ids of each evaluation batch (a hook for extra metrics)."""

    # ---- metrics --------------------------------------------------------------------------------

    def _record(self, mode: str, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._metrics[mode][key].append(float(value))

    def log(self, logs, start_time=None):
        """Adds the means of the recorded `rl/*` metrics (averaged over processes) to `logs`."""
        prefix = next((k[: -len("_runtime")] for k in logs if k.endswith("_runtime") and not k.startswith("train")),
                      None)
        mode = "eval" if prefix is not None else "train"
        buffer = self._metrics[mode]
        if buffer:
            keys = sorted(buffer)
            sums = torch.tensor([[math.fsum(buffer[k]), len(buffer[k])] for k in keys], dtype=torch.float64,
                                device=self.args.device)
            if self.accelerator.num_processes > 1:
                sums = self.accelerator.reduce(sums, reduction="sum")
            for key, (total, count) in zip(keys, sums.tolist()):
                name = f"{prefix}_{key}" if mode == "eval" else key
                logs[name] = total / max(count, 1.0)
            buffer.clear()
        super().log(logs, start_time)

    # ---- model card: written on save, pushed by push_to_hub ----------------------------------------

    def model_card_info(self, model_name=None, dataset=None, finetuned_from=None, tasks=None) -> dict:
        """Returns the fields of `hf_seqrl.hub.render_model_card` for this run."""
        model = self.accelerator.unwrap_model(self.model)
        args = self.args
        task = tasks[0] if isinstance(tasks, (list, tuple)) and tasks else tasks
        settings = {k: getattr(args, k) for k in CARD_SETTINGS if hasattr(args, k)}
        if hasattr(self, "baseline"):
            settings["baseline"] = self.baseline
        return dict(
            model_name=model_name or os.path.basename(os.path.normpath(args.output_dir)),
            algorithm=self.algorithm,
            task=task or getattr(self, "card_task", "translation"),
            base_model=finetuned_from or getattr(model.config, "_name_or_path", None),
            datasets=[dataset] if isinstance(dataset, str) else list(dataset or []),
            reward=getattr(self, "reward_label", "none (cross-entropy)"),
            baseline=str(settings.get("baseline")),
            settings=settings,
            metrics=final_eval_metrics(self.state.log_history),
            curve=training_curve(self.state.log_history),
            repo_id=args.hub_model_id,
            model_class=self.family.auto_class,
        )

    def create_model_card(self, language=None, license=None, tags=None, model_name=None, finetuned_from=None,
                          tasks=None, dataset_tags=None, dataset=None, dataset_args=None):
        """Writes hf-seqrl's model card to `output_dir/README.md` (used by `push_to_hub`)."""
        if not self.is_world_process_zero():
            return
        write_model_card(self.args.output_dir, license=license,
                         **self.model_card_info(model_name, dataset or dataset_tags, finetuned_from, tasks))

    def save_model(self, output_dir=None, _internal_call=False):
        super().save_model(output_dir, _internal_call)
        if not _internal_call and self.is_world_process_zero():
            info = self.model_card_info()
            write_model_card(output_dir or self.args.output_dir, **info)

    # ---- checkpoints: the trainer's own state ----------------------------------------------------

    def extra_state(self) -> dict:
        """Returns what this trainer adds to the Trainer state (saved with every checkpoint)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        """Restores `extra_state()` from a checkpoint."""

    def save_extra_files(self, folder: str) -> None:
        """Writes what this trainer trains besides the model (e.g. a discriminator) into a checkpoint folder."""

    def load_extra_files(self, folder: str) -> None:
        """Restores `save_extra_files` from a checkpoint folder."""

    @property
    def algorithm_name(self) -> str:
        """Returns the name of the algorithm that runs: its loss and baseline (leave-one-out is not SCST)."""
        return describe_algorithm(self.algorithm, getattr(self, "baseline", None))["name"]
    def save_process_state(self, folder: str) -> None:
        """Saves what each process keeps apart from the others (called on every process, before the state file)."""

    def load_process_state(self, folder: str) -> None:
        """Restores `save_process_state` from a checkpoint folder (called on every process)."""

    def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
        """`Trainer.train`; `resume_from_checkpoint=True` picks the newest *complete* checkpoint."""
        logger.setLevel(self.args.get_process_log_level())  # hf-seqrl's messages follow `log_level` as transformers' do
        if self.is_world_process_zero():
            logger.info(f"{type(self).__name__}: {self.algorithm_name}"
                        + (f", reward {self.reward_label}" if hasattr(self, "reward_label") else ""))
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"resume_from_checkpoint=True but {self.args.output_dir} holds no complete checkpoint "
                    f"(a checkpoint-N folder with {STATE_FILE}); pass a checkpoint path or start without resuming."
                )
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self.save_process_state(folder)
        if self.args.should_save:
            if os.path.isdir(folder):
                self.save_extra_files(folder)
                # Written last and atomically: its presence marks the checkpoint as complete.
                tmp = os.path.join(folder, STATE_FILE + ".tmp")
                with open(tmp, "w") as f:
                    json.dump(self.extra_state(), f)
                os.replace(tmp, os.path.join(folder, STATE_FILE))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.load_extra_files(resume_from_checkpoint)
        self.load_process_state(resume_from_checkpoint)
        path = os.path.join(resume_from_checkpoint, STATE_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                self.load_extra_state(json.load(f))


class SeqRLTrainer(SeqRLBaseTrainer):
    """Base of the sequence-level trainers; same constructor as `Seq2SeqTrainer`, `args` a `SeqRLConfig`."""

    default_baseline = "greedy"
    algorithm = "Sequence-level RL"

    config_class = SeqRLConfig

    def __init__(self, model=None, args: SeqRLConfig | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_funcs=None, **kwargs):
        if reward_funcs is None:
            raise ValueError(
                f"{type(self).__name__} needs reward_funcs=: a built-in name ('bleu', 'chrf', 'rouge1', 'rouge2', "
                "'rougeL', 'rougeLsum'), a 'module:function' path, a callable f(predictions, references, sources, "
                "**columns) -> list[float], an evaluate.EvaluationModule, or a list of these.")
        # Checked before the (slow) Trainer set-up, so that a typo fails at once.
        check_reward_spec(reward_funcs, args.reward_weights if isinstance(args, SeqRLConfig) else None)
        RolloutReuse.check_dataset(train_dataset, getattr(args, "num_iterations", 1))
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, **kwargs)
        self.baseline = self.args.baseline or self.default_baseline
        self.reward_funcs = reward_funcs
        self.reward_fn = build_reward(reward_funcs, self.args.reward_weights, self.args.reward_workers)
        self.reward_label = reward_name(self.reward_fn)
        self.baseline_ema: float | None = None
        self.ref_model = self._build_ref_model() if self.args.kl_coef > 0 else None
        self._rollout_config = None
        self.reuse = RolloutReuse(self.args.num_iterations) if self.args.num_iterations > 1 else None

    # ---- set-up helpers -------------------------------------------------------------------------

    def _build_ref_model(self):
        ref = copy.deepcopy(self.accelerator.unwrap_model(self.model)).to(self.args.device)
        ref.eval()
        ref.requires_grad_(False)
        return ref

    @property
    def rollout_config(self):
        if self._rollout_config is None:
            model = self.accelerator.unwrap_model(self.model)
            self._rollout_config = self.family.generation_config(
                model, self.args.max_new_tokens, self.args.temperature, self.args.top_k, self.args.top_p,
                max_length=self.args.generation_max_length,
            )
        return self._rollout_config

    def _get_train_sampler(self, train_dataset=None):
        if self.reuse is None:
            return super()._get_train_sampler(train_dataset)
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return self.reuse.sampler(dataset, self.args, lambda: self.state.global_step)

    # ---- the loss -------------------------------------------------------------------------------

    def sequence_loss(self, model, inputs, text: BatchText, num_items_in_batch):
        args = self.args
        if args.rl_weight == 0 and args.kl_coef == 0 and args.entropy_coef == 0:
            # Nothing a rollout produces would reach the loss: skip decoding and train as Seq2SeqTrainer does.
            self._record("train", {"rl/phase": 1.0})
            return self.per_batch_mean_loss(model, inputs)
        self.loss_is_scaled_for_ga = False  # per-batch mean: the Trainer divides by accumulation steps
        if args.rl_weight < 1 and inputs.get("labels") is None:
            raise ValueError(
                f"SeqRLConfig.rl_weight={args.rl_weight} mixes in cross-entropy, which needs tokenized 'labels' in the "
                "dataset: add them (tokenizer(text_target=...)) or set rl_weight=1.0 for pure RL on 'references'."
            )
        if text.references is None:
            text = text._replace(references=self._decode_labels(inputs.get("labels")))
        return self.rl_loss(model, inputs, text)

    def rl_loss(self, model, inputs, text: BatchText):
        """Returns the RL loss of a batch and records the `rl/*` metrics."""
        args, n = self.args, self.args.num_samples
        unwrapped = self.accelerator.unwrap_model(model)
        step, batch, slot = self.state.global_step, None, None
        if self.reuse is not None:
            batch, slot = self.reuse.take(step, inputs["input_ids"])
        if batch is None:
            batch = self.roll_out(unwrapped, inputs, text)
        labels = inputs.get("labels") if args.rl_weight < 1 else None
        scored = self.family.score(model, inputs, batch.sample_ids, n, labels, args.temperature)
        mask, adv, metrics = batch.sample_mask, batch.advantages, dict(batch.metrics)
        if self.reuse is None:
            pg_loss = losses.policy_gradient_loss(scored.token_logprobs, mask, adv, args.length_normalize,
                                                  args.loss_normalization)
        else:
            if batch.old_token_logprobs is None:
                # The rollout's first forward gives p_old: this step's ratios are 1, the cycle's later ones are not.
                batch.old_token_logprobs = scored.token_logprobs.detach()
                self.reuse.keep(step, slot, inputs["input_ids"], batch)
            clip = (batch.old_token_logprobs, mask, adv, args.epsilon, args.epsilon_high)
            pg_loss = losses.clipped_policy_loss(scored.token_logprobs, *clip, args.length_normalize,
                                                 args.loss_normalization)
            clip_fraction, ratio_mean = losses.clip_statistics(scored.token_logprobs, *clip)
            metrics.update({"rl/clip_fraction": clip_fraction.item(), "rl/ratio_mean": ratio_mean.item()})
        xe_loss = None if labels is None else self._xe_from_logits(scored.gold_logits, labels, scored.gold_logprobs)
        loss = losses.mix_losses(pg_loss, xe_loss, args.rl_weight)
        loss = self.add_regularizers(loss, inputs, batch.sample_ids, n, scored.sample_logits, mask, metrics)
        metrics["rl/pg_loss"] = pg_loss.item()
        if xe_loss is not None:
            metrics["rl/xe_loss"] = xe_loss.item()
        self._record("train", metrics)
        return loss

    def roll_out(self, unwrapped, inputs, text: BatchText) -> RolloutBatch:
        """Returns the samples of a batch, their advantages and what the rollout measured (no grad)."""
        n = self.args.num_samples
        rollout = self.family.sample(unwrapped, inputs, self.rollout_config, n, with_greedy=self.baseline == "greedy")
        return self.rollout_batch(rollout, text, unwrapped)

    def rollout_batch(self, rollout, text: BatchText, unwrapped) -> RolloutBatch:
        """Returns the rewards, baseline and advantages of `rollout`'s samples and what they measure (no grad)."""
        args, n = self.args, rollout.num_samples
        sample_rewards, bad = self.score(rollout.sample_ids, repeat_rows(text, n))
        baseline_rewards, bad = self.baseline_rewards(sample_rewards, bad, rollout, text)
        adv = losses.advantages(sample_rewards, baseline_rewards).masked_fill(bad, 0.0)
        if args.center_advantages:
            adv = losses.center_advantages(adv, ~bad)
        if args.scale_rewards:
            adv = losses.scale_advantages(adv)
        metrics = self.sample_metrics(sample_rewards, bad, rollout.sample_ids, rollout.sample_mask, unwrapped)
        metrics.update({
            "rl/baseline_reward": baseline_rewards.mean().item(),
            "rl/advantage_abs": adv.abs().mean().item(),
            "rl/advantage_mean": adv.mean().item(),
            "rl/frac_zero_advantage": (adv.abs() < 1e-8).float().mean().item(),
        })
        return RolloutBatch(rollout.sample_ids, rollout.sample_mask, adv, metrics)

    def sample_metrics(self, sample_rewards, bad, sample_ids, sample_mask, unwrapped) -> dict[str, float]:
        """Returns the `rl/*` metrics of the sampled sequences: reward, length, degenerate shares."""
        metrics = {
            "rl/phase": 1.0,
            "rl/reward": sample_rewards.mean().item(),
            "rl/reward_std": sample_rewards.std().item() if sample_rewards.numel() > 1 else 0.0,
            "rl/sample_length": sample_mask.sum(dim=1).float().mean().item(),
            # Degenerate rollouts are logged, not fatal: samples that are only EOS, or hit the length limit.
            "rl/frac_empty": (sample_mask.sum(dim=1) <= 1).float().mean().item(),
            "rl/frac_truncated": (~ended_with_eos(sample_ids, sample_mask, eos_ids(unwrapped))).float().mean().item(),
        }
        if self.args.nonfinite_rewards == "drop":
            metrics["rl/nonfinite_rewards"] = float(bad.sum().item())
        return metrics

    def add_regularizers(self, loss, inputs, token_ids, group: int, logits, token_mask, metrics: dict):
        """Returns `loss - entropy_coef * entropy (+ kl_coef * KL)` over the counted tokens; records both."""
        args = self.args
        with torch.set_grad_enabled(args.entropy_coef > 0):
            entropy = losses.masked_mean(losses.token_entropy(logits).flatten(), token_mask.flatten(), 0)
        if args.entropy_coef > 0:
            loss = loss - args.entropy_coef * entropy
        if self.ref_model is not None:
            kl = self._kl(inputs, token_ids, group, logits, token_mask)
            loss = loss + args.kl_coef * kl
            metrics["rl/kl"] = kl.item()
        metrics["rl/entropy"] = entropy.item()
        return loss

    def score(self, token_ids, text: BatchText):
        """Returns `(rewards, nonfinite)`: rewards of decoded `token_ids` (float tensor `(N,)`) and a bool mask.

        `text` holds one row per sequence of `token_ids` (see `repeat_rows`).
        """
        predictions = self.processing_class.batch_decode(token_ids, skip_special_tokens=True)
        values = call_reward(self.reward_fn, predictions, text.references, text.sources, text.columns,
                             name=self.reward_label, batch_index=self.state.global_step)
        if self.args.nonfinite_rewards == "error":
            check_finite(values, self.reward_label)
        rewards = torch.tensor(values, dtype=torch.float32, device=token_ids.device)
        bad = ~torch.isfinite(rewards)
        return rewards.masked_fill(bad, 0.0), bad

    def baseline_rewards(self, sample_rewards, bad, rollout, text: BatchText):
        """Returns `(baseline (B*n,), nonfinite mask (B*n,))` for the configured baseline."""
        n = rollout.num_samples
        if self.baseline == "greedy":
            greedy, greedy_bad = self.score(rollout.greedy_ids, text)
            return greedy.repeat_interleave(n), bad | greedy_bad.repeat_interleave(n)
        if self.baseline == "mean":
            return losses.leave_one_out_baseline(sample_rewards, n), bad
        if self.baseline == "moving_average":
            good = sample_rewards[~bad]
            batch_mean = good.mean().item() if good.numel() else (self.baseline_ema or 0.0)
            current = self.baseline_ema if self.baseline_ema is not None else batch_mean
            self.baseline_ema = losses.moving_average(self.baseline_ema, batch_mean, self.args.baseline_ema_decay)
            return torch.full_like(sample_rewards, current), bad
        return torch.zeros_like(sample_rewards), bad

    def _kl(self, inputs, token_ids, group: int, logits, token_mask):
        """Returns the mean per-token KL(policy || frozen reference) over the counted positions of `token_ids`."""
        # The frozen copy was never prepared by Accelerate, so its forward is not autocast as the policy's is.
        with torch.no_grad(), self.accelerator.autocast():
            ref = self.family.score(self.ref_model, inputs, token_ids, group, temperature=self.args.temperature)
        kl = losses.token_kl(logits, ref.sample_logits)
        return losses.masked_mean(kl.flatten(), token_mask.flatten(), 0)

    def _decode_labels(self, labels):
        if labels is None:
            raise ValueError(
                "The batch has neither 'references' nor 'labels': rewards need references. Add a 'references' "
                "column (string or list of strings per row) or tokenized 'labels'."
            )
        ids = labels.masked_fill(labels == -100, self.processing_class.pad_token_id)
        texts = self.processing_class.batch_decode(ids, skip_special_tokens=True)
        for i, text in enumerate(texts):
            if not text.strip():
                raise ValueError(
                    f"Row {i} of the batch has no reference: its labels are all -100/padding. Fix or drop that row."
                )
        return [[t] for t in texts]

    # ---- evaluation: greedy/beam reward next to the usual metrics ---------------------------------

    def on_generated(self, generated, inputs, text: BatchText) -> None:
        """Records `rl/reward` of the evaluation outputs (greedy or beam, as configured for generation)."""
        if text.references is None and inputs.get("labels") is not None:
            text = text._replace(references=self._decode_labels(inputs["labels"]))
        if text.references is not None:
            ids = generated.masked_fill(generated < 0, self.processing_class.pad_token_id)
            rewards, _ = self.score(ids, text)
            # One entry per example, so the logged mean weighs every example alike whatever the batch sizes.
            self._metrics["eval"]["rl/reward"].extend(rewards.tolist())

    # ---- checkpoints ------------------------------------------------------------------------------

    def extra_state(self) -> dict:
        return {"baseline_ema": self.baseline_ema, "baseline": self.baseline}

    def load_extra_state(self, state: dict) -> None:
        self.baseline_ema = state.get("baseline_ema")

    def save_process_state(self, folder: str) -> None:
        if self.reuse is not None:
            self.reuse.save(folder, self.args.process_index)
            self.accelerator.wait_for_everyone()  # every rollout file is on disk before the state file marks completion

    def load_process_state(self, folder: str) -> None:
        if self.reuse is not None:
            self.reuse.load(folder, self.args.process_index, self.args.device)
