"""`hf-seqrl diagnose` on a model that never writes EOS: each batch's decode budget follows its own references and
sources, a flag overrides it, progress is shown per decode, the outputs that never stopped are counted, and metrics
are on the 0-100 scale of `hf-seqrl evaluate`."""

import json

import pytest

from helpers import byt5_tokenizer, tiny_model
from hf_seqrl.diagnostics import format_summary, run_diagnostics
from hf_seqrl.diagnostics.measure import decode_budget
from hf_seqrl.evaluation import corpus_scores, generate_texts

SOURCES = ["abc", "abcd", "ab", "abcdefgh"]
REFERENCES = [["ab"], ["abcd"], ["a"], ["abcdefghijklmn"]]  # 2-14 letters; ByT5 adds EOS
QUICK = dict(max_horizon=4, inject_positions=(0, 2), jacobian_positions=(1,), jacobian_horizon=2, metric="chrf")


def never_ending_model():
    """A tiny Marian whose EOS logit is pushed down by 1e4: every greedy decode runs to its budget."""
    model = tiny_model("marian")
    model.final_logits_bias[0, model.config.eos_token_id] = -1e4
    return model


def test_decode_budget_by_hand():
    assert decode_budget([3, 5], ratio=2.0) == 2 * 5 + 10
    assert decode_budget([3, 5], ratio=1.5) == 8 + 10  # ceil(7.5) + 10
    assert decode_budget([3, 5], ratio=2.0, max_new_tokens=7) == 7
    assert decode_budget([300], ratio=2.0, limit=128) == 127  # the start token takes a position
    # the source caps it: references of 3 and 5 tokens, sources of at most 2 -> min(2 * 5, 2 * 2) + 10
    assert decode_budget([3, 5], ratio=2.0, source_lengths=[1, 2]) == 2 * 2 + 10
    assert decode_budget([3, 5], ratio=2.0, source_lengths=[40]) == 2 * 5 + 10  # a long source: the reference binds
    assert decode_budget([3, 5], ratio=2.0, max_new_tokens=7, source_lengths=[1]) == 7


def test_budget_follows_each_batch_and_never_stopped_outputs_are_counted(capsys):
    report = run_diagnostics(never_ending_model(), byt5_tokenizer(), SOURCES, REFERENCES, batch_size=2, **QUICK)
    # batch 1: longest reference "abcd" + EOS = 5 tokens -> 2 * 5 + 10 (its longest source, "abcd" + EOS, the same);
    # batch 2: 14 letters + EOS -> 2 * 15 + 10, capped by its longest source, 8 letters + EOS: 2 * 9 + 10
    assert report["config"]["decode_budgets"] == [20, 28]
    assert report["config"]["max_new_tokens"] is None and report["config"]["max_new_tokens_ratio"] == 2.0
    assert report["gap"]["free_length"] == (20 + 20 + 28 + 28) / 4  # each output ran to its own batch's budget
    assert report["gap"]["never_stopped"] == 4 and report["summary"]["never_stopped_rate"] == 1.0
    assert "4 of 4 greedy outputs never stopped (no EOS within 20-28 new tokens)" in format_summary(report)
    # progress: one step per decode or pass, 2 batches x (greedy decode, teacher-forced passes, 2 injections)
    err = capsys.readouterr().err
    assert "8/8" in err and "up to 28 new tokens" in err


def test_diagnose_flags_set_the_budget(tmp_path, capsys):
    from hf_seqrl.cli.diagnose import main

    folder, data = tmp_path / "model", tmp_path / "pairs.jsonl"
    never_ending_model().save_pretrained(folder)
    byt5_tokenizer().save_pretrained(folder)
    data.write_text("\n".join(json.dumps({"source": s, "target": r}) for s, r in zip(SOURCES, REFERENCES)))
    common = ["--model", str(folder), "--data", str(data), "--metric", "chrf", "--max_horizon", "3",
              "--inject_positions", "0", "--jacobian_positions", "1", "--jacobian_horizon", "2", "--batch_size", "2"]
    assert main([*common, "--output_dir", str(tmp_path / "fixed"), "--max_new_tokens", "6"]) == 0
    fixed = json.loads((tmp_path / "fixed" / "diagnostics.json").read_text())
    assert fixed["config"]["decode_budgets"] == [6, 6] and fixed["gap"]["free_length"] == 6
    assert main([*common, "--output_dir", str(tmp_path / "ratio"), "--max_new_tokens_ratio", "1"]) == 0
    ratio = json.loads((tmp_path / "ratio" / "diagnostics.json").read_text())
    assert ratio["config"]["decode_budgets"] == [5 + 10, 9 + 10]  # batch 2's source (9 tokens) caps it
    assert "4 of 4 greedy outputs never stopped" in capsys.readouterr().out
    with pytest.raises(ValueError, match="max_new_tokens_ratio must be > 0"):
        main([*common, "--max_new_tokens_ratio", "0"])


def test_diagnose_metrics_are_on_the_scale_of_evaluate():
    model, tok = never_ending_model(), byt5_tokenizer()
    outputs = generate_texts(model, tok, SOURCES, max_new_tokens=6, progress=False)
    references = [[output[:4] + "zz"] for output in outputs]  # partly right: a chrF well inside (0, 100)
    report = run_diagnostics(model, tok, SOURCES, references, max_new_tokens=6, batch_size=2, progress=False, **QUICK)
    expected = corpus_scores(outputs, references, ("chrf",))["chrf"]
    assert 1 < expected < 100
    assert report["gap"]["free_metric"] == pytest.approx(expected)
    clean = [row["clean_metric"] for row in report["recovery"]]
    assert all(0 <= value <= 100 for value in clean) and max(clean) > 1  # sentence chrF x 100
