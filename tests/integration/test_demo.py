"""The embedded demo end to end, in its quick size: table, saved model and tokenizer, results file."""

import json
import math

import pytest

from helpers import run_card_code
from hf_seqrl.demo import ARMS, QUICK, RESULTS_FILE, make_task, run_demo


def test_task_is_deterministic_and_every_reference_is_a_consistent_dialect():
    task = make_task(3, QUICK)
    assert task == make_task(3, QUICK)
    assert task["train"] != make_task(4, QUICK)["train"]
    for row in task["train"][:50]:
        refs = row["references"]
        assert row["target"] in refs
        assert len(refs) == QUICK.dialects == len(set(refs))
        # Same length as the source, word for word, and no two dialects agree on any word.
        words = [ref.split() for ref in refs]
        assert all(len(w) == len(row["source"].split()) for w in words)
        assert all(len(set(column)) == QUICK.dialects for column in zip(*words))


@pytest.mark.slow
def test_quick_demo_trains_compares_and_saves(tmp_path, capsys):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    results = run_demo(str(tmp_path), seed=0, quick=True)

    assert set(results["arms"]) == set(ARMS)
    for arm in ARMS:
        for metric in ("bleu", "chrf"):
            value = results["arms"][arm][metric]
            assert math.isfinite(value) and 0.0 <= value <= 100.0, (arm, metric, value)
    assert results["arms"]["warmup"]["steps"] > 0
    assert (results["arms"]["scst"]["steps"] == results["arms"]["xe"]["steps"] == results["arms"]["ss"]["steps"]
            == QUICK.compare_steps)
    assert results["warmup"]["dev_bleu_history"], "the plateau criterion never evaluated"
    assert results["arms"]["scst"]["train_rewards"], "SCST logged no rl/reward"
    out = capsys.readouterr().out
    assert "C + SCST" in out and "C + scheduled sampling" in out
    heldout = [json.loads(line) for line in (tmp_path / "heldout_test.jsonl").read_text().splitlines()]
    assert len(heldout) == QUICK.test_size and len(heldout[0]["target"]) == QUICK.dialects
    card = (tmp_path / "README.md").read_text()
    assert "SCST" in card and "test_bleu_scst" in card and "outputs = model.generate(**inputs" in card
    # The card's code, run as written with the folder for the repository id, writes what the saved model writes.
    namespace, printed = run_card_code(tmp_path, str(tmp_path))
    assert printed == results["arms"]["scst"]["example_output"]  # the demo's own greedy output of that source

    assert (tmp_path / "model.safetensors").is_file()
    saved = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert set(saved["arms"]) == set(ARMS)
    assert saved["arms"]["scst"]["bleu"] == pytest.approx(results["arms"]["scst"]["bleu"])

    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    source = saved["task"]["example"]["source"]
    generated = model.generate(**tokenizer([source], return_tensors="pt"), max_new_tokens=12)
    text = tokenizer.decode(generated[0], skip_special_tokens=True)
    # The reloaded tokenizer knows the task's words: the output is made of target word forms, no <unk>.
    assert "<unk>" not in text and all(word in tokenizer.get_vocab() for word in text.split())


def readme_demo_table() -> dict[str, tuple[int, float, float]]:
    """Returns the README's demo table: row title -> (steps, BLEU, chrF), bold marks dropped."""
    from helpers import REPO

    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## The demo"):]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip().strip("*") for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].isdigit():
            rows[cells[0]] = (int(cells[1]), float(cells[2]), float(cells[3]))
        elif rows and not line.startswith("|"):
            break
    return rows


def demo_claims(table: dict[str, tuple[int, float, float]]) -> dict[str, bool]:
    """Returns the README's claims about the demo table (row title -> (steps, BLEU, chrF)), each true or false: what
    holds for the demo on any CPU, where the exact numbers do not (float32 kernels sum in another order on another
    vector width, the warm-up plateaus at another step, and every number after it moves)."""
    from hf_seqrl.demo import ARM_TITLES, FULL

    warmup, scst, xe, ss = (table[ARM_TITLES[arm]] for arm in ARMS)
    return {
        "rows in the demo's order": list(table) == [ARM_TITLES[arm] for arm in ARMS],
        "the warm-up stopped at a dev evaluation": warmup[0] % FULL.eval_every == 0 and warmup[0] > 0,
        "every arm from C took the same steps": scst[0] == xe[0] == ss[0] == FULL.compare_steps,
        "SCST reads the dialect (BLEU >= 85)": scst[1] >= 85.0,
        "SCST >= 50 BLEU above more cross-entropy and scheduled sampling": scst[1] >= max(xe[1], ss[1]) + 50.0,
        "more cross-entropy and scheduled sampling stay below C": max(xe[1], ss[1]) < warmup[1],
    }


def test_demo_claims_are_checked_on_a_hand_made_table():
    table = {"C: cross-entropy warm-up": (1250, 35.2, 63.2), "C + SCST": (300, 100.0, 100.0),
             "C + cross-entropy": (300, 19.8, 54.1), "C + scheduled sampling": (300, 21.0, 54.2)}
    assert all(demo_claims(table).values())
    table["C + SCST"] = (300, 60.0, 70.0)
    claims = demo_claims(table)
    assert not claims["SCST reads the dialect (BLEU >= 85)"]
    assert not claims["SCST >= 50 BLEU above more cross-entropy and scheduled sampling"]
    table["C + cross-entropy"] = (250, 19.8, 54.1)
    assert not demo_claims(table)["every arm from C took the same steps"]


@pytest.mark.slow
def test_readme_demo_table_and_what_the_demo_prints_make_the_same_claims(tmp_path, capsys):
    from hf_seqrl.demo import ARM_TITLES

    results = run_demo(str(tmp_path), seed=0)
    printed = {ARM_TITLES[arm]: (row["steps"], round(row["bleu"], 1), round(row["chrf"], 1))
               for arm, row in results["arms"].items()}
    readme = readme_demo_table()
    assert all(demo_claims(readme).values()), demo_claims(readme)
    assert all(demo_claims(printed).values()), (printed, demo_claims(printed))
    out = capsys.readouterr().out
    assert all(title in out for title in printed)
