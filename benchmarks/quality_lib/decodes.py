"""A model's decodings of one split side by side: greedy, beam 4, MBR over epsilon samples and QE reranking of them,
each scored as the units are (`metrics.score_predictions`) with its cost per source: the seconds of its candidates
and of its selection apart, and its decoder positions."""

from __future__ import annotations

import os
import time

from .metrics import score_predictions
from .pool import cached
from .settings import Settings
from .units import DecoderPositions

# MBR over this many epsilon samples per source; QE reranks the samples of the first count.
MBR_CANDIDATES = (16, 32)
HEAD = ("decoding", "candidates / source", "test bleu", "test chrf", "dev bleu", "dev chrf",
        "candidates s / source", "selection s / source", "positions / source")


def decodings() -> tuple[str, ...]:
    """Returns the names of the decodings, in the table's order."""
    return ("greedy", "beam4", *(f"mbr{n}" for n in MBR_CANDIDATES), f"qe{MBR_CANDIDATES[0]}")


def _timed(model, compute) -> tuple[object, float, int]:
    """Returns `compute()`, its seconds and the decoder positions `model` computed in it."""
    counter, clock = DecoderPositions(model), time.time()
    value = compute()
    seconds = time.time() - clock
    counter.remove()
    return value, seconds, counter.count


def samples(model, tokenizer, rows: list[dict], settings: Settings, count: int, path: str) -> dict:
    """Returns `count` epsilon samples per source of `rows` (`hf_seqrl.candidates.source_candidates`, seed 0,
    `mbr_epsilon`: the candidates `generate_texts(decode="mbr")` draws) with their seconds and decoder positions,
    cached at `path`."""
    from hf_seqrl.candidates import SelectionDecoding, source_candidates

    def compute():
        decoding = SelectionDecoding("mbr", count, settings.mbr_utility, epsilon_cutoff=settings.mbr_epsilon)
        texts, seconds, positions = _timed(model, lambda: source_candidates(
            model, tokenizer, [r["source"] for r in rows], decoding, batch_size=settings.eval_batch,
            max_new_tokens=settings.max_new_tokens, max_source_length=settings.max_source_tokens, progress=False))
        return {"candidates": texts, "seconds": seconds, "positions": positions}

    return cached(path, compute)


def qe_reward(model, tokenizer, settings: Settings):
    """Returns the reference-free reward QE reranks by: the model's own length-normalized log-likelihood of each
    candidate given its source (`TeacherLikelihoodReward` with the model as its teacher)."""
    from hf_seqrl.rewards import TeacherLikelihoodReward

    return TeacherLikelihoodReward(model, tokenizer=tokenizer, batch_size=settings.eval_batch, device=model.device)


def decode_split(model, tokenizer, rows: list[dict], settings: Settings, folder: str, split: str) -> dict:
    """Returns per decoding (`decodings()`) of `model` on `rows` its scores, candidates per source and cost per
    source (`candidate_seconds`, `selection_seconds`, `positions`), each cached in `folder/<split>_<decoding>.json`
    (the samples in `folder/<split>_samples<n>.json`: QE reranks MBR's first set, so it shares their cost)."""
    from hf_seqrl.candidates import SelectionDecoding, select
    from hf_seqrl.evaluation import generate_texts

    sources, out = [r["source"] for r in rows], {}

    def record(predictions, candidates, candidate_seconds, selection_seconds, positions, **extra):
        n = max(len(rows), 1)
        return {**score_predictions(predictions, rows, settings), "candidates": candidates,
                "candidate_seconds": round(candidate_seconds / n, 5),
                "selection_seconds": round(selection_seconds / n, 5), "positions": round(positions / n, 1), **extra}

    for beams, name in ((1, "greedy"), (4, "beam4")):
        def beam_record(beams=beams):
            texts, seconds, positions = _timed(model, lambda: generate_texts(
                model, tokenizer, sources, num_beams=beams, batch_size=settings.eval_batch,
                max_new_tokens=settings.max_new_tokens, max_source_length=settings.max_source_tokens, progress=False))
            return record(texts, beams, seconds, 0.0, positions)

        out[name] = cached(os.path.join(folder, f"{split}_{name}.json"), beam_record)
    reward = None
    for kind, count in [("mbr", n) for n in MBR_CANDIDATES] + [("qe", MBR_CANDIDATES[0])]:
        def pick_record(kind=kind, count=count):
            nonlocal reward
            path = os.path.join(folder, f"{split}_samples{count}.json")
            drawn = samples(model, tokenizer, rows, settings, count, path)
            if kind == "qe" and reward is None:
                reward = qe_reward(model, tokenizer, settings)
            decoding = SelectionDecoding(kind, count, settings.mbr_utility, reward, settings.mbr_epsilon)
            clock = time.time()
            picks = select(drawn["candidates"], sources, decoding)
            return record(picks, count, drawn["seconds"], time.time() - clock, drawn["positions"],
                          selection=decoding.record())

        out[f"{kind}{count}"] = cached(os.path.join(folder, f"{split}_{kind}{count}.json"), pick_record)
    return out


def decodes_markdown(decodes: dict) -> str:
    """Returns the markdown table of the decodings: test and dev BLEU / chrF and the cost per source."""
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for name, test in decodes["test"].items():
        dev = decodes.get("dev", {}).get(name, {})
        cells = [name, str(test["candidates"])] + [f"{test[m]:.2f}" for m in ("bleu", "chrf")]
        cells += [f"{dev[m]:.2f}" if m in dev else "–" for m in ("bleu", "chrf")]
        cells += [f"{test['candidate_seconds']:.4f}", f"{test['selection_seconds']:.4f}", f"{test['positions']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
