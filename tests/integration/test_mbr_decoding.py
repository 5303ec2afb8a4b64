"""MBR and QE decoding at evaluation (`generate_texts(decode=...)`, `hf-seqrl evaluate --decode`) on tiny models: the
picks equal the selection computed by hand from the same sampled candidates, and the settings are recorded."""

import json

import pytest

from helpers import by_hand_mbr, byt5_tokenizer, length_agreement, overlap_reward, tiny_causal_model, tiny_model
from hf_seqrl.candidates import SelectionDecoding, beam_candidates, sample_candidates, source_candidates
from hf_seqrl.data import tokenize_sources
from hf_seqrl.evaluation import generate_texts
from hf_seqrl.models import family_for

SOURCES = ["abc", "dcba", "bad", "cab ab", "a"]


def shortest(predictions, references, sources, **columns):
    """A reference-free score by hand: shorter is better."""
    return [-float(len(p)) for p in predictions]


@pytest.mark.parametrize("arch", ["t5", "llama"])
def test_mbr_and_qe_picks_equal_the_selection_from_the_same_samples(arch):
    tok = byt5_tokenizer()
    model = tiny_causal_model(arch) if arch == "llama" else tiny_model(arch)
    model.train()
    common = dict(batch_size=2, max_new_tokens=6, progress=False)
    # A random tiny model spreads its probability over the vocabulary: a cutoff below 1/384 keeps sampling.
    common["epsilon_cutoff"] = 0.002
    candidates = sample_candidates(model, tok, SOURCES, 6, seed=3, **common)
    assert [len(c) for c in candidates] == [6] * len(SOURCES)
    assert len({c for cands in candidates for c in cands}) > len(SOURCES)  # sampled: candidates differ
    assert sample_candidates(model, tok, SOURCES, 6, seed=3, **common) == candidates

    mbr = generate_texts(model, tok, SOURCES, decode="mbr", num_candidates=6, utility=length_agreement, seed=3,
                         **common)
    assert mbr == by_hand_mbr(candidates, length_agreement)
    assert any(pick != cands[0] for pick, cands in zip(mbr, candidates))  # not every pick is the first candidate
    chrf = generate_texts(model, tok, SOURCES, decode="mbr", num_candidates=6, seed=3, **common)
    from hf_seqrl.rewards import chrf_reward

    assert chrf == by_hand_mbr(candidates, chrf_reward)
    qe = generate_texts(model, tok, SOURCES, decode="qe", num_candidates=6, qe_reward=shortest, seed=3, **common)
    assert qe == [min(cands, key=len) for cands in candidates]  # min keeps the first of equal lengths
    assert model.training  # the mode is restored


@pytest.mark.parametrize("arch", ["t5", "llama"])
def test_beam_candidates_are_generates_nbest_and_the_picks_over_them_are_by_hand(arch):
    """`candidates="beam"`: each source's candidates are `generate(num_beams=k, num_return_sequences=k)`'s, best
    first; `"samples+beam"`: the samples, then that n-best (a multiset: MBR counts a text found twice twice)."""
    tok = byt5_tokenizer()
    model = tiny_causal_model(arch) if arch == "llama" else tiny_model(arch, seed=5)  # seed 5: beams that differ
    sources, common = SOURCES[:3], dict(batch_size=2, max_new_tokens=6, progress=False)
    nbest = beam_candidates(model, tok, sources, 3, **common)
    for source, cands in zip(sources, nbest):
        batch = tokenize_sources(family_for(model), tok, [source])
        ids = model.generate(**batch, num_beams=3, num_return_sequences=3, do_sample=False, max_new_tokens=6)
        ids = ids[:, batch["input_ids"].shape[1]:] if arch == "llama" else ids
        assert cands == [text.strip() for text in tok.batch_decode(ids, skip_special_tokens=True)]
    assert sum(len(set(cands)) == 3 for cands in nbest) >= 2

    beam = dict(decode="mbr", candidates="beam", num_candidates=3, utility=length_agreement, **common)
    mbr = generate_texts(model, tok, sources, **beam)
    assert mbr == by_hand_mbr(nbest, length_agreement)
    assert any(pick != cands[0] for pick, cands in zip(mbr, nbest))  # not the beam's best alone
    qe = generate_texts(model, tok, sources, **{**beam, "decode": "qe", "qe_reward": shortest})
    assert qe == [min(cands, key=len) for cands in nbest]

    both = SelectionDecoding("mbr", num_candidates=3, utility=length_agreement, epsilon_cutoff=0.002, seed=5,
                             candidates="samples+beam")
    samples = sample_candidates(model, tok, sources, 3, epsilon_cutoff=0.002, seed=5, **common)
    pool = source_candidates(model, tok, sources, both, **common)
    assert pool == [s + b for s, b in zip(samples, nbest)]
    picks = generate_texts(model, tok, sources, decode="mbr", candidates="samples+beam", num_candidates=3,
                           utility=length_agreement, epsilon_cutoff=0.002, seed=5, **common)
    assert picks == by_hand_mbr(pool, length_agreement)
    assert both.describe() == "mbr, 3 samples + 3-best beam, length_agreement"
    assert SelectionDecoding("mbr", candidates="beam").record()["seed"] is None  # the beam draws nothing


def test_decode_settings_are_checked():
    with pytest.raises(ValueError, match="needs qe_reward"):
        SelectionDecoding("qe")
    with pytest.raises(ValueError, match="num_candidates must be >= 2"):
        SelectionDecoding("mbr", num_candidates=1)
    with pytest.raises(ValueError, match="'mbr' or 'qe'"):
        generate_texts(tiny_model(), byt5_tokenizer(), ["ab"], num_candidates=4)
    with pytest.raises(ValueError, match="leave num_beams 1"):
        generate_texts(tiny_model(), byt5_tokenizer(), ["ab"], num_beams=2, decode="mbr")
    with pytest.raises(ValueError, match="'samples', 'beam'"):
        SelectionDecoding("mbr", candidates="nbest")
    assert SelectionDecoding("mbr", utility=overlap_reward).record() == {
        "decode": "mbr", "num_candidates": 16, "utility": "overlap_reward", "qe_reward": None,
        "epsilon_cutoff": 0.02, "seed": 0, "candidates": "samples"}


def test_evaluate_cli_decodes_by_mbr_and_qe_and_records_it(tmp_path, capsys):
    from hf_seqrl.cli import main

    tok = byt5_tokenizer()
    model = tiny_model("t5")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"source": s, "target": s}) + "\n" for s in SOURCES))
    out, predictions = tmp_path / "scores.json", tmp_path / "predictions.jsonl"
    argv = ["evaluate", "--model", str(folder), "--data", str(data), "--decode", "mbr", "--num_candidates", "4",
            "--utility", "test_mbr_decoding:length_agreement", "--epsilon_cutoff", "0.002", "--seed", "7",
            "--max_new_tokens", "6", "--batch_size", "2", "--output", str(out), "--predictions", str(predictions)]
    assert main(argv) == 0
    recorded = json.loads(out.read_text())
    assert recorded["decoding"] == "mbr, 4 candidates, test_mbr_decoding:length_agreement"
    assert recorded["selection"] == {"decode": "mbr", "num_candidates": 4, "qe_reward": None, "epsilon_cutoff": 0.002,
                                     "utility": "test_mbr_decoding:length_agreement", "seed": 7,
                                     "candidates": "samples"}
    candidates = sample_candidates(model, tok, SOURCES, 4, epsilon_cutoff=0.002, seed=7, batch_size=2,
                                   max_new_tokens=6, progress=False)
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [row["prediction"] for row in rows] == by_hand_mbr(candidates, length_agreement)

    qe = argv[:5] + ["--decode", "qe", "--qe_reward", "test_mbr_decoding:shortest", *argv[7:]]  # --utility unused
    assert main(qe) == 0
    assert json.loads(out.read_text())["selection"]["qe_reward"] == "test_mbr_decoding:shortest"
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [row["prediction"] for row in rows] == [min(cands, key=len) for cands in candidates]
    assert main([*argv, "--candidates", "beam"]) == 0  # the beam's 4-best
    recorded = json.loads(out.read_text())
    assert recorded["decoding"] == "mbr, 4-best beam, test_mbr_decoding:length_agreement"
    assert recorded["selection"]["candidates"] == "beam" and recorded["selection"]["seed"] is None
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    nbest = beam_candidates(model, tok, SOURCES, 4, batch_size=2, max_new_tokens=6, progress=False)
    assert [row["prediction"] for row in rows] == by_hand_mbr(nbest, length_agreement)
    assert main(argv[:5] + ["--decode", "qe"]) == 2
    assert "--decode qe needs --qe_reward" in capsys.readouterr().err


def test_distill_data_writes_mbr_picks_continues_them_and_refuses_other_selection_settings(tmp_path, capsys):
    """`hf-seqrl distill-data --decode mbr`: each row's target is the MBR pick among the teacher's samples (the
    candidates of the rows from a chunk's start drawn with seed + start), the selection settings recorded beside the
    file; a rerun continues it as one run writes, and another utility or decode is refused by name."""
    from hf_seqrl.cli import main

    tok, teacher = byt5_tokenizer(), tiny_model("t5", seed=3)
    teacher.save_pretrained(tmp_path / "teacher")
    tok.save_pretrained(tmp_path / "teacher")
    data, output = tmp_path / "data.jsonl", tmp_path / "mbr.jsonl"
    data.write_text("".join(json.dumps({"source": s, "id": i}) + "\n" for i, s in enumerate(SOURCES)))
    argv = ["distill-data", "--teacher", str(tmp_path / "teacher"), "--data", str(data), "--output", str(output),
            "--decode", "mbr", "--num_candidates", "5", "--utility", "test_mbr_decoding:length_agreement",
            "--epsilon_cutoff", "0.002", "--seed", "4", "--max_new_tokens", "6", "--batch_size", "2", "--device", "cpu"]
    assert main([*argv, "--max_examples", "2"]) == 0 and main(argv) == 0
    assert "wrote 3 rows" in capsys.readouterr().out
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["id"] for row in rows] == list(range(len(SOURCES)))
    # The first run wrote rows 0-1 (one chunk from row 0: seed 4), the rerun rows 2-4 (seed 4 + 2).
    expected = []
    for start, stop in ((0, 2), (2, 5)):
        cands = sample_candidates(teacher, tok, SOURCES[start:stop], 5, epsilon_cutoff=0.002, seed=4 + start,
                                  batch_size=2, max_new_tokens=6, progress=False)
        expected += by_hand_mbr(cands, length_agreement)
    assert [row["teacher_target"] for row in rows] == expected
    record = json.loads((tmp_path / "mbr.jsonl.settings.json").read_text())
    assert record["num_beams"] == 1 and record["selection"] == {
        "decode": "mbr", "num_candidates": 5, "utility": "test_mbr_decoding:length_agreement", "qe_reward": None,
        "epsilon_cutoff": 0.002, "seed": 4, "candidates": "samples"}
    assert main(argv[:argv.index("--utility")] + ["--utility", "chrf"] + argv[argv.index("--utility") + 2:]) == 2
    assert "selection.utility: 'test_mbr_decoding:length_agreement' → 'chrf'" in capsys.readouterr().err
    assert main([*argv, "--candidates", "samples+beam"]) == 2
    assert "selection.candidates: 'samples' → 'samples+beam'" in capsys.readouterr().err
    assert main(argv[:7] + argv[argv.index("--max_new_tokens"):]) == 2  # beam search now
    assert "num_beams: 1 → 4; selection.decode: 'mbr' → None" in capsys.readouterr().err


def test_distill_data_processes_draw_their_rows_candidates_from_their_own_seeds(tmp_path, monkeypatch):
    """Under a launcher, process 1 of 2 decodes rows 3-4 of 5 into its part file with seed `seed + 3`, as one process
    draws the chunk that starts at row 3: no two processes' candidates come from the same seeds."""
    from types import SimpleNamespace

    import hf_seqrl.cli.distill_data as distill_data
    from hf_seqrl.cli import main

    tok, teacher = byt5_tokenizer(), tiny_model("t5", seed=3)
    teacher.save_pretrained(tmp_path / "teacher")
    tok.save_pretrained(tmp_path / "teacher")
    data, output = tmp_path / "data.jsonl", tmp_path / "mbr.jsonl"
    data.write_text("".join(json.dumps({"source": s}) + "\n" for s in SOURCES))
    state = SimpleNamespace(process_index=1, num_processes=2, device="cpu", is_main_process=False)
    monkeypatch.setattr(distill_data, "several_processes", lambda: state)
    monkeypatch.setattr(distill_data, "join_parts", lambda state, part, output, written: written)
    assert main(["distill-data", "--teacher", str(tmp_path / "teacher"), "--data", str(data), "--output",
                 str(output), "--decode", "mbr", "--num_candidates", "5", "--utility",
                 "test_mbr_decoding:length_agreement", "--epsilon_cutoff", "0.002", "--seed", "4", "--max_new_tokens",
                 "6", "--batch_size", "2"]) == 0
    part = tmp_path / "mbr.process-1-of-2.jsonl"
    assert json.loads((tmp_path / "mbr.process-1-of-2.jsonl.settings.json").read_text())["selection"]["seed"] == 7
    cands = sample_candidates(teacher, tok, SOURCES[3:], 5, epsilon_cutoff=0.002, seed=7, batch_size=2,
                              max_new_tokens=6, progress=False)
    assert [json.loads(line)["teacher_target"] for line in part.read_text().splitlines()] == \
        by_hand_mbr(cands, length_agreement)


def test_teacher_outputs_load_a_reward_named_once_for_all_chunks(tmp_path, monkeypatch):
    """`write_teacher_outputs(decode="qe", qe_reward=<a name>)` builds the reward from its name once, not once per
    chunk of rows (a COMET checkpoint would load from disk each time), and picks as `generate_texts` does per chunk."""
    import hf_seqrl.candidates as candidates
    from hf_seqrl.evaluation import write_teacher_outputs

    built = []
    build = candidates.build_reward
    monkeypatch.setattr(candidates, "build_reward", lambda spec: (built.append(spec) if isinstance(spec, str) else None)
                        or build(spec))
    tok, teacher = byt5_tokenizer(), tiny_model("t5", seed=3)
    selection = dict(decode="qe", num_candidates=3, qe_reward="test_mbr_decoding:shortest", seed=2, max_new_tokens=6)
    output = tmp_path / "qe.jsonl"
    assert write_teacher_outputs(teacher, tok, [{"source": s} for s in SOURCES], "source", str(output), chunk=2,
                                 num_beams=1, progress=False, **selection) == len(SOURCES)
    assert built == ["test_mbr_decoding:shortest"]  # 3 chunks, one load
    expected = []
    for start in range(0, len(SOURCES), 2):
        expected += generate_texts(teacher, tok, SOURCES[start:start + 2], progress=False,
                                   **{**selection, "seed": 2 + start, "qe_reward": shortest})
    assert [json.loads(line)["teacher_target"] for line in output.read_text().splitlines()] == expected


def test_teacher_outputs_refuse_selection_settings_without_a_selection_before_touching_the_file(tmp_path):
    """`num_candidates` without `decode="mbr"|"qe"` is refused before the output file is opened: the rows a run wrote
    stay as they are."""
    from hf_seqrl.evaluation import write_teacher_outputs

    tok, model = byt5_tokenizer(), tiny_model("t5", seed=3)
    output = tmp_path / "out.jsonl"
    rows = [{"source": s} for s in SOURCES]
    assert write_teacher_outputs(model, tok, rows, "source", str(output), num_beams=1, max_new_tokens=4) == len(rows)
    written = output.read_text()
    with pytest.raises(ValueError, match="decode='beam': candidates are selected by 'mbr' or 'qe'"):
        write_teacher_outputs(model, tok, rows, "source", str(output), num_beams=1, max_new_tokens=4,
                              num_candidates=4, overwrite=True)
    assert output.read_text() == written
