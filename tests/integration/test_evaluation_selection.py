"""A trainer's own evaluation decoded by MBR or QE (`generation_selection`): its predictions are each source's pick,
the same as `generate_texts(decode=...)` gives; the selection is saved in `seqrl_run.json` and on the card, whose code
decodes that way, and `hf-seqrl evaluate` reuses it unless told otherwise."""

import json
import re

import numpy as np
import pytest

from helpers import byt5_tokenizer, make_config, text_pairs, tiny_causal_model, tiny_model
from hf_seqrl.cli import main
from hf_seqrl.evaluation import RUN_SETTINGS_FILE, generate_texts

MBR_BEAM = {"decode": "mbr", "candidates": "beam", "num_candidates": 4, "utility": "chrf"}


def build(tmp_path, family, selection, **kwargs):
    from hf_seqrl import SCSTTrainer, SeqRLConfig

    causal = family == "causal"
    tok = byt5_tokenizer()
    model = tiny_causal_model("llama", dropout=0.1) if causal else tiny_model("t5", seed=1, dropout=0.1)
    args = make_config(SeqRLConfig, tmp_path, max_steps=1, predict_with_generate=True, generation_max_length=8,
                       per_device_eval_batch_size=3, generation_selection=selection, seed=7, **kwargs)
    data = text_pairs(causal, n=7, seed=3)
    trainer = SCSTTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=data, eval_dataset=data,
                          processing_class=tok)
    return trainer, tok, data


def predicted_texts(trainer, tok) -> list[str]:
    ids = trainer.predict(trainer.eval_dataset).predictions
    return [t.strip() for t in tok.batch_decode(np.where(ids < 0, tok.pad_token_id, ids), skip_special_tokens=True)]


def source_texts(data) -> list[str]:
    return list(data["prompt" if "prompt" in data.column_names else "source"])


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
def test_evaluation_by_mbr_predicts_each_sources_pick_and_is_saved_for_evaluate_and_the_card(family, tmp_path):
    trainer, tok, data = build(tmp_path, family, dict(MBR_BEAM))
    model, sources = trainer.model, source_texts(data)
    predictions = predicted_texts(trainer, tok)
    expected = generate_texts(model, tok, sources, max_length=8, **MBR_BEAM)
    assert predictions == expected
    greedy = generate_texts(model, tok, sources, max_length=8)
    assert predictions != greedy  # the picks, not the greedy decode the evaluation would give without the selection
    metrics = trainer.evaluate()
    assert "eval_chrf" not in metrics and "eval_loss" in metrics  # no compute_metrics: the loss, as without MBR

    trainer.save_model()
    out = tmp_path / "out"
    saved = json.loads((out / RUN_SETTINGS_FILE).read_text())["generation_selection"]
    assert saved == {**MBR_BEAM, "qe_reward": None, "epsilon_cutoff": None, "seed": None}  # beam: no draws
    card = (out / "README.md").read_text()
    assert "generation_selection" in card and "MBR over 4 beam (chrf)" in card
    blocks = re.findall(r"```python\n(.*?)```", card, re.DOTALL)
    namespace: dict = {}
    exec(compile(blocks[0].replace('"out"', f'"{out}"'), "card", "exec"), namespace)
    exec(compile(blocks[1].replace("print(outputs[0])", ""), "card selection", "exec"), namespace)
    assert namespace["outputs"] == [predictions[0]]  # the card's code decodes the first source as the evaluation did

    path = tmp_path / "data.jsonl"
    with open(path, "w") as f:
        for source, target in zip(sources, data["completion" if family == "causal" else "target"]):
            f.write(json.dumps({"source": source, "target": target}) + "\n")
    files = ["--predictions", str(tmp_path / "p.jsonl"), "--output", str(tmp_path / "s.json")]
    assert main(["evaluate", "--model", str(out), "--data", str(path), *files]) == 0
    scores = json.loads((tmp_path / "s.json").read_text())
    rows = [json.loads(line)["prediction"] for line in open(tmp_path / "p.jsonl")]
    assert rows == predictions and "selection" in scores["from_run_settings"]
    assert scores["decoding"] == "mbr, 4-best beam, chrf"
    assert main(["evaluate", "--model", str(out), "--data", str(path), "--num_beams", "1", *files]) == 0
    assert [json.loads(line)["prediction"] for line in open(tmp_path / "p.jsonl")] == greedy  # the flag wins


def test_evaluation_by_qe_picks_the_best_scored_sample_and_draws_the_same_samples_each_time(tmp_path):
    import helpers

    trainer, tok, data = build(tmp_path, "seq2seq", {"decode": "qe", "num_candidates": 5,
                                                     "qe_reward": "helpers:recording_length_qe"})
    helpers.QE_CALLS.clear()
    predictions = predicted_texts(trainer, tok)
    seen = list(helpers.QE_CALLS)
    assert len(seen) == 5 * len(data)
    by_source: dict[str, list[str]] = {}
    for source, candidate in seen:
        by_source.setdefault(source, []).append(candidate)
    assert sorted(by_source) == sorted(data["source"])  # the QE reward read each row's source text
    picks = [max(by_source[s], key=len) for s in data["source"]]
    assert predictions == picks
    assert any(len(set(c)) > 1 for c in by_source.values())  # samples, not one decode repeated
    assert predicted_texts(trainer, tok) == predictions  # each evaluation draws with the selection's seed
    assert trainer.eval_selection.decoding.seed == 7  # the run's seed when the selection names none


@pytest.mark.parametrize("selection, kwargs, message", [
    ({"decode": "mbr", "num_candidates": 1}, {}, "generation_selection=.*num_candidates must be >= 2"),
    ({"decode": "mbr", "samples": 8}, {}, r"generation_selection: unknown key\(s\) \['samples'\]"),
    ({"decode": "qe"}, {}, "generation_selection=.*needs qe_reward"),
    (dict(MBR_BEAM), {"generation_num_beams": 4}, "leave generation_num_beams unset"),
])
def test_a_wrong_evaluation_selection_is_refused_when_the_trainer_is_built(tmp_path, selection, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build(tmp_path, "seq2seq", selection, **kwargs)


def test_generation_selection_reads_json_and_refuses_what_is_not_plain_data(tmp_path):
    from hf_seqrl import SeqRLConfig

    args = make_config(SeqRLConfig, tmp_path, generation_selection='{"decode": "mbr", "num_candidates": 8}')
    assert args.generation_selection == {"decode": "mbr", "num_candidates": 8}
    with pytest.raises(ValueError, match="generation_selection='mbr' is not a JSON object"):
        make_config(SeqRLConfig, tmp_path, generation_selection="mbr")
    with pytest.raises(ValueError, match=r"generation_selection\['qe_reward'\]=.*'module:function'"):
        make_config(SeqRLConfig, tmp_path, generation_selection={"decode": "qe", "qe_reward": len})


def test_train_cli_evaluates_by_mbr_and_saves_the_selection(tmp_path, monkeypatch, capsys):
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.chdir(root)  # the tiny config names its data files relative to the repository
    config = os.path.join("recipes", "configs", "tiny_offline_translation.yaml")
    selection = '{"decode": "mbr", "candidates": "beam", "num_candidates": 2}'
    common = ["train", "--config", config, "--max_steps", "1", "--warmup_xe_steps", "1", "--max_train_samples", "8",
              "--max_eval_samples", "4", "--test_file", "", "--eval_strategy", "no", "--tiny_d_model", "32",
              "--predict_with_generate", "--generation_selection", selection]
    assert main([*common, "--output_dir", str(tmp_path / "bad"), "--eval_num_beams", "4"]) == 2
    assert "--eval_num_beams 4 asks the final evaluation for beam search" in capsys.readouterr().err
    assert main([*common, "--output_dir", str(tmp_path / "out")]) == 0
    saved = json.loads((tmp_path / "out" / RUN_SETTINGS_FILE).read_text())
    assert saved["generation_selection"]["decode"] == "mbr" and saved["generation_selection"]["num_candidates"] == 2
    results = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert "eval_bleu" in results and "MBR over 2 beam (chrf)" in (tmp_path / "out" / "README.md").read_text()
