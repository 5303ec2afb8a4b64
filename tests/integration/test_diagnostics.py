"""Exposure-bias diagnostics on tiny models: report, horizon semantics, recovery, the gold among several references,
plot, data files, CLI, callback."""

import glob
import json
import os

import pytest
import torch

from helpers import REPO, SHARED_DATA, byt5_tokenizer, tiny_model, toy_dataset, toy_pairs
from hf_seqrl.data import load_pairs
from hf_seqrl.cli.diagnose import main as diagnose_main
from hf_seqrl.diagnostics import DiagnosticsCallback, format_summary, run_diagnostics, write_report
from hf_seqrl.diagnostics.measure import closest_references, rejoin_delay
from hf_seqrl.models.tokens import decoder_start_id

SMALL = dict(max_horizon=6, inject_positions=(0, 1, 3), max_new_tokens=8, batch_size=8, progress=False)
ROW_KEYS = {"k", "tf_accuracy", "tf_nll", "free_accuracy", "free_nll", "count"}


@pytest.fixture(scope="module")
def copy_model():
    """A tiny T5 after 200 teacher-forced Adam steps on copying 2-5 letter strings (held-out token accuracy ~0.88).

    Seeds 0-4 all learn (recovery rate 0.23-0.64 against 0 for the untrained model); seed 1 learns the most.
    """
    tok = byt5_tokenizer()
    model = tiny_model("t5", seed=1)
    sources, targets = toy_pairs(3200, seed=0, alphabet="abcd", lengths=(2, 5))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(200):
        batch = slice(16 * step, 16 * step + 16)
        enc = tok(sources[batch], return_tensors="pt", padding=True)
        labels = tok(text_target=targets[batch], return_tensors="pt", padding=True)["input_ids"]
        loss = model(**enc, labels=labels.masked_fill(labels == tok.pad_token_id, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


@pytest.fixture(scope="module")
def heldout():
    return toy_pairs(32, seed=99, alphabet="abcd", lengths=(2, 5))


@pytest.fixture(scope="module")
def random_report(heldout):
    model = tiny_model("t5")
    model.train()
    report = run_diagnostics(model, byt5_tokenizer(), *heldout, metric="chrf", **SMALL)
    assert model.training  # train mode restored
    return report


# ---- report structure and invariants --------------------------------------------------------------------------

def test_report_keys_json_and_ranges(random_report):
    assert set(random_report) == {"gap", "horizon", "recovery", "summary", "config", "gold_index", "jacobian"}
    assert json.loads(json.dumps(random_report, allow_nan=False)) == random_report
    assert {"tf_nll", "free_metric", "horizon_gap", "recovery_rate"} <= set(random_report["summary"])
    gap = random_report["gap"]
    assert gap["num_examples"] == 32 and gap["metric"] == "chrf" and gap["tf_nll"] > 0
    # 2-5 letters + EOS per target: the gold length bounds the horizon
    assert [row["k"] for row in random_report["horizon"]] == list(range(6))
    counts = [row["count"] for row in random_report["horizon"]]
    assert counts[0] == 32 and counts == sorted(counts, reverse=True)
    for row in random_report["horizon"]:
        assert set(row) == ROW_KEYS
        assert 0.0 <= row["tf_accuracy"] <= 1.0 and 0.0 <= row["free_accuracy"] <= 1.0
        assert row["tf_nll"] >= 0 and row["free_nll"] >= 0
    assert [row["j"] for row in random_report["recovery"]] == [0, 1, 3]
    # position 3 exists only in targets of 4-5 letters; the others in every target
    assert random_report["recovery"][0]["count"] == 32 > random_report["recovery"][2]["count"] > 0
    for row in random_report["recovery"]:
        assert 0.0 <= row["recovery_rate"] <= 1.0


@pytest.mark.parametrize("arch", ["t5", "bart", "marian"])
def test_horizon_zero_curves_coincide(arch, heldout):
    report = run_diagnostics(tiny_model(arch), byt5_tokenizer(), heldout[0][:8], heldout[1][:8], **SMALL)
    first = report["horizon"][0]
    assert first["k"] == 0 and first["count"] == 8
    # both prefixes are empty at k = 0: same logits, bit for bit
    assert first["tf_nll"] == first["free_nll"] and first["tf_accuracy"] == first["free_accuracy"]


def test_free_curve_equals_one_forward_per_greedy_prefix(copy_model, heldout):
    """The batched free-running curve equals, per k, a separate forward over [start] + greedy[:k]."""
    tok, sources, targets = byt5_tokenizer(), heldout[0][:12], heldout[1][:12]
    report = run_diagnostics(copy_model, tok, sources, targets, **SMALL)
    start, sums = decoder_start_id(copy_model), {}
    with torch.no_grad():
        for source, target in zip(sources, targets):
            enc = tok([source], return_tensors="pt")
            greedy = copy_model.generate(**enc, do_sample=False, num_beams=1, max_new_tokens=8)[0, 1:].tolist()
            greedy_length = greedy.index(1) if 1 in greedy else len(greedy)  # tokens before EOS (id 1)
            gold = tok(text_target=target)["input_ids"]
            for k in range(min(len(gold), 6, greedy_length + 1)):
                logits = copy_model(**enc, decoder_input_ids=torch.tensor([[start] + greedy[:k]])).logits[0, -1]
                nll = -torch.log_softmax(logits, -1)[gold[k]].item()
                total, count = sums.get(k, (0.0, 0))
                sums[k] = (total + nll, count + 1)
    for row in report["horizon"]:
        total, count = sums[row["k"]]
        assert row["count"] == count
        assert row["free_nll"] == pytest.approx(total / count, abs=1e-4)


def test_source_gap_equals_separate_forwards_with_the_next_source(copy_model, heldout):
    """source_nll_gap: gold NLL per token with the next source of the batch minus with its own, one forward each."""
    tok, sources, targets = byt5_tokenizer(), heldout[0][:5], heldout[1][:5]
    report = run_diagnostics(copy_model, tok, sources, targets, **SMALL)
    gap = tokens = 0.0
    with torch.no_grad():
        for i, target in enumerate(targets):
            labels = tok(text_target=[target], return_tensors="pt")["input_ids"]
            for source, sign in ((sources[(i + 1) % 5], 1), (sources[i], -1)):
                loss = copy_model(**tok([source], return_tensors="pt"), labels=labels).loss.item()
                gap += sign * loss * labels.shape[1]
            tokens += labels.shape[1]
    assert report["summary"]["source_nll_gap"] == pytest.approx(gap / tokens, abs=1e-4)
    # a copying model leans on its source; the distinct rate counts different greedy outputs
    assert report["summary"]["source_nll_gap"] > 1.0
    greedy = {tok.decode(copy_model.generate(**tok([s], return_tensors="pt"), do_sample=False, num_beams=1,
                                             max_new_tokens=8)[0], skip_special_tokens=True) for s in sources}
    assert report["summary"]["distinct_rate"] == len(greedy) / 5


def test_source_gap_needs_two_sources_per_batch(copy_model, heldout):
    report = run_diagnostics(copy_model, byt5_tokenizer(), heldout[0][:3], heldout[1][:3],
                             **{**SMALL, "batch_size": 1})
    assert report["summary"]["source_nll_gap"] is None and report["summary"]["distinct_rate"] > 0


def test_rejoin_delay_definition():
    gold = [10, 11, 12, 13, 14, 15, 1]  # EOS = 1
    # wrong token at j=1; substitution: continues with gold[2:] at once
    assert rejoin_delay([12, 13, 14, 15, 1], gold, j=1, window=4) == 0
    # insertion: re-emits gold[1] and continues
    assert rejoin_delay([11, 12, 13, 14, 15, 1], gold, j=1, window=4) == 0
    # two-token detour, then back on gold[2:]
    assert rejoin_delay([99, 98, 12, 13, 14, 15, 1], gold, j=1, window=4) == 2
    # a 3-token match is not enough with window 4, and drifting away never rejoins
    assert rejoin_delay([12, 13, 14, 99, 1], gold, j=1, window=4) is None
    assert rejoin_delay([99, 99, 99], gold, j=1, window=4) is None
    # near the end the window shrinks to what is left after j: here only EOS
    assert rejoin_delay([99, 1], gold, j=5, window=4) == 1
    # gold tokens before j do not count
    assert rejoin_delay([10, 11, 12], [10, 11, 12, 13, 1], j=3, window=2) is None


# ---- learning shows: a copy model recovers, a random one does not ---------------------------------------------

def test_trained_copy_model_recovers_more_than_random(copy_model, heldout, random_report):
    report = run_diagnostics(copy_model, byt5_tokenizer(), *heldout, metric="chrf", **SMALL)
    trained, random = report["summary"], random_report["summary"]
    assert trained["tf_accuracy"] > random["tf_accuracy"] + 0.3
    assert trained["free_metric"] > random["free_metric"] + 10  # chrF, 0-100
    assert trained["recovery_rate"] > random["recovery_rate"] + 0.2, (trained, random)
    assert trained["recovery_delay"] is not None and trained["recovery_delay"] >= 0
    # an injected mistake costs the copy model chrF against its clean decode from the same gold prefix
    assert trained["metric_drop"] > 0


# ---- several references: the gold is the one closest to the model's own output ---------------------------------

def test_closest_references_scores_each_reference_alone_and_breaks_ties_to_the_first():
    calls = []

    def shared_letters(*, predictions, references, sources):  # keyword-only: called as rewards are
        calls.append(list(predictions))
        return [len(set(p) & set(refs[0])) for p, refs in zip(predictions, references)]

    rows = [["xbc", "abz", "abc"], ["q", "r"], ["only"]]
    # "abc" shares 2, 2, 3 letters: the third; "xyz" shares none with either: a tie, the first; one reference: 0
    assert closest_references(["abc", "xyz", "ab"], rows, shared_letters) == [2, 0, 0]
    assert calls == [["abc", "abc", "abc", "xyz", "xyz"]]  # one call, rows of one reference not scored
    assert closest_references(["a"], [["a"]], shared_letters) == [0] and len(calls) == 1


def test_gold_is_the_reference_the_model_writes(copy_model, heldout):
    """Two dialects per row: A = the string in capitals (never written by the copy model), B = the copy.

    The first-reference rule scored teacher forcing against A: nearly every token wrong, while the free-running
    metric against both references says the model is right. The closest reference is B on every row, and the report
    equals that of a run given B alone, whatever the order of the references.
    """
    tok, (sources, copies) = byt5_tokenizer(), heldout
    capitals = [c.upper() for c in copies]
    kwargs = {**SMALL, "metric": "chrf"}  # single-word strings: corpus BLEU has no 2-grams to count
    both = run_diagnostics(copy_model, tok, sources, [[a, b] for a, b in zip(capitals, copies)], **kwargs)
    first_only = run_diagnostics(copy_model, tok, sources, [[a] for a in capitals], **kwargs)
    copy_only = run_diagnostics(copy_model, tok, sources, [[b] for b in copies], **kwargs)
    swapped = run_diagnostics(copy_model, tok, sources, [[b, a] for a, b in zip(capitals, copies)], **kwargs)

    # the old rule's contradiction: teacher forcing gets almost no token right (0.04), free running scores 71
    assert first_only["summary"]["tf_accuracy"] < 0.15 and both["summary"]["free_metric"] > 60
    assert both["gold_index"] == [1] * 32 and both["gap"]["gold_not_first"] == 32
    assert swapped["gold_index"] == [0] * 32 and swapped["gap"]["gold_not_first"] == 0
    assert both["config"]["gold"] == "closest reference to the greedy output under chrf (ties: the first)"
    for report in (both, swapped):
        assert {k: report[k] for k in ("horizon", "recovery", "summary")} == \
            {k: copy_only[k] for k in ("horizon", "recovery", "summary")}
    # teacher forcing now agrees with free running that the model copies well (0.88 token accuracy)
    assert both["summary"]["tf_accuracy"] > 0.8
    assert "not the first reference in 32 of 32 rows" in format_summary(both)


# ---- outputs: plot, files, data, CLI, callback -----------------------------------------------------------------

@pytest.mark.slow
def test_importing_the_package_leaves_matplotlib_unloaded():
    import subprocess
    import sys

    code = "import sys, hf_seqrl.diagnostics; print('matplotlib' in sys.modules)"
    root = str(REPO)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.stdout.strip() == "False"


def test_write_report_json_and_png(random_report, tmp_path):
    paths = write_report(random_report, str(tmp_path / "diag"))
    with open(paths["json"]) as f:
        assert json.load(f) == random_report
    with open(paths["png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(paths["png"]) > 10_000


def test_load_pairs_json_lines_lists_csv_tsv(tmp_path):
    rows = [{"source": ["First sentence.", "Second one."], "target": ["tldr a", "tldr b"]},
            {"source": "plain source", "target": "one ref"}]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    sources, references = load_pairs(str(jsonl))
    assert sources == ["First sentence. Second one.", "plain source"]
    assert references == [["tldr a", "tldr b"], ["one ref"]]
    as_list = tmp_path / "d.json"
    as_list.write_text(json.dumps(rows))
    assert load_pairs(str(as_list), max_examples=1) == (sources[:1], references[:1])
    (tmp_path / "d.csv").write_text('src,tgt\nhello,bonjour\n"a, b",c\n')
    assert load_pairs(str(tmp_path / "d.csv"), "src", "tgt") == (["hello", "a, b"], [["bonjour"], ["c"]])
    (tmp_path / "d.tsv").write_text("src\ttgt\nhello\tbonjour\n")
    assert load_pairs(str(tmp_path / "d.tsv"), "src", "tgt") == (["hello"], [["bonjour"]])
    (tmp_path / "d.txt").write_text("hello\tbonjour\tsalut\n")
    assert load_pairs(str(tmp_path / "d.txt")) == (["hello"], [["bonjour", "salut"]])
    with pytest.raises(ValueError, match=r"no column 'summary'; available columns: src, tgt\. Set --target_column"):
        load_pairs(str(tmp_path / "d.csv"), "src", "summary")
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="Cannot read .*d.parquet.*use one of"):
        load_pairs(str(tmp_path / "d.parquet"))
    (tmp_path / "bad.jsonl").write_text('{"source": "a", "target": "b"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl.*as json.*give one JSON object per line"):
        load_pairs(str(tmp_path / "bad.jsonl"))


@pytest.mark.skipif(not os.path.exists(os.path.join(SHARED_DATA, "scitldr", "dev.jsonl")),
                    reason="../shared/data/scitldr is absent")
def test_load_pairs_reads_scitldr():
    sources, references = load_pairs(os.path.join(SHARED_DATA, "scitldr", "dev.jsonl"), max_examples=20)
    assert len(sources) == 20 and all(isinstance(s, str) and len(s) > 100 for s in sources)
    assert any(len(refs) > 1 for refs in references)  # dev has several TL;DRs per paper


def test_errors_are_clear(heldout):
    model, tok = tiny_model("t5"), byt5_tokenizer()
    with pytest.raises(ValueError, match="metric='meteor'"):
        run_diagnostics(model, tok, *heldout, metric="meteor")
    with pytest.raises(ValueError, match="2 sources but 3 reference rows"):
        run_diagnostics(model, tok, ["a", "b"], ["a", "b", "c"])


def test_callback_adds_eval_diag_metrics(tmp_path, heldout):
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    tok, model = byt5_tokenizer(), tiny_model("t5")
    sources, targets = heldout[0][:8], heldout[1][:8]
    callback = DiagnosticsCallback(tok, sources, targets, every=2, **SMALL)
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=8, report_to=[],
                                    disable_tqdm=True, dataloader_pin_memory=False)
    trainer = Seq2SeqTrainer(model=model, args=args, eval_dataset=toy_dataset(tok, sources, targets),
                             data_collator=DataCollatorForSeq2Seq(tok, model=model), callbacks=[callback])
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics and metrics["eval_diag/tf_nll"] == callback.last_report["summary"]["tf_nll"]
    assert {"eval_diag/free_metric", "eval_diag/recovery_rate", "eval_diag/horizon_gap"} <= set(metrics)
    assert "eval_diag/tf_nll" in trainer.state.log_history[-1] and "eval_loss" in trainer.state.log_history[-1]
    first = callback.last_report
    assert not any(k.startswith("eval_diag/") for k in trainer.evaluate())  # every=2: skipped
    assert callback.last_report is first
    assert "eval_diag/tf_nll" in trainer.evaluate()


def test_bound_callback_reaches_tensorboard(tmp_path, heldout):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hf_seqrl import SCSTTrainer, SeqRLConfig

    tok, model = byt5_tokenizer(), tiny_model("t5")
    sources, targets = heldout[0][:8], heldout[1][:8]
    callback = DiagnosticsCallback(tok, sources, targets, **SMALL)
    args = SeqRLConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=8,
                       max_steps=2, eval_strategy="steps", eval_steps=2, logging_steps=1, report_to=["tensorboard"],
                       save_strategy="no", disable_tqdm=True, dataloader_pin_memory=False, max_new_tokens=6)
    data = toy_dataset(tok, sources, targets)
    trainer = SCSTTrainer(model=model, args=args, reward_funcs="bleu", train_dataset=data, eval_dataset=data,
                          processing_class=tok)
    trainer.add_callback(callback)
    assert callback.trainer is trainer  # hf-seqrl trainers bind it
    trainer.train()
    events = glob.glob(str(tmp_path / "runs" / "*" / "events.out.tfevents.*"))
    tags = EventAccumulator(os.path.dirname(events[0])).Reload().Tags()["scalars"]
    assert {"eval/diag/tf_nll", "eval/diag/free_metric", "eval/loss", "train/rl/reward"} <= set(tags), tags


def out_of(report):
    return {key for key, value in report["summary"].items() if value is not None}


def test_diagnose_main_writes_report(copy_model, tmp_path, capsys):
    model_dir, data = tmp_path / "model", tmp_path / "pairs.jsonl"
    copy_model.save_pretrained(model_dir)
    byt5_tokenizer().save_pretrained(model_dir)
    sources, targets = toy_pairs(12, seed=5, alphabet="abcd", lengths=(2, 5))
    data.write_text("\n".join(json.dumps({"text": s, "summary": [t]}) for s, t in zip(sources, targets)))
    status = diagnose_main(["--model", str(model_dir), "--data", str(data), "--source_column", "text",
                            "--target_column", "summary", "--output_dir", str(tmp_path / "out"), "--max_examples",
                            "10", "--metric", "chrf", "--max_horizon", "5", "--batch_size", "4",
                            "--jacobian_positions", "1", "3", "--jacobian_horizon", "3"])
    assert status == 0
    with open(tmp_path / "out" / "diagnostics.json") as f:
        report = json.load(f)
    assert report["config"]["num_examples"] == report["config"]["max_examples"] == 10
    assert report["config"]["metric"] == "chrf" and report["config"]["max_horizon"] == 5
    assert report["jacobian"]["positions"] == [1, 3] and report["jacobian"]["horizon"] == 3
    assert "jacobian_growth" in out_of(report)
    assert os.path.getsize(tmp_path / "out" / "diagnostics.png") > 10_000
    out = capsys.readouterr().out
    assert "recovery_rate" in out and "diagnostics.json" in out
    assert "gold target: closest reference to the greedy output under chrf" in out


# ---- the empirical Jacobian -------------------------------------------------------------------------------------

def test_growth_factor_by_hand():
    from hf_seqrl.diagnostics.jacobian import growth_factor

    # curve 0: divergence 1, 2, 4 -> steps x2, x2; curve 1: 1, 0.5, (end) -> step x0.5
    log_d = torch.tensor([[1.0, 2.0, 4.0], [1.0, 0.5, 7.0]]).log()
    valid = torch.tensor([[True, True, True], [True, True, False]])
    # geometric mean of (2, 2, 0.5) = (2 * 2 * 0.5) ** (1/3) = 2 ** (1/3)
    assert growth_factor(log_d, valid) == pytest.approx(2 ** (1 / 3))
    assert growth_factor(log_d, torch.tensor([[True, False, True], [False, False, False]])) is None


@pytest.mark.parametrize("arch", ["t5", "bart", "marian"])
def test_jacobian_curves_equal_an_explicit_perturbed_forward(arch, heldout):
    from hf_seqrl.diagnostics.jacobian import jacobian_curves, perturbation_directions
    from hf_seqrl.models import family_for
    from hf_seqrl.models.tokens import pad_id, shift_right

    tok, model = byt5_tokenizer(), tiny_model(arch, seed=4).eval()
    enc = dict(tok(heldout[0][:3], return_tensors="pt", padding=True))
    greedy = torch.tensor([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0], [11, 12, 13, 1, 0]])  # own outputs, EOS 1
    lengths = torch.tensor([5, 3, 4])
    positions, horizon, epsilon = [1, 2], 2, 1e-3
    with torch.no_grad():
        encoded = family_for(model).encode(model, enc)  # the encoder output and the attention mask
        log_d, valid = jacobian_curves(model, enc, encoded, greedy, lengths, positions, horizon, epsilon,
                                       torch.Generator().manual_seed(7))
        directions = perturbation_directions((3, 2, model.config.d_model), torch.Generator().manual_seed(7))
        rows = shift_right(greedy, decoder_start_id(model), pad_id(model))
        embeds = model.get_decoder().get_input_embeddings()(rows).double()

        def hidden(inputs_embeds):
            return model(encoder_outputs=encoded["encoder_outputs"], attention_mask=enc["attention_mask"],
                         decoder_inputs_embeds=inputs_embeds.float(), output_hidden_states=True,
                         use_cache=False).decoder_hidden_states[-1].double()

        clean = hidden(embeds)
        for b in range(3):
            for i, k in enumerate(positions):
                eps = directions[b, i] * epsilon * embeds[b, k].norm()
                moved = embeds.clone()
                moved[b, k] += eps
                diff = (hidden(moved) - clean)[b].norm(dim=-1) / eps.norm()
                for h in range(horizon + 1):
                    expected_valid = k + h < lengths[b]
                    assert bool(valid[b * 2 + i, h]) == bool(expected_valid)
                    if expected_valid:
                        assert log_d[b * 2 + i, h].exp().item() == pytest.approx(diff[k + h].item(), rel=2e-2)
    # an input can change nothing before its own position, and changes its own position's state
    assert (log_d[valid].exp() > 0).all()


def test_report_has_the_jacobian_section(random_report):
    section = random_report["jacobian"]
    assert section["positions"] == [1, 2, 4] and section["horizon"] == 8 and section["epsilon"] == 1e-3
    assert [row["h"] for row in section["curve"]] == list(range(len(section["curve"])))
    assert section["curve"][0]["count"] >= section["curve"][-1]["count"] > 0
    assert 0 < section["growth_factor"] < 100
    assert random_report["summary"]["jacobian_growth"] == section["growth_factor"]
