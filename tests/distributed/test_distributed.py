"""Two CPU processes under `accelerate launch --multi_gpu --num_processes 2` (DDP over gloo).

On a machine without GPUs, `--multi_gpu` alone starts two processes that never join one process group; the
pipeline sets `use_cpu=True` in that case (WORLD_SIZE > 1, no accelerator), which makes Accelerate use MULTI_CPU with
gloo. The worker script sets `use_cpu=True` itself. (`accelerate launch --cpu --num_processes 2` would start one
process: without MPI the simple launcher ignores --num_processes.)

1. The translation recipe, launched as users launch it, trains, evaluates and saves exactly once.
2. tests/distributed_worker.py: one SGD step on 2 processes x batch 4 equals one step on 1 process x batch 8 and on
   1 process x batch 4 x 2 accumulation steps; both ranks hold identical parameters (bitwise) after that step and
   after a few steps of the recipe's code path; the logged `rl/reward` is the mean over the 8 samples of both ranks.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import REPO, free_port, launch_env

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                       reason="torch.distributed with the gloo backend is needed"),
]

# DDP averages the gradients of the two ranks' per-batch means; one process averages all 8 rows at once. The results
# agree up to float32 summation order (observed: max |diff| 1.2e-7 for 1x8, 0 for 1x4x2).
ATOL, RTOL = 1e-6, 1e-5


def launch(args: list[str], tmp_path: Path, timeout: int = 300,
           launcher: tuple[str, ...] = ("--multi_gpu",)) -> tuple[subprocess.CompletedProcess, float]:
    """Returns (result, seconds) of `accelerate launch --multi_gpu --num_processes 2 ARGS` from the repository root
    (`launcher` replaces `--multi_gpu`, e.g. with `--config_file FILE`)."""
    command = [sys.executable, "-m", "accelerate.commands.launch", *launcher, "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(free_port()), *args]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env=launch_env(tmp_path), capture_output=True, text=True,
                            timeout=timeout)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result, seconds


def run_worker(tmp_path: Path, runs: tuple[str, ...], suite: str | None = None,
               launcher: tuple[str, ...] = ("--multi_gpu",)) -> tuple[dict, Path]:
    """Returns (`{run}{rank}` -> what tests/distributed_worker.py dumped, the output folder) after launching it on 2
    processes, with its default runs or a suite of `SUITES`."""
    out = tmp_path / "out"
    out.mkdir()
    _, seconds = launch(["tests/distributed/distributed_worker.py", str(out), str(REPO), *([suite] if suite else [])], tmp_path,
                        launcher=launcher)
    print(f"{suite or 'default'} worker on 2 processes: {seconds:.1f} s")
    return {f"{run}{rank}": torch.load(out / f"{run}_rank{rank}.pt", weights_only=False)
            for run in runs for rank in (0, 1)}, out


def single_process_test_metrics(out: Path) -> dict[str, float]:
    """Returns corpus BLEU/chrF of the saved model's greedy outputs on the same 12 test rows, in one process."""
    from transformers import AutoModelForSeq2SeqLM, ByT5Tokenizer
    from transformers.trainer_utils import EvalPrediction

    from hf_seqrl.evaluation import build_compute_metrics
    from hf_seqrl.cli.train import load_splits, parse_args, task_metrics

    script_args, args = parse_args(["--config", str(REPO / "recipes/configs/tiny_offline_translation.yaml"),
                                    "--output_dir", str(out / "unused"), "--max_test_samples", "12",
                                    "--train_file", str(REPO / "recipes/data/toy_de_en.train.txt"),
                                    "--validation_file", "",
                                    "--test_file", str(REPO / "recipes/data/toy_de_en.test.txt")])
    tokenizer = ByT5Tokenizer()
    test = load_splits(script_args, args, tokenizer)["test"]
    model = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    batch = tokenizer.pad({"input_ids": test["input_ids"]}, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**batch, max_length=args.generation_max_length, num_beams=1, do_sample=False)
    compute = build_compute_metrics(tokenizer, task_metrics("translation"), test["references"])
    return compute(EvalPrediction(predictions=ids.numpy(), label_ids=None))


@pytest.mark.slow  # tens of seconds: in the second tier
def test_translation_recipe_on_two_processes(tmp_path):
    out = tmp_path / "out"
    result, seconds = launch([
        "recipes/translation.py", "--config", "recipes/configs/tiny_offline_translation.yaml",
        "--output_dir", str(out), "--max_steps", "4", "--warmup_xe_steps", "2", "--num_samples", "2",
        "--per_device_train_batch_size", "4", "--tiny_d_model", "32", "--eval_strategy", "no",
        "--max_eval_samples", "8", "--max_test_samples", "12",
        "--log_level", "info", "--log_level_replica", "info",  # both ranks log what they do
    ], tmp_path)
    print(f"recipe on 2 processes: {seconds:.1f} s")
    logs = result.stdout + result.stderr
    # one process group of two: the global batch is 2 x 4
    assert "Total train batch size (w. parallel, distributed & accumulation) = 8" in logs
    # evaluated with generation on the test split (12 rows over 2 ranks: the padded copies are not scored twice)
    metrics = json.loads((out / "all_results.json").read_text())
    assert 0.0 <= metrics["test_bleu"] <= 100.0 and 0.0 <= metrics["test_chrf"] <= 100.0
    assert 0.0 <= metrics["eval_chrf"] <= 100.0
    assert metrics["test_chrf"] == pytest.approx(single_process_test_metrics(out)["chrf"], abs=1e-6)
    # saved once, by the main process, though every rank logs at info level
    assert logs.count("Saving model checkpoint to") == 1, logs.count("Saving model checkpoint to")
    assert (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists()
    card = (out / "README.md").read_text()
    assert "- Algorithm: REINFORCE with leave-one-out baseline" in card and "- Reward: `chrf`" in card


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    runs = ("one_step", "pipeline", "causal_one_step", "causal_pipeline")
    return run_worker(tmp_path_factory.mktemp("dist"), runs)[0]


@pytest.fixture(scope="module")
def single_process_references(tmp_path_factory):
    """One process: batch 8, and batch 4 with 2 accumulation steps (same model, data, settings as the worker)."""
    import distributed_worker as worker

    tmp_path = tmp_path_factory.mktemp("single")
    runs = {}
    for name, overrides in (("1x8", dict(per_device_train_batch_size=8)),
                            ("1x4x2", dict(gradient_accumulation_steps=2))):
        worker.REWARDS_SEEN.clear()
        trainer = worker.run_one_step(str(tmp_path / name), **overrides)
        runs[name] = dict(params={k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
                          log_history=trainer.state.log_history, rewards_seen=list(worker.REWARDS_SEEN))
    return runs


def test_both_ranks_hold_identical_parameters(worker_results):
    from helpers import tiny_model

    initial = tiny_model("t5", seed=1).state_dict()
    for phase in ("one_step", "pipeline"):
        rank0, rank1 = worker_results[f"{phase}0"], worker_results[f"{phase}1"]
        assert rank0["world_size"] == rank1["world_size"] == 2
        assert [rank0["process_index"], rank1["process_index"]] == [0, 1]
        for name, value in rank0["params"].items():
            assert torch.equal(value, rank1["params"][name]), (phase, name)
    moved = max((worker_results["one_step0"]["params"][k] - initial[k]).abs().max().item() for k in initial)
    assert moved > 1e-3  # the step did something


@pytest.mark.parametrize("reference", ["1x8", "1x4x2"])
def test_two_processes_equal_one_process_with_the_same_global_batch(worker_results, single_process_references,
                                                                    reference):
    distributed = worker_results["one_step0"]["params"]
    single = single_process_references[reference]["params"]
    for name in single:
        torch.testing.assert_close(distributed[name], single[name], atol=ATOL, rtol=RTOL)


def test_logged_rl_metrics_are_averaged_over_ranks(worker_results, single_process_references):
    rank0, rank1 = worker_results["one_step0"], worker_results["one_step1"]
    # each rank scored its own 4 samples; together they are the 8 samples of the single process's batch of 8
    assert len(rank0["rewards_seen"]) == len(rank1["rewards_seen"]) == 4
    assert sorted(rank0["rewards_seen"]) != sorted(rank1["rewards_seen"])
    all_rewards = rank0["rewards_seen"] + rank1["rewards_seen"]
    single = single_process_references["1x8"]
    assert sorted(all_rewards) == pytest.approx(sorted(single["rewards_seen"]), abs=1e-6)

    def logged_reward(history):
        return [h["rl/reward"] for h in history if "rl/reward" in h]

    expected = sum(all_rewards) / 8
    assert logged_reward(single["log_history"]) == pytest.approx([expected], abs=1e-6)
    assert logged_reward(rank0["log_history"]) == pytest.approx([expected], abs=1e-6)
    # rank 0's own mean differs: the logged value is the all-reduced one
    assert sum(rank0["rewards_seen"]) / 4 != pytest.approx(expected, abs=1e-6)


@pytest.fixture(scope="module")
def reuse_and_mrt_results(tmp_path_factory):
    return run_worker(tmp_path_factory.mktemp("dist_reuse_mrt"), ("reuse", "mrt"), "reuse_and_mrt")[0]


def test_reused_rollouts_and_mrt_on_two_processes(reuse_and_mrt_results, tmp_path):
    """Each rank's rollout serves 2 clipped steps, the two ranks stay identical and together equal one process
    with the global batch of 8; MRT trains on both ranks and logs its metrics averaged over them."""

    import distributed_worker as worker
    from helpers import tiny_model

    results = reuse_and_mrt_results
    for run in ("reuse", "mrt"):
        assert results[f"{run}0"]["world_size"] == 2
        for name, value in results[f"{run}0"]["params"].items():
            assert torch.equal(value, results[f"{run}1"]["params"][name]), (run, name)
    single = worker.run_reuse(str(tmp_path / "1x8"), per_device_train_batch_size=8)
    worker.REWARDS_SEEN.clear()
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(results["reuse0"]["params"][name], value, atol=ATOL, rtol=RTOL)
    # 4 samples per rank and step, all scored at the one rollout: each rank's reward calls saw 4 samples, not 8
    assert len(results["reuse0"]["rewards_seen"]) == len(results["reuse1"]["rewards_seen"]) == 4
    clipped = [h for h in results["reuse0"]["log_history"] if "rl/ratio_mean" in h]
    assert len(clipped) == 2 and clipped[0]["rl/ratio_mean"] == 1.0 and clipped[1]["rl/ratio_mean"] != 1.0
    # the logged range is the extremes over both ranks' tokens: those of one process holding all 8 samples
    alone = [h for h in single.state.log_history if "rl/ratio_mean" in h][1]
    for key in ("rl/ratio_min", "rl/ratio_max"):
        assert clipped[1][key] == pytest.approx(alone[key], abs=1e-5), key
    assert clipped[1]["rl/ratio_min"] < clipped[1]["rl/ratio_mean"] < clipped[1]["rl/ratio_max"]
    mrt = [h for h in results["mrt0"]["log_history"] if "mrt/risk" in h]
    assert len(mrt) == 2 and all(math.isfinite(h["mrt/risk"]) and math.isfinite(h["rl/xe_loss"]) for h in mrt)
    initial = tiny_model("t5", seed=1).state_dict()
    assert max((results["mrt0"]["params"][k] - initial[k]).abs().max().item() for k in initial) > 1e-4


@pytest.fixture(scope="module")
def mixer_and_pf_results(tmp_path_factory):
    results, out = run_worker(tmp_path_factory.mktemp("dist_mixer_pf"), ("mixer", "pf", "distill"), "mixer_and_pf")
    for rank in (0, 1):
        results[f"discriminator{rank}"] = torch.load(out / f"pf_discriminator_rank{rank}.pt")
    results["mixer_completions"] = {path.name: [json.loads(line) for line in path.read_text().splitlines()]
                                    for path in sorted((out / "mixer" / "completions").glob("*.jsonl"))}
    return results


@pytest.mark.slow  # a single-process reference run beside the suite's: in the second tier
def test_distillation_on_two_processes_equals_one_process_with_the_global_batch(mixer_and_pf_results, tmp_path):
    """2 processes x 4 sources of on-policy distillation (greedy samples) end where one process with 8 ends."""
    import distributed_worker as worker
    from helpers import tiny_model

    single = worker.run_distillation(str(tmp_path / "1x8"), per_device_train_batch_size=8)
    distributed = mixer_and_pf_results["distill0"]["params"]
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(distributed[name], value, atol=ATOL, rtol=RTOL)
    initial = tiny_model("t5", seed=1).state_dict()
    assert max((distributed[k] - initial[k]).abs().max().item() for k in initial) > 1e-3  # the steps moved it


def test_mixer_and_professor_forcing_on_two_processes(mixer_and_pf_results):
    """MIXER, professor forcing and on-policy distillation train on 2 processes: the ranks end with identical models
    (and, for professor forcing, identical discriminators, whose gradients are averaged over the ranks), and log
    finite metrics averaged over them; the distillation teacher stays out of DDP. MIXER's
    sample log holds, at each logging step, the samples of both ranks (batch 4 x 2 samples x 2 processes)."""

    from helpers import tiny_model

    results = mixer_and_pf_results
    initial = tiny_model("t5", seed=1).state_dict()
    for run in ("mixer", "pf", "distill"):
        assert results[f"{run}0"]["world_size"] == 2
        for name, value in results[f"{run}0"]["params"].items():
            assert torch.equal(value, results[f"{run}1"]["params"][name]), (run, name)
        assert max((results[f"{run}0"]["params"][k] - initial[k]).abs().max().item() for k in initial) > 1e-4
    for name, value in results["discriminator0"].items():
        assert torch.equal(value, results["discriminator1"][name]), name
    mixer = [h for h in results["mixer0"]["log_history"] if "mixer/delta" in h]
    assert len(mixer) == 2 and all(h["mixer/delta"] == 2.0 and math.isfinite(h["rl/reward"]) for h in mixer)
    completions = results["mixer_completions"]
    assert sorted(completions) == ["step-1.jsonl", "step-2.jsonl"]
    for log, rows in zip(mixer, completions.values()):
        assert len(rows) == 4 * 2 * 2 and [row["process"] for row in rows] == [0] * 8 + [1] * 8
        assert all(row["greedy"] is not None and math.isfinite(row["advantage"]) for row in rows)
        assert sum(row["reward"] for row in rows) / 16 == pytest.approx(log["rl/reward"], abs=1e-6)  # all ranks
    distill = [h for h in results["distill0"]["log_history"] if "distill/divergence" in h]
    assert len(distill) == 2 and all(h["distill/on_policy"] == 1.0 and h["distill/divergence"] > 0 for h in distill)
    teacher = tiny_model("t5", seed=2).state_dict()
    for rank in (0, 1):  # the teacher is neither wrapped nor optimized, and ends as it began
        record = results[f"distill{rank}"]["teacher"]
        assert record["class"] == "T5ForConditionalGeneration" and not record["trainable"]
        assert not record["in_optimizer"]
        assert all(torch.equal(record["params"][k], v) for k, v in teacher.items())
    pf = [h for h in results["pf0"]["log_history"] if "pf/d_loss" in h]
    assert len(pf) == 2 and all(math.isfinite(h["pf/adv_loss"]) and 0 <= h["pf/d_accuracy"] <= 1 for h in pf)


@pytest.mark.slow
@pytest.mark.parametrize("suite,runs", [
    ("input_schedules", (("noise_level", "pc/replaced_fraction"), ("kstep", "ks/own_token_accuracy"))),
    ("causal_trainers", (("causal_mrt", "mrt/risk"), ("causal_kstep", "ks/own_token_accuracy"))),
])
def test_trainers_of_a_suite_on_two_processes(tmp_path, suite, runs):
    """Noise-level forcing and an exact k-step rollout on a tiny T5, or MRT (2 steps) and the k-step rollout on a
    decoder-only Llama, on 2 processes x batch 4: identical ranks, metrics logged; the deterministic rollout (the
    suite's last run, one step) equals one process with the same global batch of 8."""
    import distributed_worker as worker

    results, _ = run_worker(tmp_path, tuple(run for run, _ in runs), suite)
    for run, metric in runs:
        rank0, rank1 = results[f"{run}0"], results[f"{run}1"]
        assert rank0["world_size"] == rank1["world_size"] == 2
        for name, value in rank0["params"].items():
            assert torch.equal(value, rank1["params"][name]), (run, name)
        logged = [h[metric] for h in rank0["log_history"] if metric in h]
        assert logged and all(math.isfinite(v) for v in logged), run
    single = worker.run_input_schedule_step(str(tmp_path / "single"), "kstep", causal=suite == "causal_trainers",
                                            per_device_train_batch_size=8)
    distributed = results[f"{runs[-1][0]}0"]["params"]
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(distributed[name], value, atol=ATOL, rtol=RTOL)


@pytest.mark.slow  # tens of seconds: in the second tier
def test_model_reward_batch_scaling_and_batched_rollouts_on_two_processes(tmp_path):
    """2 processes x batch 4: a reward model on each rank with the advantages scaled by their std over both ranks
    equals one process with the global batch of 8; 2 x 2 sampled micro-batches whose rollouts one decode serves end
    where decoding them one by one ends."""
    import distributed_worker as worker

    results, _ = run_worker(tmp_path, ("model_reward", "batched", "unbatched"), "model_reward_and_batched")
    single = worker.run_model_reward(str(tmp_path / "single_rm"), per_device_train_batch_size=8)
    for run in ("model_reward", "batched", "unbatched"):
        assert results[f"{run}0"]["world_size"] == 2
        logged = [h["rl/reward"] for h in results[f"{run}0"]["log_history"] if "rl/reward" in h]
        assert len(logged) == 1 and math.isfinite(logged[0])
        for name, value in results[f"{run}0"]["params"].items():
            assert torch.equal(value, results[f"{run}1"]["params"][name]), (run, name)
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(results["model_reward0"]["params"][name], value, atol=ATOL, rtol=RTOL)
    for name, value in results["unbatched0"]["params"].items():
        torch.testing.assert_close(results["batched0"]["params"][name], value, atol=ATOL, rtol=RTOL)


@pytest.mark.slow  # tens of seconds: in the second tier
def test_deepspeed_zero3_trains_as_one_process(tmp_path):
    """recipes/accelerate_configs/deepspeed_zero3.yaml on 2 CPU processes: the Trainer with every parameter
    partitioned (rollouts, the scoring pass and the step) ends one step of the `one_step` setup, encoder-decoder and
    decoder-only, where one process with the global batch of 8 ends; a decoder-only evaluation with generation
    finishes on both ranks."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed)")
    import distributed_worker as worker

    config = REPO / "recipes" / "accelerate_configs" / "deepspeed_zero3.yaml"
    results, _ = run_worker(tmp_path, ("one_step", "causal_one_step", "causal_eval"), "zero3",
                            launcher=("--config_file", str(config)))
    # evaluation generates under sharded weights (Seq2SeqTrainer's synced_gpus): both ranks finish, same metrics
    evaluated = [[h["eval_loss"] for h in results[f"causal_eval{rank}"]["log_history"] if "eval_loss" in h]
                 for rank in (0, 1)]
    assert len(evaluated[0]) == 1 and evaluated[0] == evaluated[1] and math.isfinite(evaluated[0][0])
    for run, single_run in (("one_step", worker.run_one_step), ("causal_one_step", worker.run_one_step_causal)):
        assert results[f"{run}0"]["world_size"] == 2
        single = single_run(str(tmp_path / f"single_{run}"), per_device_train_batch_size=8, max_grad_norm=1.0)
        worker.REWARDS_SEEN.clear()
        for name, value in single.model.state_dict().items():
            for rank in (0, 1):
                torch.testing.assert_close(results[f"{run}{rank}"]["params"][name], value, atol=ATOL, rtol=RTOL)


def test_causal_model_on_two_processes(worker_results):
    """A decoder-only model: both ranks stay identical, and one step on 2 x 4 prompts equals one on 1 x 8."""
    import distributed_worker as worker

    for phase in ("causal_one_step", "causal_pipeline"):
        rank0, rank1 = worker_results[f"{phase}0"], worker_results[f"{phase}1"]
        assert rank0["world_size"] == 2
        for name, value in rank0["params"].items():
            assert torch.equal(value, rank1["params"][name]), (phase, name)
    history = worker_results["causal_pipeline0"]["log_history"]
    assert any(h.get("rl/phase") == 1.0 and "rl/reward" in h for h in history)  # the RL steps ran
    worker.REWARDS_SEEN.clear()
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        single = worker.run_one_step_causal(out, per_device_train_batch_size=8).model.state_dict()
    for name, value in single.items():
        torch.testing.assert_close(worker_results["causal_one_step0"]["params"][name], value, atol=ATOL, rtol=RTOL)
