"""Rewards as trainer arguments: keyword calls with every dataset column, `evaluate` modules as rewards and metrics,
plain serializable configs, and a tokenizer loaded from the model when `processing_class` is omitted."""

import json
import math
import pickle

import numpy as np
import pytest
from transformers.trainer_utils import EvalPrediction

from helpers import tiny_model, toy_dataset, toy_pairs
from hf_seqrl import ReinforceTrainer, SCSTTrainer, SeqRLConfig
from hf_seqrl.evaluation import build_compute_metrics
from hf_seqrl.evaluation import corpus_scores
from hf_seqrl.rewards import EvaluateReward, build_reward, get_reward

# evaluate parses a metric script's imports line by line: one `import` per line.
METRIC_SCRIPT = '''
import datasets
import evaluate


class {name}(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(description="{name}", citation="", inputs_description="", features=datasets.Features(
            {{"predictions": datasets.Value("string"), "references": {references}}}))

    def _compute(self, predictions, references):
{body}
'''
# Character-set overlap of a prediction and its (single) reference, one value per example.
PER_EXAMPLE_METRIC = METRIC_SCRIPT.format(name="CharOverlap", references='datasets.Value("string")', body="""\
        scores = [len(set(p) & set(r)) / max(len(set(p) | set(r)), 1) for p, r in zip(predictions, references)]
        return {"overlap": scores, "mean_overlap": sum(scores) / len(scores)}""")
# 1 - |len(prediction) - len(closest reference)| / len(closest reference), averaged over the corpus.
CORPUS_METRIC = METRIC_SCRIPT.format(name="LengthMatch", references='datasets.Sequence(datasets.Value("string"))',
                                     body="""\
        def match(p, refs):
            return max(1 - abs(len(p) - len(r)) / max(len(r), 1) for r in refs)

        return {"length_match": sum(match(p, r) for p, r in zip(predictions, references)) / len(predictions)}""")


def load_metric(tmp_path, name, source):
    import evaluate

    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return evaluate.load(str(path))


def overlap(a, b):
    return len(set(a) & set(b)) / max(len(set(a) | set(b)), 1)


def count_calls(module):
    calls = []
    compute = module.compute

    def counted(**kwargs):
        calls.append(len(kwargs["predictions"]))
        return compute(**kwargs)

    module.compute = counted
    return calls


def args(tmp_path, **kwargs):
    settings = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=1, learning_rate=1e-3,
                    logging_steps=1, report_to=[], save_strategy="no", max_new_tokens=6, disable_tqdm=True,
                    dataloader_pin_memory=False, seed=0)
    settings.update(kwargs)
    return SeqRLConfig(**settings)


# ---- every dataset column reaches the reward, by keyword -----------------------------------------------------------

def test_rewards_receive_every_other_column_by_keyword(tmp_path, tokenizer):
    calls = []

    def budget_reward(predictions, references, sources, **columns):
        calls.append({"predictions": list(predictions), "sources": list(sources), **columns})
        return [1.0 - abs(len(p) - b) / 10 for p, b in zip(predictions, columns["length_budget"])]

    src, tgt = toy_pairs(4, seed=3, alphabet="abcd", lengths=(2, 5))
    data = (toy_dataset(tokenizer, src, tgt).add_column("sources", src)
            .add_column("domain", ["news", "law", "news", "med"]).add_column("length_budget", [3, 4, 5, 6]))
    trainer = ReinforceTrainer(model=tiny_model("t5"), args=args(tmp_path, num_samples=2, baseline="none"),
                               reward_funcs=budget_reward, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    (call,) = calls
    assert set(call) == {"predictions", "sources", "domain", "length_budget"}  # no model inputs
    assert len(call["predictions"]) == 8
    # the rows of a batch come shuffled; the 2 samples of a source are contiguous and share its columns
    row_of = {s: i for i, s in enumerate(src)}
    for k in range(0, 8, 2):
        source = call["sources"][k]
        assert call["sources"][k + 1] == source
        assert call["domain"][k: k + 2] == [data["domain"][row_of[source]]] * 2
        assert call["length_budget"][k: k + 2] == [data["length_budget"][row_of[source]]] * 2
    assert math.isfinite(trainer.state.log_history[0]["rl/reward"])


def test_a_reward_without_kwargs_is_told_to_declare_them(tmp_path, tokenizer):
    def strict(predictions, references, sources):
        return [0.0] * len(predictions)

    src, tgt = toy_pairs(4, seed=3, alphabet="abcd", lengths=(2, 5))
    data = toy_dataset(tokenizer, src, tgt).add_column("domain", ["a", "b", "c", "d"])
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path), reward_funcs=strict, train_dataset=data,
                          processing_class=tokenizer)
    with pytest.raises(RuntimeError, match=r"reward 'strict' raised TypeError.*'domain'.*declare \*\*kwargs"):
        trainer.train()


def test_a_column_named_predictions_is_refused(tmp_path, tokenizer):
    data = toy_dataset(tokenizer, ["ab"], ["ab"]).add_column("predictions", ["x"])
    with pytest.raises(ValueError, match="column named 'predictions'.*Rename"):
        SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path), reward_funcs="bleu", train_dataset=data,
                    processing_class=tokenizer)


def test_reward_funcs_are_required_and_checked_at_construction(tmp_path, tokenizer):
    data = toy_dataset(tokenizer, ["ab"], ["ab"])
    with pytest.raises(ValueError, match="SCSTTrainer needs reward_funcs=.*'bleu'"):
        SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path), train_dataset=data, processing_class=tokenizer)
    with pytest.raises(ValueError, match="unknown reward 'blue'.*bleu, chrf"):
        SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path), reward_funcs="blue", train_dataset=data,
                    processing_class=tokenizer)
    with pytest.raises(ValueError, match="reward_weights has 2 values for 1 reward_funcs"):
        SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path, reward_weights=[0.5, 0.5]), reward_funcs="bleu",
                    train_dataset=data, processing_class=tokenizer)


def test_config_is_plain_data(tmp_path):
    config = args(tmp_path, reward_weights=[1, 3])
    assert not hasattr(config, "reward") and config.reward_weights == [1.0, 3.0]
    assert json.loads(config.to_json_string())["reward_weights"] == [1.0, 3.0]
    assert pickle.loads(pickle.dumps(config)).reward_weights == [1.0, 3.0]
    with pytest.raises(ValueError, match=r"SeqRLConfig.reward_weights=\[nan\]"):
        args(tmp_path, reward_weights=[math.nan])


# ---- evaluate modules as rewards --------------------------------------------------------------------------------

PREDS = ["abc", "abd", "cd"]
REFS = [["abc", "xyz"], ["bd"], ["dc", "cccc"]]


def test_evaluate_module_with_per_example_outputs_is_one_call(tmp_path):
    module = load_metric(tmp_path, "char_overlap", PER_EXAMPLE_METRIC)
    calls = count_calls(module)
    reward = EvaluateReward(module, key="overlap")
    values = reward(predictions=PREDS, references=REFS)
    # single-reference features: every (prediction, reference) pair in one call, the best reference counts
    assert calls == [5]
    assert values == pytest.approx([max(overlap(p, r) for r in refs) for p, refs in zip(PREDS, REFS)])
    assert values == pytest.approx([1.0, 2 / 3, 1.0])


def test_evaluate_module_with_a_corpus_score_is_called_per_prediction(tmp_path):
    module = load_metric(tmp_path, "length_match", CORPUS_METRIC)
    calls = count_calls(module)
    reward = build_reward(module)  # a bare module is wrapped; its only numeric output is the reward
    values = reward(predictions=PREDS, references=REFS)
    # a sequence `references` feature: all references at once; the first call finds no per-example output
    assert calls == [3, 1, 1, 1]
    expected = [max(1 - abs(len(p) - len(r)) / len(r) for r in refs) for p, refs in zip(PREDS, REFS)]
    assert values == pytest.approx(expected) and values == pytest.approx([1.0, 0.5, 1.0])
    reward(predictions=PREDS, references=REFS)
    assert calls[4:] == [1, 1, 1]  # the choice is kept: no corpus call any more


def test_evaluate_module_with_several_outputs_needs_a_key(tmp_path):
    module = load_metric(tmp_path, "char_overlap", PER_EXAMPLE_METRIC)
    # "overlap" is the only per-example output: chosen without a key
    assert EvaluateReward(module)(predictions=["ab"], references=[["ab"]]) == [1.0]
    with pytest.raises(KeyError, match="no output 'f1'.*mean_overlap"):
        EvaluateReward(module, key="f1")(predictions=["ab"], references=[["ab"]])


def test_evaluate_module_trains_next_to_a_builtin(tmp_path, tokenizer):
    module = load_metric(tmp_path, "char_overlap", PER_EXAMPLE_METRIC)
    src, tgt = toy_pairs(8, seed=0, alphabet="abcd", lengths=(2, 5))
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path, max_steps=2, reward_weights=[0.5, 0.5]),
                          reward_funcs=[EvaluateReward(module, key="overlap"), "chrf"],
                          train_dataset=toy_dataset(tokenizer, src, tgt), processing_class=tokenizer)
    trainer.train()
    rewards = [h["rl/reward"] for h in trainer.state.log_history if "rl/reward" in h]
    assert len(rewards) == 2 and all(0.0 <= r <= 1.0 for r in rewards)
    assert trainer.reward_label == "0.5*char_overlap:overlap+0.5*chrf_reward"


# ---- compute_metrics for evaluation ------------------------------------------------------------------------------

def test_compute_metrics_takes_builtin_names_and_modules(tmp_path, tokenizer):
    module = load_metric(tmp_path, "length_match", CORPUS_METRIC)
    texts, refs = ["abc", "abd", "cd"], [["abc", "xyz"], ["bd"], ["dc", "cccc"]]
    ids = np.array(tokenizer(texts, padding=True)["input_ids"])
    ids[0, -1] = -100  # generation pads with -100 across processes
    prediction = EvalPrediction(predictions=ids, label_ids=None)
    scores = build_compute_metrics(tokenizer, ["bleu", "chrf", module], refs)(prediction)
    assert {k: scores[k] for k in ("bleu", "chrf")} == corpus_scores(texts, refs, ("bleu", "chrf"))
    assert scores["length_match"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert scores["gen_len"] > 0
    # without references: the decoded labels are the single reference
    labels = np.array(tokenizer(["abc", "bd", "dc"], padding=True)["input_ids"])
    labels[labels == tokenizer.pad_token_id] = -100
    scores = build_compute_metrics(tokenizer, ["chrf"])(EvalPrediction(predictions=ids, label_ids=labels))
    assert scores["chrf"] == corpus_scores(texts, [["abc"], ["bd"], ["dc"]], ("chrf",))["chrf"]
    with pytest.raises(ValueError, match="unknown metric 'blue'"):
        build_compute_metrics(tokenizer, ["blue"])


def test_builtin_rewards_are_called_by_keyword_too():
    by_position = get_reward("bleu")(PREDS, REFS)
    assert get_reward("bleu")(predictions=PREDS, references=REFS, sources=None, domain=["x"] * 3) == by_position


# ---- processing_class may be omitted ---------------------------------------------------------------------------

def test_tokenizer_is_loaded_from_the_model_folder(tmp_path, tokenizer):
    from transformers import AutoModelForSeq2SeqLM

    folder = tmp_path / "model"
    tiny_model("t5").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    src, tgt = toy_pairs(4, seed=1, alphabet="abcd", lengths=(2, 5))
    trainer = SCSTTrainer(model=model, args=args(tmp_path), reward_funcs="chrf",
                          train_dataset=toy_dataset(tokenizer, src, tgt))
    assert type(trainer.processing_class).__name__ == type(tokenizer).__name__
    trainer.train()
    assert any("rl/reward" in h for h in trainer.state.log_history)


def test_missing_tokenizer_says_what_to_pass(tmp_path, tokenizer):
    data = toy_dataset(tokenizer, ["ab"], ["ab"])
    with pytest.raises(ValueError, match="no name_or_path.*pass processing_class="):
        SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path), reward_funcs="bleu", train_dataset=data)
    model = tiny_model("t5")
    model.config._name_or_path = str(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="no tokenizer could be loaded.*nowhere.*AutoTokenizer.from_pretrained"):
        SCSTTrainer(model=model, args=args(tmp_path), reward_funcs="bleu", train_dataset=data)


def test_logs_name_the_algorithm_that_ran(tmp_path, tokenizer):
    import logging

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    src, tgt = toy_pairs(4, seed=1, alphabet="abcd", lengths=(2, 5))
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path, baseline="mean", num_samples=2, log_level="info"),
                          reward_funcs="chrf", train_dataset=toy_dataset(tokenizer, src, tgt), processing_class=tokenizer)
    assert trainer.method.name == "REINFORCE with leave-one-out baseline"
    records, handler = [], Keep()
    logging.getLogger("hf_seqrl").addHandler(handler)
    try:
        trainer.train()
    finally:
        logging.getLogger("hf_seqrl").removeHandler(handler)
    assert "SCSTTrainer: REINFORCE with leave-one-out baseline, reward chrf_reward" in records


# A COMET-style metric: it reads the source too. 1 when the prediction shares a character with its source, else 0.
SOURCE_METRIC = '''
import datasets
import evaluate


class SourceOverlap(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(description="SourceOverlap", citation="", inputs_description="",
                                   features=datasets.Features({"sources": datasets.Value("string"),
                                                               "predictions": datasets.Value("string"),
                                                               "references": datasets.Value("string")}))

    def _compute(self, sources, predictions, references):
        return {"scores": [float(bool(set(s) & set(p))) for s, p in zip(sources, predictions)]}
'''


def test_an_evaluate_module_with_a_sources_feature_receives_the_sources(tmp_path):
    reward = EvaluateReward(load_metric(tmp_path, "source_overlap", SOURCE_METRIC))
    assert reward.takes_sources
    assert reward(["ab", "cd", "ab"], [["x"], ["y"], ["z", "w"]], sources=["a", "a", "xyz"]) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="reads sources"):
        reward(["ab"], [["x"]], sources=None)
