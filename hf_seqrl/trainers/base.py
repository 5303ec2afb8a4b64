"""`SeqRLBaseTrainer`: the orchestration every hf-seqrl trainer shares.

Model and data checks, the collator that keeps the text columns, the teacher-forced warm-up phase, evaluation with
generation for both model families, metrics averaged over processes, the model card and the trainer's own
checkpoint files. The losses live in the subclasses (`rollout` running an objective of `hf_seqrl.objectives`,
`input_schedules`, `scheduled_sampling`, `professor_forcing`), their math in `hf_seqrl.losses`.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict

import torch
from accelerate.utils import gather_object
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging

from .. import losses
from ..data import TEXT_COLUMNS, SeqRLDataCollator, normalize_references
from ..evaluation import write_run_settings
from ..hub import card_example, card_settings, final_eval_metrics, training_curve, write_model_card
from ..models import family_for
from ..models.base import disable_dropout
from ..models.scoring import label_logprobs
from ..models.languages import align_target_language
from ..models.sharding import decode_per_layer, decoding_whole, register_zero3, whole_for_decode
from ..types import BatchText
from .services.adapters import card_fields, save_base_beside, with_adapter
from .services.checkpoints import (STATE_FILE, TRAINED_BY, check_processes_agree, checkpoint_step, last_complete_checkpoint,
                          read_state, training_changes, write_state)
from .services.eval_selection import EvaluationSelection
from .services.inputs import (check_model_family, check_token_ids, check_tokenizer, forward_arguments, load_model,
                     load_tokenizer_for, prepare_datasets, tokenizer_outputs, warn_half_precision_weights)
from .services.log_window import window_rows, window_values
from .services.run_record import (CROSS_ENTROPY, CROSS_ENTROPY_ID, changed_training_warning, cross_entropy_reason,
                         cross_entropy_warning, trainer_identity, training_record)

logger = logging.get_logger(__name__)


class SeqRLBaseTrainer(Seq2SeqTrainer):
    """Orchestration shared by every hf-seqrl trainer.

    Checks the model and data, keeps the `references` / `sources` text columns through collation, runs the
    teacher-forced warm-up (`args.warmup_xe_steps`) with the plain `Seq2SeqTrainer` loss, records metrics and
    logs their means averaged over processes, saves the trainer's own state with checkpoints, and writes a
    model card on save. Subclasses implement `sequence_loss` and set `config_class` and the trainer's identity:
    `algorithm_id`, its name for machines (`hf-seqrl train --algorithm`, results files), and `method`, what logs and
    cards say of it for people (`papers.Method`: name, tag, papers; a property where the settings decide it).
    """

    config_class: type = Seq2SeqTrainingArguments
    algorithm_id = CROSS_ENTROPY_ID
    method = CROSS_ENTROPY
    # The `hf_seqrl.models` families a trainer takes: a trainer opts in to decoder-only models once every pass of its
    # loss goes through `self.family`.
    model_families: tuple[str, ...] = ("seq2seq",)
    # What `disable_dropout=None` means for this trainer (`SeqRLBaseConfig.disable_dropout`).
    default_disable_dropout = False
    reward_label = "none (cross-entropy)"  # a rewarded trainer names its reward
    reads_targets: str | None = "trains on the gold targets by teacher forcing"  # None: sources may do (`references`)

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, peft_config=None, **kwargs):
        if args is None:
            args = self.config_class(output_dir="tmp_trainer")
        if not isinstance(args, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs args={self.config_class.__name__}(...), got {type(args).__name__}: "
                f"{self.config_class.__name__} accepts every Seq2SeqTrainingArguments field plus its own."
            )
        if "tokenizer" in kwargs:
            raise TypeError(f"{type(self).__name__} takes the tokenizer as processing_class=, as Seq2SeqTrainer does "
                            "since transformers 5 (tokenizer= was its earlier name).")
        model = with_adapter(load_model(model, args), peft_config)
        if self.default_disable_dropout if args.disable_dropout is None else args.disable_dropout:
            disable_dropout(model)
        family = family_for(model)
        check_model_family(family, self.model_families, type(self).__name__)
        if processing_class is None:
            processing_class = load_tokenizer_for(model)
        check_tokenizer(processing_class, family, model, type(self).__name__)
        check_token_ids(processing_class, model, type(self).__name__)
        align_target_language(model, processing_class, type(self).__name__)
        warn_half_precision_weights(model, args, type(self).__name__)
        train_dataset, eval_dataset = prepare_datasets(train_dataset, eval_dataset, family, processing_class, args,
                                                       family.label_start_id(model), model, self,
                                                       kwargs.get("compute_metrics"))
        if data_collator is None:
            data_collator = DataCollatorForSeq2Seq(processing_class, model=model)
        if not isinstance(data_collator, SeqRLDataCollator):
            data_collator = SeqRLDataCollator(data_collator)
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, **kwargs)
        if data_collator.model_input_names is None:
            # Every column the model does not take reaches the rewards (as TRL passes a dataset's extra columns).
            data_collator.model_input_names = forward_arguments(self.model, self.label_names) - set(TEXT_COLUMNS)
        data_collator.tokenizer_outputs |= tokenizer_outputs(processing_class) - data_collator.model_input_names
        self._model_input_names = set(data_collator.model_input_names)
        self.family = family
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.generation_kwargs: dict = {}  # what the running `evaluate` / `predict` generates with
        self.eval_selection = EvaluationSelection.of(args, args.device)  # MBR / QE evaluation decoding, or None
        # What shaped the text before this trainer saw it (a pipeline's source prefix or prompt template), saved with
        # the run's settings so that `hf-seqrl evaluate` reads the folder as the run did.
        self.run_settings: dict = {}
        for callback in self.callback_handler.callbacks:
            self._bind(callback)

    def _bind(self, callback):
        if not isinstance(callback, type) and hasattr(callback, "bind_trainer"):  # DiagnosticsCallback
            callback.bind_trainer(self)

    def add_callback(self, callback):
        super().add_callback(callback)
        self._bind(callback)

    def _remove_unused_columns(self, dataset, description=None):
        """Returns `dataset` as it is (the collator keeps the columns the model does not take out of its inputs and
        hands them to the rewards), or with `remove_unused_columns=True` without those columns, the model's inputs,
        labels and `references` / `sources` kept."""
        names = getattr(dataset, "column_names", None)
        if not self.args.remove_unused_columns or not names:
            return dataset
        keep = forward_arguments(self.model, self.label_names) | set(TEXT_COLUMNS)
        unused = [name for name in names if name not in keep]
        return dataset.remove_columns(unused) if unused else dataset

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

    def teacher_forced_cross_entropy(self, model, forward, labels, rows: slice | None = None):
        """Returns `(output, loss)`: the output of `forward()` (a teacher-forced pass scoring `labels` `(N', T)`) and
        the Trainer's cross-entropy at rows `rows`, label smoothing included (`models.scoring.label_logprobs`)."""
        output, logprobs, sums, vocab = label_logprobs(forward, self.accelerator.unwrap_model(model), labels, rows)
        return output, self.cross_entropy_of(logprobs, labels, logprobs, sums, vocab)

    def cross_entropy_of(self, logprobs, labels, raw_logprobs=None, raw_logprob_sums=None, vocab_size: int = 0):
        """Returns the Trainer's cross-entropy of `labels` `(N, T)` from a scoring pass's log-probs `(N, T)` of them:
        label smoothed (`label_smoothing_factor`) from its unbanned terms `raw_logprobs` / `raw_logprob_sums` over
        `vocab_size` tokens, as transformers' `LabelSmoother` computes it from the logits."""
        if self.label_smoother is not None:
            return losses.label_smoothed_cross_entropy(raw_logprobs, raw_logprob_sums, labels,
                                                       self.label_smoother.epsilon, vocab_size)
        return losses.cross_entropy_from_logprobs(logprobs, labels)

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

    @contextlib.contextmanager
    def decoding(self, unwrapped):
        """Within the context, decodes of the (unwrapped) model gather a sharded model once
        (`hf_seqrl.models.sharding`; per layer with `ds3_gather_for_generation=False`); yields whether the model is
        then whole (its decodes need no collective)."""
        if self.is_deepspeed_enabled:  # a ZeRO-3 engine's module hooks, for the gather-once decode
            register_zero3(unwrapped, self.model_wrapped)
        with decode_per_layer(not getattr(self.args, "ds3_gather_for_generation", True)):
            with whole_for_decode(unwrapped):
                yield decoding_whole()

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        generate = self.args.predict_with_generate and not prediction_loss_only
        if not generate:  # a batch of sources alone has no loss to compute (`trainers.services.references`)
            return self.gathered_prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs) \
                if inputs.get("labels") is not None else (None, None, None)
        with self.decoding(self.accelerator.unwrap_model(model)) as whole:
            if whole:  # each rank generates on its own: no rank waits for another's rows
                defaults = getattr(self, "_gen_kwargs", {}) if self.family.trainer_generates else self.generation_kwargs
                gen_kwargs = {**(gen_kwargs or defaults), "synced_gpus": False}
            return self.gathered_prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)

    def gathered_prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """`prediction_step`, the model as `decoding` leaves it."""
        text = self.pop_text_columns(inputs)
        generate = self.args.predict_with_generate and not prediction_loss_only
        if not generate or (self.family.trainer_generates and self.eval_selection is None):
            loss, generated, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys,
                                                              **gen_kwargs)
        else:
            loss, generated, labels = self.family_prediction_step(model, inputs, text, ignore_keys, **gen_kwargs)
        if generate and generated is not None:
            self.on_generated(generated, inputs, text)
        return loss, generated, labels

    def family_prediction_step(self, model, inputs, text: BatchText, ignore_keys=None, **gen_kwargs):
        """Returns `(loss, generated, labels)` of an evaluation batch whose family generates itself (a causal batch
        holds prompt + completion, which `Seq2SeqTrainer.prediction_step` would continue), or that decodes by MBR / QE
        (`eval_selection`): the teacher-forced loss, the family's `generate` output (or each source's pick) and the
        targets, both in target coordinates."""
        loss, _, _ = super().prediction_step(model, inputs, True, ignore_keys)
        inputs, unwrapped = self._prepare_inputs(inputs), self.accelerator.unwrap_model(model)
        gen_kwargs = {k: v for k, v in (gen_kwargs or self.generation_kwargs).items() if v is not None}
        with torch.no_grad():
            generated = self.family.generate(unwrapped, inputs, **gen_kwargs) if self.eval_selection is None else \
                self.eval_selection.predict(unwrapped, self.processing_class, inputs, text.sources, **gen_kwargs)
        labels = inputs.get("labels")
        return loss, generated, None if labels is None else self.family.target_labels(inputs)

    def on_generated(self, generated, inputs, text: BatchText) -> None:
        """Called with the generated ids of each evaluation batch (a hook for extra metrics)."""

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", **gen_kwargs):
        self.generation_kwargs = self.evaluation_generation_kwargs(gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix,
                                **gen_kwargs)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix="test", **gen_kwargs):
        self.generation_kwargs = self.evaluation_generation_kwargs(gen_kwargs)
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix,
                               **gen_kwargs)

    def evaluation_generation_kwargs(self, gen_kwargs: dict) -> dict:
        """Returns the generation arguments of an evaluation: `gen_kwargs`, with `generation_max_length` and
        `generation_num_beams` where they say nothing of length and beams (as `Seq2SeqTrainer.evaluate` fills them).
        An MBR / QE evaluation's first batch draws with its seed again (`eval_selection`)."""
        if self.eval_selection is not None:
            self.eval_selection.start()
        kwargs = dict(gen_kwargs)
        if kwargs.get("max_length") is None and kwargs.get("max_new_tokens") is None \
                and self.args.generation_max_length is not None:
            kwargs["max_length"] = self.args.generation_max_length
        if kwargs.get("num_beams") is None and self.args.generation_num_beams is not None:
            kwargs["num_beams"] = self.args.generation_num_beams
        return kwargs

    # ---- metrics --------------------------------------------------------------------------------

    def _record(self, mode: str, metrics: dict[str, float | list[float]]) -> None:
        """Keeps `metrics` for the next log of `mode` (`"train"` or `"eval"`), which averages each name's values; a
        list adds one value per entry."""
        for key, value in metrics.items():
            self._metrics[mode][key].extend(float(v) for v in (value if isinstance(value, list) else [value]))

    def log(self, logs, start_time=None):
        """Adds the recorded `rl/*` metrics of the window since the last log, over all processes, to `logs`
        (`window_values`: means, and the extremes of the names ending in `_min` / `_max`)."""
        prefix = next((k[: -len("_runtime")] for k in logs if k.endswith("_runtime") and not k.startswith("train")),
                      None)
        mode = "eval" if prefix is not None else "train"
        buffer = self._metrics[mode]
        keys = sorted(buffer)
        if self.accelerator.num_processes > 1:
            # Processes may have recorded different names (a metric only some of their batches produce): reduce over
            # the union, a name a process lacks counting no value there.
            keys = sorted(set().union(*gather_object([keys])))
        if keys:
            rows = torch.tensor(window_rows(buffer, keys), dtype=torch.float64, device=self.args.device)[None]
            if self.accelerator.num_processes > 1:
                rows = self.accelerator.gather(rows)
            for key, value in window_values(keys, rows.tolist()).items():
                logs[f"{prefix}_{key}" if mode == "eval" else key] = value
            buffer.clear()
        super().log(logs, start_time)

    # ---- model card: written on save, pushed by push_to_hub ----------------------------------------

    def model_card_info(self, model_name=None, dataset=None, finetuned_from=None, tasks=None) -> dict:
        """Returns the fields of `hf_seqrl.hub.render_model_card` for this run: the task `tasks` or `args.task` names
        (none claimed without), the rewards as `reward_funcs` names them, where the model came from, and the first
        evaluation source as the example its code generates from."""
        model = self.accelerator.unwrap_model(self.model)
        args = self.args
        task = tasks[0] if isinstance(tasks, (list, tuple)) and tasks else tasks
        info = card_fields(model)
        if finetuned_from:
            info["base_model"] = finetuned_from
        reason = self.cross_entropy_reason(self.steps_of_run())
        return dict(
            info,
            model_name=model_name or os.path.basename(os.path.normpath(args.output_dir)),
            method=CROSS_ENTROPY if reason else self.method,
            algorithm_detail=reason and f"{type(self).__name__}'s {self.method.name} never ran: {reason}",
            task=task or args.task,
            datasets=[dataset] if isinstance(dataset, str) else list(dataset or []),
            reward=None if reason else self.card_reward(),
            teacher=None if reason else self.card_teacher(),
            settings=card_settings(args, selection=self.selection_record()),
            metrics=final_eval_metrics(self.state.log_history),
            curve=training_curve(self.state.log_history),
            repo_id=args.hub_model_id,
            model_class=self.family.auto_class,
            max_new_tokens=getattr(args, "max_new_tokens", None) or args.generation_max_length,
            selection=self.eval_selection and {**self.selection_record(), "max_length": args.generation_max_length},
            **card_example(self.eval_dataset if self.eval_dataset is not None else self.train_dataset,
                           self.processing_class, self.family.name == "causal",
                           self.run_settings.get("prompt_template"), bool(self.run_settings.get("use_chat_template"))),
        )

    def selection_record(self) -> dict | None:
        """Returns the MBR / QE decoding of this trainer's evaluations as recorded (`EvaluationSelection.record`), or
        None: the one source of `seqrl_run.json`'s and the card's `generation_selection`."""
        return self.eval_selection and self.eval_selection.record()

    def card_reward(self) -> str | None:
        """Returns the reward as the model card names it (a rewarded trainer: as the user gave it), None without."""
        return None

    def card_teacher(self) -> str | None:
        """Returns the teacher the model card names (a rewarded trainer's `teacher_model`), None without one."""
        return None

    # ---- what the run trained with: the card, seqrl_run.json, the checkpoints -----------------------

    def steps_of_run(self) -> int:
        """Returns the optimizer steps the run trained (before training, `max_steps`: 0 when the epochs decide)."""
        return self.state.global_step or max(self.args.max_steps, 0)

    def own_loss_off(self) -> str | None:
        """Returns why the steps after the warm-up train as `Seq2SeqTrainer` does (the settings leave nothing of the
        trainer's own loss), None when they run it."""
        return None

    def cross_entropy_reason(self, steps: int) -> str | None:
        """Returns why a run of `steps` optimizer steps is plain cross-entropy fine-tuning (`run_record`), or None."""
        return cross_entropy_reason(self.algorithm_id, self.args.warmup_xe_steps, steps, self.own_loss_off())

    def trainer_identity(self) -> dict:
        """Returns what this trainer is set to train with, as its checkpoints record it (`run_record`)."""
        method, rewarded = self.method, self.card_reward() is not None
        return trainer_identity(type(self).__name__, self.algorithm_id, method,
                                method.baseline or (getattr(self, "baseline", None) if rewarded else None))

    def training_record(self) -> dict:
        """Returns what trained the model, as `seqrl_run.json` says it (`run_record.training_record`)."""
        steps = self.steps_of_run()
        return training_record(self.trainer_identity(), self.cross_entropy_reason(steps), self.card_reward(),
                               self.card_teacher(), steps, self.args.warmup_xe_steps)

    def create_model_card(self, language=None, license=None, tags=None, model_name=None, finetuned_from=None,
                          tasks=None, dataset_tags=None, dataset=None, dataset_args=None):
        """Writes hf-seqrl's model card to `output_dir/README.md` (used by `push_to_hub`)."""
        if not self.is_world_process_zero():
            return
        write_model_card(self.args.output_dir, license=license,
                         **self.model_card_info(model_name, dataset or dataset_tags, finetuned_from, tasks))

    def save_model(self, output_dir=None, _internal_call=False):
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:  # checkpoints too: `hf-seqrl evaluate` reads how this run cut and generated
            write_run_settings(output_dir or self.args.output_dir, self.args, self.family.name, self.run_settings,
                               training=self.training_record(), selection=self.selection_record())
        folder = output_dir or self.args.output_dir
        if output_dir is None or not _internal_call:  # the saved model, not a checkpoint: its card must load it
            save_base_beside(self.accelerator, self.model, folder, self.args.should_save)
        if not _internal_call and self.is_world_process_zero():
            write_model_card(folder, **self.model_card_info(model_name=os.path.basename(os.path.normpath(folder))))

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

    def save_process_state(self, folder: str) -> None:
        """Saves what each process keeps apart from the others (called on every process, before the state file)."""

    def load_process_state(self, folder: str) -> None:
        """Restores `save_process_state` from a checkpoint folder (called on every process)."""

    def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
        """`Trainer.train`; `resume_from_checkpoint=True` picks the newest *complete* checkpoint."""
        logger.setLevel(self.args.get_process_log_level())  # hf-seqrl's messages follow `log_level` as transformers' do
        if self.is_world_process_zero():
            logger.info(f"{type(self).__name__}: {self.method.name}, reward {self.reward_label}")
        latest = last_complete_checkpoint(self.args.output_dir) if resume_from_checkpoint is True else None
        check_processes_agree(self.args, resume_from_checkpoint, latest)  # before any process may fail alone
        if resume_from_checkpoint is True:
            resume_from_checkpoint = latest
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"resume_from_checkpoint=True but {self.args.output_dir} holds no complete checkpoint "
                    f"(a checkpoint-N folder with {STATE_FILE}); pass a checkpoint path or start without resuming."
                )
        if isinstance(resume_from_checkpoint, str) and self.is_world_process_zero():
            logger.warning(f"{type(self).__name__}: resumed from step {checkpoint_step(resume_from_checkpoint)} "
                           f"({resume_from_checkpoint})")
            self.warn_changed_training(resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)

    def warn_changed_training(self, checkpoint: str) -> None:
        """Warns when the checkpoint being resumed was trained with another algorithm, method, objective or baseline
        than this trainer's (`checkpoints.training_changes`), naming both."""
        changes = training_changes(checkpoint, self.trainer_identity())
        if changes:
            logger.warning(changed_training_warning(type(self).__name__, self.method.name, checkpoint,
                                                    read_state(checkpoint)[TRAINED_BY], changes))

    def set_initial_training_values(self, args, dataloader):
        """`Trainer.set_initial_training_values`; warns when the run's optimizer steps (its last value) never reach
        this trainer's own loss (`cross_entropy_reason`): the run is then cross-entropy training, as its card says."""
        values = super().set_initial_training_values(args, dataloader)
        reason = self.cross_entropy_reason(values[-1])
        if reason and self.is_world_process_zero():
            logger.warning(cross_entropy_warning(type(self).__name__, self.method.name, reason))
        return values

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self.save_process_state(folder)
        if self.args.should_save:
            if os.path.isdir(folder):
                self.save_extra_files(folder)
                write_state(folder, {**self.extra_state(), TRAINED_BY: self.trainer_identity()})  # last: completes it

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.load_extra_files(resume_from_checkpoint)
        self.load_process_state(resume_from_checkpoint)
        state = read_state(resume_from_checkpoint)
        if state is not None:
            self.load_extra_state(state)
