"""MBR and QE decoding at evaluation (`generate_texts(decode=...)`, `hf-seqrl evaluate --decode`) on tiny models: the
picks equal the selection computed by hand from the same sampled candidates, and the settings are recorded."""

import json

import pytest

from helpers import byt5_tokenizer, overlap_reward, tiny_causal_model, tiny_model
from hf_seqrl.candidates import SelectionDecoding, sample_candidates
from hf_seqrl.evaluation import generate_texts

SOURCES = ["abc", "dcba", "bad", "cab ab", "a"]


def by_hand_mbr(candidates, utility):
    """The MBR pick written out: the highest mean utility against the other candidates, the first on a tie."""
    picks = []
    for cands in candidates:
        means = [sum(utility([c], [[o]])[0] for j, o in enumerate(cands) if j != i) / (len(cands) - 1)
                 for i, c in enumerate(cands)]
        picks.append(cands[means.index(max(means))])
    return picks


def length_agreement(predictions, references, sources=None, **columns):
    """A utility by hand that random tiny models make informative: minus the length difference (MBR: the median)."""
    return [-abs(len(p) - len(refs[0])) for p, refs in zip(predictions, references)]


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


def test_decode_settings_are_checked():
    with pytest.raises(ValueError, match="needs qe_reward"):
        SelectionDecoding("qe")
    with pytest.raises(ValueError, match="num_candidates must be >= 2"):
        SelectionDecoding("mbr", num_candidates=1)
    with pytest.raises(ValueError, match="'mbr' or 'qe'"):
        generate_texts(tiny_model(), byt5_tokenizer(), ["ab"], num_candidates=4)
    with pytest.raises(ValueError, match="leave num_beams 1"):
        generate_texts(tiny_model(), byt5_tokenizer(), ["ab"], num_beams=2, decode="mbr")
    assert SelectionDecoding("mbr", utility=overlap_reward).record() == {
        "decode": "mbr", "num_candidates": 16, "utility": "overlap_reward", "qe_reward": None,
        "epsilon_cutoff": 0.02, "seed": 0}


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
                                     "utility": "test_mbr_decoding:length_agreement", "seed": 7}
    candidates = sample_candidates(model, tok, SOURCES, 4, epsilon_cutoff=0.002, seed=7, batch_size=2,
                                   max_new_tokens=6, progress=False)
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [row["prediction"] for row in rows] == by_hand_mbr(candidates, length_agreement)

    qe = argv[:5] + ["--decode", "qe", "--qe_reward", "test_mbr_decoding:shortest", *argv[7:]]  # --utility unused
    assert main(qe) == 0
    assert json.loads(out.read_text())["selection"]["qe_reward"] == "test_mbr_decoding:shortest"
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [row["prediction"] for row in rows] == [min(cands, key=len) for cands in candidates]
    assert main(argv[:5] + ["--decode", "qe"]) == 2
    assert "--decode qe needs --qe_reward" in capsys.readouterr().err
