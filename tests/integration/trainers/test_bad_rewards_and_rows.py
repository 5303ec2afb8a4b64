"""Bad rewards, degenerate generations and mixed precision fail loudly or are logged, never poison training."""

import math
import os

import numpy as np
import pytest
import torch

from helpers import tiny_model, toy_dataset, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig


def run(tmp_path, tokenizer, reward, arch="t5", model=None, **kwargs):
    src, tgt = toy_pairs(8, seed=0, alphabet="abcd", lengths=(2, 5))
    args = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2, learning_rate=1e-3,
                logging_steps=1, report_to=[], save_strategy="no", max_new_tokens=6, disable_tqdm=True,
                dataloader_pin_memory=False, num_samples=2)
    args.update(kwargs)
    model = model or tiny_model(arch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = SCSTTrainer(model=model, args=SeqRLConfig(**args), reward_funcs=reward,
                          train_dataset=toy_dataset(tokenizer, src, tgt), processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rl/reward" in h]
    return trainer, logs, before


def test_reward_exception_names_reward_step_and_rows(tmp_path, tokenizer):
    def broken(predictions, references, sources=None):
        raise KeyError("boom")

    # the 1-based step and the rows; no checkpoint before any step is done
    with pytest.raises(RuntimeError, match=r"reward 'broken' raised KeyError at training step 1 on 8 rows, the first "
                                           r"prediction '.*': 'boom' \(no step was done yet"):
        run(tmp_path, tokenizer, broken)


def test_reward_returning_arrays_or_tensors_is_accepted(tmp_path, tokenizer):
    _, logs, _ = run(tmp_path, tokenizer, lambda predictions, **_: np.linspace(0, 1, len(predictions)))
    assert logs and all(math.isfinite(h["rl/reward"]) for h in logs)
    _, logs, _ = run(tmp_path, tokenizer, lambda predictions, **_: torch.ones(len(predictions)) * 0.5)
    assert logs[-1]["rl/reward"] == pytest.approx(0.5)


def test_reward_wrong_length_is_an_error(tmp_path, tokenizer):
    def short(predictions, references, sources=None):
        return [0.0]

    with pytest.raises(ValueError, match=r"reward 'short' returned 1 values for 8 predictions at training step 1 on 8 rows"):
        run(tmp_path, tokenizer, short)


def test_reward_returning_strings_is_an_error(tmp_path, tokenizer):
    def strings(predictions, references, sources):
        return ["1"] * len(predictions)

    with pytest.raises(TypeError, match=r"reward 'strings' returned '1' \(str\) at index 0 at training step 1 on 8 rows"):
        run(tmp_path, tokenizer, strings)


def nan_reward(predictions, references, sources=None):
    return [math.nan if i % 2 else 0.1 * i for i in range(len(predictions))]


def test_nan_reward_is_an_error_by_default(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="non-finite.*nonfinite_rewards='drop'"):
        run(tmp_path, tokenizer, nan_reward, baseline="mean")


def test_nan_reward_can_be_dropped_and_counted(tmp_path, tokenizer):
    _, logs, _ = run(tmp_path, tokenizer, nan_reward, baseline="mean", nonfinite_rewards="drop")
    assert logs[-1]["rl/nonfinite_rewards"] == 4.0  # 8 samples, every second one NaN
    assert all(math.isfinite(v) for h in logs for k, v in h.items() if k.startswith("rl/"))


@pytest.mark.parametrize("scale,center", [(False, False), (True, False), (False, True)])
def test_constant_rewards_make_a_no_op_step(tmp_path, tokenizer, scale, center):
    trainer, logs, before = run(tmp_path, tokenizer, lambda predictions, **_: [0.3] * len(predictions),
                                baseline="mean", scale_rewards=scale, center_advantages=center, weight_decay=0.0)
    assert all(h["rl/frac_zero_advantage"] == 1.0 for h in logs)
    assert all(h["rl/pg_loss"] == 0.0 for h in logs)
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("eos_bias,metric", [(1e4, "rl/frac_empty"), (-1e4, "rl/frac_truncated")])
def test_degenerate_generations_are_logged(tmp_path, tokenizer, eos_bias, metric):
    model = tiny_model("bart")
    model.final_logits_bias[0, 1] = eos_bias  # BART: force (or forbid) EOS, id 1
    _, logs, _ = run(tmp_path, tokenizer, "chrf", model=model)
    assert logs[-1][metric] == 1.0
    expected_length = 1.0 if eos_bias > 0 else 6.0
    assert logs[-1]["rl/sample_length"] == expected_length
    assert math.isfinite(logs[-1]["loss"])


def test_bf16_on_cpu(tmp_path, tokenizer):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no bf16 autocast on this CPU build")
    _, logs, _ = run(tmp_path, tokenizer, "chrf", bf16=True, use_cpu=True, rl_weight=0.5, entropy_coef=0.01,
                     kl_coef=0.1)
    assert math.isfinite(logs[-1]["loss"]) and math.isfinite(logs[-1]["rl/xe_loss"])


def test_no_secret_reaches_the_output_dir(tmp_path, tokenizer, monkeypatch):
    fake = "hf_FAKEtokenDoNotLeak1234567890abcdef"
    monkeypatch.setenv("HF_TOKEN", fake)
    trainer, _, _ = run(tmp_path, tokenizer, "chrf", hub_token=fake, save_strategy="steps", save_steps=1,
                        report_to=["tensorboard"])
    trainer.save_model()
    assert trainer.args.hub_token == fake  # still usable for push_to_hub in this process
    leaks = []
    for root, _, files in os.walk(tmp_path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                if fake.encode() in f.read():
                    leaks.append(os.path.join(root, name))
    assert (tmp_path / "out" / "README.md").exists() and (tmp_path / "out" / "checkpoint-1").exists()
    assert leaks == []


def test_module_path_reward_is_imported_only_when_named(tmp_path, tokenizer):
    import sys

    sys.modules.pop("json.tool", None)
    SCSTTrainer(model=tiny_model("t5"), args=SeqRLConfig(output_dir=str(tmp_path)), reward_funcs="bleu",
                train_dataset=toy_dataset(tokenizer, ["ab"], ["ab"]), processing_class=tokenizer)
    assert "json.tool" not in sys.modules
    with pytest.raises(ValueError, match="cannot import 'nope'"):
        SCSTTrainer(model=tiny_model("t5"), args=SeqRLConfig(output_dir=str(tmp_path)), reward_funcs="json.tool:nope",
                    train_dataset=toy_dataset(tokenizer, ["ab"], ["ab"]), processing_class=tokenizer)
    assert "json.tool" in sys.modules


@pytest.mark.parametrize("column,values,message", [
    ("sources", ["ab", "  ", "cd", "ab"], r"train_dataset row 1: 'sources' is empty"),
    ("labels", [[5, 1], [-100, -100], [6, 1], [7, 1]], r"train_dataset row 1: 'labels' is empty or all -100"),
    ("references", [["ab"], [], ["cd"], ["x"]], r"train_dataset row 1: column 'references' holds an empty list"),
    ("references", [["ab"], ["ok", ""], ["cd"], ["x"]], r"row 1: column 'references' holds a list holding an empty "
                                                        r"string"),
])
def test_bad_rows_are_named_at_construction(tmp_path, tokenizer, column, values, message):
    ds = toy_dataset(tokenizer, ["ab", "cd", "ef", "gh"], ["ab", "cd", "ef", "gh"])
    if column in ds.column_names:
        ds = ds.remove_columns(column)
    ds = ds.add_column(column, values)
    with pytest.raises(ValueError, match=message):
        SCSTTrainer(model=tiny_model("t5"), args=SeqRLConfig(output_dir=str(tmp_path)), reward_funcs="bleu",
                    train_dataset=ds, processing_class=tokenizer)


@pytest.mark.parametrize("bad,message", [
    (["ok", 3], r"references\[\d\] contains a int \(3\); references must be strings"),
    ({"text": "ok"}, r"references\[\d\] is a dict; each row must be a string or a list of strings"),
])
def test_bad_reference_types_are_named_at_collation(tmp_path, tokenizer, bad, message):
    # Arrow cannot even store such columns: they come from plain Python datasets, checked by the collator.
    rows = [dict(r) for r in toy_dataset(tokenizer, ["ab", "cd", "ef", "gh"], ["ab", "cd", "ef", "gh"])]
    for row, ref in zip(rows, ["ab", bad, "ef", "gh"]):
        row["references"] = ref
    args = SeqRLConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, report_to=[],
                       disable_tqdm=True, dataloader_pin_memory=False, max_new_tokens=4)
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs="bleu", train_dataset=rows,
                          processing_class=tokenizer)
    with pytest.raises(TypeError, match=message):
        trainer.train()


def test_remote_code_stays_off_unless_asked(tmp_path, monkeypatch):
    import transformers

    from hf_seqrl.cli.train import ScriptArguments, load_model_and_tokenizer

    calls = []

    def record(name, returned=None):
        def fake(path, **kwargs):
            calls.append((name, kwargs.get("trust_remote_code")))
            return object() if returned is None else returned
        return fake

    # The config says which Auto class loads the model (an encoder-decoder here).
    encoder_decoder = transformers.PretrainedConfig(is_encoder_decoder=True)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", record("config", encoder_decoder))
    monkeypatch.setattr(transformers.AutoModelForSeq2SeqLM, "from_pretrained", record("model"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", record("tokenizer"))
    load_model_and_tokenizer(ScriptArguments(model_name_or_path="some/model", dataset_name="wmt16"))
    assert calls == [("tokenizer", False), ("config", False), ("model", False)]
    calls.clear()
    load_model_and_tokenizer(ScriptArguments(model_name_or_path="some/model", dataset_name="wmt16",
                                             trust_remote_code=True))
    assert calls == [("tokenizer", True), ("config", True), ("model", True)]


def test_centered_advantages_have_zero_batch_mean(tmp_path, tokenizer):
    def length(predictions, references, sources=None):
        return [len(p) / 10 for p in predictions]

    # greedy baseline: sample and greedy lengths differ, so the advantages have an offset unless centered
    _, plain, _ = run(tmp_path, tokenizer, length, num_samples=1, max_steps=3, learning_rate=0.0)
    assert any(abs(h["rl/advantage_mean"]) > 1e-3 for h in plain)
    _, centered, _ = run(tmp_path, tokenizer, length, num_samples=1, max_steps=3, learning_rate=0.0,
                         center_advantages=True)
    assert all(abs(h["rl/advantage_mean"]) < 1e-6 for h in centered)
    assert [h["rl/reward"] for h in centered] == [h["rl/reward"] for h in plain]  # same rollouts, same rewards
    # dropped samples (NaN rewards) keep advantage 0 and stay out of the mean
    _, dropped, _ = run(tmp_path, tokenizer, nan_reward, baseline="mean", nonfinite_rewards="drop",
                        center_advantages=True)
    assert all(abs(h["rl/advantage_mean"]) < 1e-6 for h in dropped) and dropped[-1]["rl/nonfinite_rewards"] == 4.0
