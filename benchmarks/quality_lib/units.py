"""The quality benchmark's units: one arm from checkpoint C, for one seed, trained for a budget of decoder token
positions and evaluated. Each arm's trainer is built from an `ArmContext`."""

from __future__ import annotations

import glob
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, fields

from hf_seqrl.demo import xe_trainer
from hf_seqrl.models.heads import checking_head

from .checkpoint import teacher_checkpoint, teacher_dir, training_args
from .metrics import arm_reward, evaluate, score
from .settings import (CLIPPED_ARMS, DISTILL_ARMS, RL_ARMS, SEQUENCE_ARMS, TEACHER_ARMS, TOKEN_ARMS, Settings,
                       rollout_tokens)
from .task import load_model, to_dataset

# Logged RL metrics kept per logging step: the baseline's reward against the samples' shows the advantages' offset.
CURVE_KEYS = ("step", "rl/reward", "rl/baseline_reward", "rl/advantage_abs", "rl/sample_length", "rl/entropy",
              "rl/pg_loss", "rl/clip_fraction", "rl/ratio_mean", "rl/ratio_min", "rl/ratio_max", "rl/frac_truncated",
              "rl/length_ratio", "mrt/risk", "mrt/q_entropy",
              "mrt/distinct_candidates", "rl/token_reward", "rl/frac_tokens_rewarded", "distill/divergence",
              "distill/on_policy", "loss")


class DecoderPositions:
    """Counts decoder token positions computed by `model` (teacher-forced and generated, padding included)."""

    def __init__(self, model):
        self.count = 0
        self._handle = model.get_decoder().register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if checking_head():  # the one-time forward that recognizes the model's head trains nothing
            return
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


def _xe_arm(ctx: "ArmContext"):
    from transformers import Seq2SeqTrainingArguments

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
        from hf_seqrl.rewards.token_match import token_match_reward
        from hf_seqrl.trainers import SCSTTrainer

        settings = ctx.settings
        clipped = {"num_iterations": settings.clip_iterations, "epsilon": settings.clip_epsilon,
                   "epsilon_high": settings.clip_epsilon_high or settings.clip_epsilon,
                   "importance_sampling_level": settings.importance_sampling_level} if arm in CLIPPED_ARMS else {}
        args = ctx.args(SeqRLConfig, lr=settings.rl_lr or settings.arm_lr, rl_weight=settings.rl_weight,
                        max_new_tokens=rollout_tokens(settings), center_advantages=settings.center_advantages,
                        temperature=settings.rl_temperature, disable_dropout=settings.disable_dropout,
                        mask_truncated_completions=settings.mask_truncated_completions,
                        multi_objective_aggregation=settings.multi_objective_aggregation,
                        length_normalize=settings.length_normalize, **RL_ARMS[arm], **clipped,
                        **({"token_reward_to_go": settings.token_reward_to_go} if arm in TOKEN_ARMS else {}))
        reward = token_match_reward(settings.token_penalty) if arm in TOKEN_ARMS else arm_reward(settings)
        return SCSTTrainer(model=ctx.model, args=args, reward_funcs=reward, train_dataset=ctx.dataset,
                           processing_class=ctx.tokenizer)

    return build


def _mrt_arm(candidates: str):
    def build(ctx: "ArmContext"):
        from hf_seqrl.configs import MRTConfig
        from hf_seqrl.trainers import MRTTrainer

        # The candidates of a source: `mrt_samples` samples and the greedy decode, or the `mrt_samples`-best list of a
        # beam of width `mrt_beam_size`; no baseline, so center_advantages does not apply. The risk is mixed with
        # cross-entropy as the policy-gradient arms are.
        settings = ctx.settings
        args = ctx.args(MRTConfig, lr=settings.rl_lr or settings.arm_lr, rl_weight=settings.rl_weight,
                        max_new_tokens=rollout_tokens(settings), temperature=settings.rl_temperature,
                        num_samples=settings.mrt_samples, mrt_alpha=settings.mrt_alpha,
                        mrt_candidates=candidates, mrt_beam_size=settings.mrt_beam_size,
                        mrt_include_greedy=candidates == "sample", disable_dropout=settings.disable_dropout)
        return MRTTrainer(model=ctx.model, args=args, reward_funcs=arm_reward(settings), train_dataset=ctx.dataset,
                          processing_class=ctx.tokenizer)

    return build


def _distill_arm(arm: str):
    def build(ctx: "ArmContext"):
        from hf_seqrl.configs import DistillationConfig
        from hf_seqrl.trainers import DistillationTrainer

        # Word-level KD trains on gold prefixes beside cross-entropy at `kd_weight` (Kim & Rush, 2016), at the
        # cross-entropy arm's learning rate; the on-policy arms sample as the SCST arm does (one sample per source,
        # `rl_weight`, `rl_lr`), `distill_bleu` with the SCST arm's reward and greedy baseline too.
        settings = ctx.settings
        lmbda, beta = DISTILL_ARMS[arm]
        off_policy = lmbda == 0.0
        rewarded = {"reward_funcs": arm_reward(settings)} if arm == "distill_bleu" else {}
        args = ctx.args(DistillationConfig, lr=None if off_policy else settings.rl_lr or settings.arm_lr,
                        lmbda=lmbda, beta=beta, rl_weight=settings.kd_weight if off_policy else settings.rl_weight,
                        max_new_tokens=rollout_tokens(settings), temperature=settings.rl_temperature,
                        disable_dropout=settings.disable_dropout, num_samples=1,
                        **({"baseline": "greedy", "center_advantages": settings.center_advantages} if rewarded
                           else {}))
        return DistillationTrainer(model=ctx.model, args=args, teacher_model=ctx.teacher, train_dataset=ctx.dataset,
                                   processing_class=ctx.tokenizer, **rewarded)

    return build


def _decoded_targets_arm(ctx: "ArmContext"):
    from transformers import Seq2SeqTrainingArguments

    # Cross-entropy on decodes of the training sources: sequence-level KD (Kim & Rush, 2016) on the teacher's beams,
    # MBR self-training (Finkelstein et al., 2024) on C's own MBR picks.
    return xe_trainer(ctx.model, ctx.tokenizer, ctx.teacher_dataset, ctx.args(Seq2SeqTrainingArguments))


def _mbr_online_arm(ctx: "ArmContext"):
    from hf_seqrl import BestOfNConfig, BestOfNTrainer

    # MBR fine-tuning on fresh samples: each batch's sources sampled `mbr_samples` times (temperature 1, epsilon
    # sampling at `mbr_epsilon` as the offline picks and C's MBR decoding draw), the pick of highest expected
    # `mbr_utility` against the others trained on by cross-entropy alone (`mbr_rl_weight` 1), as the offline arm
    # trains on its picks alone; C's dropout stays on, as in the cross-entropy arms.
    settings = ctx.settings
    args = ctx.args(BestOfNConfig, best_of_n_selection="mbr", num_samples=settings.mbr_samples,
                    rl_weight=settings.mbr_rl_weight,
                    max_new_tokens=settings.max_new_tokens, temperature=1.0, epsilon_cutoff=settings.mbr_epsilon)
    return BestOfNTrainer(model=ctx.model, args=args, reward_funcs=settings.mbr_utility, train_dataset=ctx.dataset,
                          processing_class=ctx.tokenizer)


def _mixer_arm(ctx: "ArmContext"):
    from hf_seqrl.configs import MixerConfig
    from hf_seqrl.trainers import MixerTrainer

    settings = ctx.settings
    # Δ grows by mixer_delta tokens every tenth of the budget's steps (one rollout + one scoring pass per step); the
    # sampled part is rewarded as the SCST arm's samples are (greedy baseline, the same cross-entropy mixing).
    steps = settings.budget_positions / (2 * settings.batch_size * ctx.mean_target_positions)
    args = ctx.args(MixerConfig, lr=settings.rl_lr or settings.arm_lr, max_new_tokens=rollout_tokens(settings),
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
    teacher: object = None  # the distillation arms' teacher model
    teacher_dataset: object = None  # kd_seq: the training sources with the teacher's beam decodes as targets;
    # mbr_offline: the first `mbr_train_sources` with C's MBR picks

    def args(self, config_class, lr: float | None = None, **extra):
        """Returns `config_class` with the arguments every arm shares (learning rate, batch, data order); an arm that
        samples writes its samples at each log (`log_completions`, nothing printed) for the unit's record."""
        if "log_completions" in {f.name for f in fields(config_class)}:
            extra = {"log_completions": True, "num_completions_to_print": 0, **extra}
        return training_args(config_class, self.settings, self.output_dir, self.seed,
                             self.settings.arm_lr if lr is None else lr, 10**6, **extra)


SAMPLE_ROWS = 8  # the rows of the last rollout a unit's record keeps ("last_samples")
SAMPLE_KEYS = ("step", "source", "references", "prediction", "greedy", "rewards", "reward", "truncated")


def last_samples(trainer, count: int = SAMPLE_ROWS) -> list[dict]:
    """Returns the first `count` rows of `trainer`'s last rollout, each with `SAMPLE_KEYS` (`step`: its optimizer
    step, 1-based): the rows it still holds (rolled out after its last periodic log), else those of the last sample
    log it wrote to `output_dir/completions` (`step-N.jsonl`); [] when it sampled nothing."""
    rows = list(trainer.completions.rows[:count])
    if not rows:
        from hf_seqrl.trainers.services.completions import COMPLETIONS_DIR

        logs = glob.glob(os.path.join(trainer.args.output_dir, COMPLETIONS_DIR, "step-*.jsonl"))
        if logs:
            last = max(logs, key=lambda path: int(os.path.basename(path)[len("step-"):-len(".jsonl")]))
            with open(last, encoding="utf-8") as f:
                rows = [json.loads(line) for line, _ in zip(f, range(count))]
    return [{key: row.get(key) for key in SAMPLE_KEYS} for row in rows]


# Every arm a benchmark can run: name -> builder of its trainer from an `ArmContext`.
ARM_TRAINERS = {
    "xe": _xe_arm, "ss": _ss_arm, "scst": _rl_arm("scst"), "loo4": _rl_arm("loo4"),
    "scst_clip": _rl_arm("scst_clip"), "loo4_clip": _rl_arm("loo4_clip"),
    "mrt": _mrt_arm("sample"), "mrt_beam": _mrt_arm("beam"), "pf": _pf_arm, "mixer": _mixer_arm,
    "pc": _input_schedule_arm("PrefixCorruptionConfig", "PrefixCorruptionTrainer", corruption_rate=0.15),
    "noise": _input_schedule_arm("PrefixCorruptionConfig", "PrefixCorruptionTrainer", corruption_rate=0.3,
                                 per_token_levels=True),
    "kstep2": _input_schedule_arm("KStepRolloutConfig", "KStepRolloutTrainer", rollout_steps=2),
    "kstep4": _input_schedule_arm("KStepRolloutConfig", "KStepRolloutTrainer", rollout_steps=4),
    "scst_tokens": _rl_arm("scst_tokens"), "loo4_tokens": _rl_arm("loo4_tokens"),
    **{arm: _distill_arm(arm) for arm in DISTILL_ARMS}, "kd_seq": _decoded_targets_arm,
    "mbr_offline": _decoded_targets_arm, "mbr_online": _mbr_online_arm,
}


def arm_trainer(arm: str, model, tokenizer, dataset, settings: Settings, output_dir: str, seed: int,
                mean_target_positions: float, teacher=None, teacher_dataset=None):
    """Returns the trainer of one arm, started from `model` (checkpoint C)."""
    return ARM_TRAINERS[arm](ArmContext(model, tokenizer, dataset, settings, output_dir, seed, mean_target_positions,
                                        teacher, teacher_dataset))


def decoded_targets(settings: Settings, rows: list[dict], tokenizer, model, folder: str, stem: str, role: str,
                    **decode) -> tuple[list[dict], dict]:
    """Returns `rows` with `model`'s decodes of their sources as targets (written by
    `hf_seqrl.evaluation.write_teacher_outputs` to `folder/<stem>.jsonl` unless there; `decode`: its beam width or
    MBR / QE settings) and the decode's record (`folder/<stem>.json`): its decoder positions and seconds, as
    `<role>_positions` and `<role>_seconds`."""
    import fcntl

    from hf_seqrl.evaluation import write_teacher_outputs

    path, record_path = os.path.join(folder, f"{stem}.jsonl"), os.path.join(folder, f"{stem}.json")
    # One writer: units of other seeds (other processes) wait for the decode instead of appending to it too.
    with open(os.path.join(folder, f"{stem}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(record_path):
            counter, clock = DecoderPositions(model), time.time()
            resumed = os.path.exists(path)
            write_teacher_outputs(model, tokenizer, rows, "source", path, batch_size=settings.eval_batch,
                                  max_new_tokens=settings.max_new_tokens,
                                  max_source_length=settings.max_source_tokens, **decode)
            counter.remove()
            with open(record_path, "w") as f:
                json.dump({f"{role}_positions": counter.count, f"{role}_seconds": round(time.time() - clock),
                           "resumed": resumed, "rows": len(rows)}, f)
    with open(path, encoding="utf-8") as f:
        decoded = [json.loads(line) for line in f]
    with open(record_path) as f:
        return [{**row, "target": row["teacher_target"]} for row in decoded], json.load(f)


def teacher_outputs(settings: Settings, splits: dict, tokenizer, teacher, folder: str) -> tuple[list[dict], dict]:
    """Returns the training rows with the teacher's beam-4 decodes as targets (sequence-level KD's data, in
    `folder/beam4_train.jsonl`) and the decode's record: its teacher decoder positions and seconds."""
    return decoded_targets(settings, splits["train"], tokenizer, teacher, folder, "beam4_train", "teacher",
                           num_beams=4)


def mbr_picks_stem(settings: Settings) -> str:
    """Returns the file stem of C's MBR picks of the training sources, named by what decides them."""
    return (f"mbr{settings.mbr_samples}_{settings.mbr_utility}_eps{settings.mbr_epsilon:g}"
            f"_train{settings.mbr_train_sources}")


def mbr_picks(settings: Settings, splits: dict, tokenizer, model, work_dir: str) -> tuple[list[dict], dict]:
    """Returns the first `mbr_train_sources` training rows with C's MBR picks as targets (`mbr_samples` epsilon samples
    per source, the `mbr_utility` pick; seeded, decoded once into C's work directory) and the decode's record: its
    decoder positions and seconds (`decode_positions`, `decode_seconds`)."""
    return decoded_targets(settings, splits["train"][:settings.mbr_train_sources], tokenizer, model, work_dir,
                           mbr_picks_stem(settings), "decode", num_beams=1, decode="mbr",
                           num_candidates=settings.mbr_samples, utility=settings.mbr_utility,
                           epsilon_cutoff=settings.mbr_epsilon)


def train_arm(arm: str, seed: int, settings: Settings, splits: dict, tokenizer, dataset, work_dir: str,
              c_folder: str):
    """Trains one arm from C (in `c_folder`) for the position budget; returns the model and its training record.
    The distillation arms' teacher is trained first unless cached; its decoder positions are counted apart."""
    from transformers import set_seed

    teacher = teacher_dataset = None
    extra = {}
    if arm in TEACHER_ARMS:
        _, folder = teacher_checkpoint(settings, splits, tokenizer, dataset, work_dir)
        teacher = load_model(settings, folder).eval()
        if arm == "kd_seq":
            rows, extra = teacher_outputs(settings, splits, tokenizer, teacher, teacher_dir(settings, work_dir))
            teacher_dataset = to_dataset(rows, tokenizer, settings)
    if arm == "mbr_offline":
        rows, extra = mbr_picks(settings, splits, tokenizer, load_model(settings, c_folder).eval(), work_dir)
        teacher_dataset = to_dataset(rows, tokenizer, settings)
    if settings.guards or "source" in settings.reward:  # the rewards that read the sources get them as text
        assert len(dataset) == len(splits["train"])
        dataset = dataset.add_column("sources", [r["source"] for r in splits["train"]])
    set_seed(seed)
    model = load_model(settings, c_folder)
    lengths = [len(x) for x in dataset["labels"]]
    os.makedirs(os.path.join(work_dir, "tmp"), exist_ok=True)
    output_dir = tempfile.mkdtemp(prefix=f"{arm}_seed{seed}_", dir=os.path.join(work_dir, "tmp"))  # its own samples
    trainer = arm_trainer(arm, model, tokenizer, dataset, settings, output_dir, seed, statistics.mean(lengths),
                          teacher, teacher_dataset)
    counter = DecoderPositions(model)
    teacher_counter = DecoderPositions(teacher) if arm in DISTILL_ARMS else None
    # The offline MBR arm's decode of its picks is part of its budget: the decoder positions of its candidates (every
    # sample row at every generated step, as the online arm's are counted while it trains) are taken off the positions
    # it trains for, and counted in its `positions`. The decode is shared by its seeds, each charged all of it.
    decoded = extra.get("decode_positions", 0)
    if decoded >= settings.budget_positions:
        raise ValueError(f"{arm}: decoding the picks of {settings.mbr_train_sources} training sources took {decoded:,} "
                         f"decoder positions, the whole budget_positions ({settings.budget_positions:,}): lower "
                         "mbr_train_sources or raise budget_positions (--set).")
    trainer.add_callback(position_budget(counter, settings.budget_positions - decoded))
    clock = time.time()
    trainer.train()
    train_seconds = time.time() - clock
    counter.remove()
    if teacher_counter is not None:
        teacher_counter.remove()
        extra["teacher_positions"] = teacher_counter.count
    history = trainer.state.log_history
    # The RL arms' logged sample reward and length over training (every `logging_steps` steps), and the mean of each
    # part of a combined or guarded reward (`rl/rewards/<name>/mean`: how often a guard gated the samples).
    curve = [{**{key: entry[key] for key in CURVE_KEYS if key in entry},
              **{key: value for key, value in entry.items() if key.startswith("rl/rewards/") and key.endswith("/mean")}}
             for entry in history if "rl/reward" in entry or "distill/divergence" in entry]
    record = {"arm": arm, "seed": seed, "steps": trainer.state.global_step, "positions": counter.count + decoded,
              "train_seconds": round(train_seconds), "train_seconds_exact": round(train_seconds, 3),
              "first_logged_reward": curve[0].get("rl/reward") if curve else None,
              "last_logged_reward": curve[-1].get("rl/reward") if curve else None, "curve": curve, **extra}
    if arm in SEQUENCE_ARMS:  # what the trainer sampled with, as it read it
        record["sampling"] = sampling_record(trainer.args)
    if getattr(trainer, "completions", None) is not None:  # what the arm wrote in its last rollout
        record["last_samples"] = last_samples(trainer)
    shutil.rmtree(output_dir, ignore_errors=True)
    return model, record


# What a sequence-level arm's config has no field for: MRT has no baseline, no advantages and no reused rollouts.
NO_SAMPLING_FIELD = {"baseline": None, "center_advantages": False, "num_iterations": 1}


def sampling_record(args) -> dict:
    """Returns how a sequence-level arm's trainer sampled and weighed its rollouts, as its config `args` reads."""
    return {"temperature": args.temperature, "num_samples": args.num_samples,
            **{name: getattr(args, name, absent) for name, absent in NO_SAMPLING_FIELD.items()}}


def run_arm(arm: str, seed: int, settings: Settings, splits: dict, tokenizer, dataset, work_dir: str,
            c_folder: str, dev_only: bool = False) -> dict:
    """Trains one arm from C (in `c_folder`) for the position budget and evaluates it (on dev only with
    `dev_only`); returns its record."""
    model, record = train_arm(arm, seed, settings, splits, tokenizer, dataset, work_dir, c_folder)
    if dev_only:
        record["dev"] = score(model, tokenizer, splits["dev"], settings, 1, f"{arm} seed {seed}: dev")
    else:
        record.update(evaluate(model, tokenizer, splits, settings, f"{arm} seed {seed}"))
    return record
