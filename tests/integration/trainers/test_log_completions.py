"""Sample logs (`log_completions`) and per-reward metrics (`rl/rewards/<name>/*`) on tiny models."""

import json
import math

import pytest

from helpers import (byt5_tokenizer, make_config, prompt_completion_dataset, tiny_causal_model, tiny_model,
                     toy_dataset, toy_pairs)
from hf_seqrl import MRTConfig, MRTTrainer, SCSTTrainer, SeqRLConfig
from hf_seqrl.rewards import get_reward

WEIGHTS = {"overlap": 0.3, "chrf_reward": 0.7}


def overlap(predictions, references, **_):
    """Returns the character-set overlap with the first reference plus a length term: it tells an untrained model's
    samples apart."""
    return [len(set(p) & set(refs[0])) / max(len(set(p) | set(refs[0])), 1) + len(p) / 100
            for p, refs in zip(predictions, references)]


def completion_files(output_dir) -> dict[int, list[dict]]:
    """Returns `{N: rows of output_dir/completions/step-N.jsonl}`."""
    folder = output_dir / "completions"
    return {int(path.stem.split("-")[1]): [json.loads(line) for line in path.read_text().splitlines()]
            for path in folder.glob("step-*.jsonl")}


def weighted(overlap_value: float, chrf: float) -> float:
    return 0.0 + WEIGHTS["overlap"] * overlap_value + WEIGHTS["chrf_reward"] * chrf  # WeightedReward's order of sums


def test_scst_writes_every_sample_at_each_log_and_logs_each_reward(tmp_path, capsys):
    tok = byt5_tokenizer()
    sources, targets = toy_pairs(16, seed=0, alphabet="abcd", lengths=(2, 5))
    data = toy_dataset(tok, sources, targets).add_column("domain", ["toy"] * 16)
    args = make_config(SeqRLConfig, tmp_path, max_steps=2, num_samples=2, max_new_tokens=4,
                       reward_weights=list(WEIGHTS.values()), log_completions=True, num_completions_to_print=3,
                       report_to=["tensorboard"])
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs=[overlap, "chrf"], train_dataset=data,
                          processing_class=tok)
    trainer.train()
    files = completion_files(tmp_path / "out")
    assert sorted(files) == [1, 2]  # one file per logging step (logging_steps=1)
    logs = {h["step"]: h for h in trainer.state.log_history if "rl/reward" in h}
    chrf = get_reward("chrf")
    for step, rows in files.items():
        assert len(rows) == 4 * 2  # batch x num_samples
        assert {row["step"] for row in rows} == {step} and {row["process"] for row in rows} == {0}
        assert [row["sample"] for row in rows] == [0, 1] * 4
        for row in rows:
            refs = row["references"]
            assert row["source"] in sources and refs == [row["source"]]  # decoded input_ids; the copy task
            assert row["columns"] == {"domain": "toy"}
            # each reward's value is that reward's own score of the sample; the total is their weighted sum
            assert row["rewards"] == {"overlap": overlap([row["prediction"]], [refs])[0],
                                      "chrf_reward": chrf([row["prediction"]], [refs])[0]}
            assert row["reward"] == weighted(*row["rewards"].values())
            # SCST: the baseline is the greedy decode's reward, the advantage the difference
            greedy = weighted(overlap([row["greedy"]], [refs])[0], chrf([row["greedy"]], [refs])[0])
            assert row["baseline"] == pytest.approx(greedy, abs=1e-6)
            assert row["advantage"] == pytest.approx(row["reward"] - row["baseline"], abs=1e-6)
            assert isinstance(row["truncated"], bool)
        # the flags are those the logged share counts (one micro-batch per log here)
        assert sum(row["truncated"] for row in rows) / len(rows) == pytest.approx(logs[step]["rl/frac_truncated"])
        # per-reward metrics next to rl/reward: the weighted sum of their means is the logged reward
        log = logs[step]
        parts = {name: log[f"rl/rewards/{name}/mean"] for name in WEIGHTS}
        assert weighted(*parts.values()) == pytest.approx(log["rl/reward"], abs=1e-6)
        assert parts["chrf_reward"] == pytest.approx(sum(r["rewards"]["chrf_reward"] for r in rows) / 8, abs=1e-6)
        assert all(math.isfinite(log[f"rl/rewards/{name}/std"]) for name in WEIGHTS)
    printed = capsys.readouterr().out
    assert "completions at step 1" in printed and "completions at step 2" in printed
    # TensorBoard: the table as text at each logging step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = {path.parent for path in (tmp_path / "out").rglob("events.out.tfevents*")}
    events = EventAccumulator(str(run), size_guidance={"tensors": 0})
    events.Reload()
    texts = events.Tensors("completions/text_summary")
    assert [t.step for t in texts] == [1, 2]
    table = texts[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| step | process | source | references | prediction | greedy | reward/overlap |")
    assert table.count("\n") == 1 + 8


def test_rows_of_the_last_step_only_with_accumulation(tmp_path):
    """Logging every 2 steps with 2 micro-batches per step: the file holds the 2 micro-batches of the logged step,
    not the step before it."""
    tok = byt5_tokenizer()
    sources, targets = toy_pairs(16, seed=0, alphabet="abcd", lengths=(2, 5))
    args = make_config(SeqRLConfig, tmp_path, max_steps=2, per_device_train_batch_size=2,
                       gradient_accumulation_steps=2, logging_steps=2, num_samples=2, baseline="mean",
                       log_completions=True, num_completions_to_print=0)
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs="chrf",
                          train_dataset=toy_dataset(tok, sources, targets), processing_class=tok)
    trainer.train()
    files = completion_files(tmp_path / "out")
    assert sorted(files) == [2]
    rows = files[2]
    assert len(rows) == 2 * 2 * 2 and {row["step"] for row in rows} == {2}
    assert all(row["greedy"] is None and set(row["rewards"]) == {"chrf_reward"} for row in rows)
    # leave-one-out: each sample's baseline is the other sample's reward of its source
    for first, second in zip(rows[::2], rows[1::2]):
        assert first["baseline"] == pytest.approx(second["reward"], abs=1e-6)
    logged = [h for h in trainer.state.log_history if "rl/reward" in h]
    assert logged[0]["rl/rewards/chrf_reward/mean"] == pytest.approx(logged[0]["rl/reward"], abs=1e-7)


def test_mrt_on_a_decoder_only_model_logs_its_samples(tmp_path):
    tok = byt5_tokenizer()
    data = prompt_completion_dataset(tok, n=8, seed=5, task="copy", lengths=(2, 4))
    args = make_config(MRTConfig, tmp_path, max_steps=1, num_samples=2, mrt_include_greedy=True,
                       log_completions=True, num_completions_to_print=0)
    trainer = MRTTrainer(model=tiny_causal_model("llama"), args=args, reward_funcs=["bleu", "chrf"],
                         train_dataset=data, processing_class=tok)
    trainer.train()
    rows = completion_files(tmp_path / "out")[1]
    assert len(rows) == 4 * 2  # the samples, not the greedy candidate
    for row in rows:
        assert row["source"].endswith("=") and row["references"] == [row["source"][:-1]]  # the prompt, decoded
        assert row["baseline"] is None and row["advantage"] is None and isinstance(row["greedy"], str)
        assert row["reward"] == 0.0 + 0.5 * row["rewards"]["bleu_reward"] + 0.5 * row["rewards"]["chrf_reward"]
    log = next(h for h in trainer.state.log_history if "mrt/risk" in h)
    means = [log[f"rl/rewards/{name}/mean"] for name in ("bleu_reward", "chrf_reward")]
    assert 0.5 * means[0] + 0.5 * means[1] == pytest.approx(log["rl/reward"], abs=1e-6)


def test_distillation_without_a_reward_logs_the_students_samples_their_length_and_truncation(tmp_path):
    """On-policy distillation has no reward: its sample log holds the student's samples (no reward or advantage),
    and its logs their length and the share cut at the length limit, as every rolling-out trainer's do. A random
    student with a 3-token budget seldom writes EOS: most samples are cut, and `rl/frac_truncated` says so."""
    from hf_seqrl import DistillationConfig, DistillationTrainer

    tok = byt5_tokenizer()
    sources, targets = toy_pairs(8, seed=0, alphabet="abcd", lengths=(2, 5))
    args = make_config(DistillationConfig, tmp_path, max_steps=2, num_samples=2, max_new_tokens=3,
                       log_completions=True, num_completions_to_print=0)
    trainer = DistillationTrainer(model=tiny_model("t5", seed=1), args=args, teacher_model=tiny_model("t5", seed=2),
                                  train_dataset=toy_dataset(tok, sources, targets), processing_class=tok)
    trainer.train()
    files = completion_files(tmp_path / "out")
    assert sorted(files) == [1, 2]
    logs = {h["step"]: h for h in trainer.state.log_history if "distill/divergence" in h}
    for step, rows in files.items():
        assert len(rows) == 4 * 2 and [row["sample"] for row in rows] == [0, 1] * 4
        for row in rows:
            assert row["source"] in sources and row["references"] == [row["source"]]
            assert isinstance(row["prediction"], str) and row["rewards"] == {} and row["reward"] is None
            assert row["advantage"] is None and row["baseline"] is None
        log = logs[step]
        assert sum(row["truncated"] for row in rows) / len(rows) == log["rl/frac_truncated"] > 0.5
        assert 1 <= log["rl/sample_length"] <= 3 and log["distill/on_policy"] == 1.0 and "rl/reward" not in log
