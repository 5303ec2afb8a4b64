"""What minimum risk training sees: the candidate sets of the quality benchmark's checkpoint C on dev.

For each kind of candidate set (samples at temperature 1, the n-best of a beam), on the dev rows of `quality.py`'s
task, from its cached C: the sentence BLEU (or ROUGE-L) of the set's first candidate (the greedy-like top of the
beam), of its best candidate (the oracle) and the mean over the set; how often a candidate beats the first, and
how often one reaches the reference's own score (100, an exact reference); distinct candidates per source; the
length of the candidates over the first reference's; and the entropy of Q = softmax(α log p) over the distinct
candidates for several α, in units of log(distinct), so 1 means uniform and 0 all mass on one candidate; and the
decode's milliseconds per decoder position (rows × steps), the beam through `generate` against the rollout decode.

    python benchmarks/mrt_candidates.py --task translation
    python benchmarks/mrt_candidates.py --task translation --sets sample4 beam4 beam8 --alphas 0.005 0.1 1

Writes benchmarks/results/mrt_candidates_<task>.json (or --output) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import quality_lib as quality  # noqa: E402


def q_entropy(logprobs: list[float], alpha: float) -> float:
    """Returns the entropy of softmax(alpha * logprobs) over `logprobs`, divided by log(len) (1: uniform); 0 for one
    candidate."""
    if len(logprobs) < 2:
        return 0.0
    top = max(alpha * lp for lp in logprobs)
    weights = [math.exp(alpha * lp - top) for lp in logprobs]
    total = sum(weights)
    entropy = -sum(w / total * math.log(w / total) for w in weights if w > 0)
    return entropy / math.log(len(logprobs))


def summarize_set(scores: list[float], logprobs: list[float], lengths: list[int], reference_length: int,
                  texts: list[str], alphas: list[float]) -> dict:
    """Returns the statistics of one source's candidate set (scores in [0, 100], first candidate first); duplicates
    of an earlier candidate are left out of Q, as `MRTTrainer` leaves them out."""
    seen, keep = set(), []
    for i, text in enumerate(texts):
        if text not in seen:
            seen.add(text)
            keep.append(i)
    return {"first": scores[0], "oracle": max(scores), "mean": sum(scores) / len(scores),
            "beats_first": float(max(scores) > scores[0]), "reaches_reference": float(max(scores) >= 100.0 - 1e-9),
            "distinct": len(keep), "length_ratio": sum(lengths) / len(lengths) / max(reference_length, 1),
            **{f"q_entropy@{a:g}": q_entropy([logprobs[i] for i in keep], a) for a in alphas}}


def candidate_sets(model, tokenizer, rows: list[dict], kind: str, size: int, settings, batch_size: int = 50,
                   cost: dict | None = None):
    """Yields `(row, texts, logprobs, lengths)` per dev row: `size` candidates of `kind` (`sample` or `beam`), with
    their summed token log-probs under the model at temperature 1 (the log p of Q). `cost`, if given, gains the
    decode's seconds (`decode_s`) and decoder positions (`positions`: rows × steps, a beam's `size` rows per source)."""
    import torch

    from hf_seqrl.data import tokenize_sources
    from hf_seqrl.models import family_for
    from hf_seqrl.models.base import eval_mode
    from hf_seqrl.models.seq2seq import rollout_generation_config

    family = family_for(model)
    config = rollout_generation_config(model, settings.max_new_tokens)
    with eval_mode(model), torch.no_grad():
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            batch = tokenize_sources(family, tokenizer, [r["source"] for r in chunk], settings.max_source_tokens)
            batch = {key: value.to(model.device) for key, value in batch.items()}
            began = time.perf_counter()
            if kind == "beam":
                ids, mask = family.beam_search(model, batch, size, size, settings.max_new_tokens)
            else:
                rollout = family.sample(model, batch, config, num_samples=size)
                ids, mask = rollout.sample_ids, rollout.sample_mask
            if cost is not None:
                cost["decode_s"] = cost.get("decode_s", 0.0) + time.perf_counter() - began
                cost["positions"] = cost.get("positions", 0) + ids.numel()
            scored = family.score(model, batch, ids, size)
            logprobs = (scored.token_logprobs * mask).sum(-1).tolist()
            texts = [t.strip() for t in tokenizer.batch_decode(ids, skip_special_tokens=True)]
            lengths = [len(t.split()) for t in texts]
            for j, row in enumerate(chunk):
                part = slice(j * size, (j + 1) * size)
                yield row, texts[part], logprobs[part], lengths[part]


def analyse(args) -> dict:
    import torch

    from hf_seqrl.rewards import get_reward

    torch.manual_seed(0)
    settings = replace(quality.SETTINGS[(args.task, False)], device=args.device)
    splits = quality.load_task(settings, args.data_dir)
    work = args.work_dir or quality.default_work_dir(args.task)
    tokenizer = quality.build_tokenizer(settings, splits["train"], os.path.join(work, "tokenizer"))
    folder = quality.c_folder(settings, work)
    if not os.path.isdir(folder):
        raise SystemExit(f"No checkpoint C in {folder}: run benchmarks/quality.py --task {args.task} first.")
    model = quality.load_model(settings, folder)
    metric = get_reward(settings.metrics[0])
    rows = splits["dev"][:args.limit]
    table = {}
    for name in args.sets:
        kind, size = name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")):])
        start, per_source, cost = time.time(), [], {}
        for row, texts, logprobs, lengths in candidate_sets(model, tokenizer, rows, kind, size, settings, cost=cost):
            scores = [100.0 * s for s in metric(texts, [row["references"]] * len(texts))]
            per_source.append(summarize_set(scores, logprobs, lengths, len(row["references"][0].split()), texts,
                                            args.alphas))
        keys = per_source[0].keys()
        table[name] = {k: round(sum(s[k] for s in per_source) / len(per_source), 4) for k in keys}
        table[name]["seconds"] = round(time.time() - start, 1)
        table[name]["decode_ms_per_position"] = round(1000 * cost["decode_s"] / cost["positions"], 4)
        print(f"{name}: {table[name]}", flush=True)
    return {"task": args.task, "metric": settings.metrics[0], "dev_rows": len(rows), "checkpoint": folder,
            "alphas": args.alphas, "sets": table}


def markdown(results: dict) -> str:
    alphas = [f"q_entropy@{a:g}" for a in results["alphas"]]
    head = ["set", "first", "oracle", "mean", "beats first", "reaches reference", "distinct", "length ratio",
            *[f"H(Q) α={a:g}" for a in results["alphas"]], "decode ms / position"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, row in results["sets"].items():
        cells = [f"{row['first']:.2f}", f"{row['oracle']:.2f}", f"{row['mean']:.2f}", f"{row['beats_first']:.2f}",
                 f"{row['reaches_reference']:.3f}", f"{row['distinct']:.2f}", f"{row['length_ratio']:.3f}",
                 *[f"{row[a]:.2f}" for a in alphas], f"{row['decode_ms_per_position']:.3f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("translation", "summarization"), required=True)
    parser.add_argument("--sets", nargs="+", default=["sample4", "beam4", "beam8"],
                        help="candidate sets: sample<n> (temperature 1) or beam<n> (n-best of a width-n beam)")
    parser.add_argument("--alphas", nargs="+", type=float, default=[0.005, 0.1, 1.0])
    parser.add_argument("--limit", type=int, default=None, help="first dev rows only")
    parser.add_argument("--data-dir", default=quality.DEFAULT_DATA)
    parser.add_argument("--work-dir", default=None, help="the quality benchmark's work folder (holds C)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where C decodes and scores")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    results = analyse(args)
    results["command"] = "python benchmarks/mrt_candidates.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results["markdown"] = markdown(results)
    print(results["markdown"])
    output = args.output or os.path.join(HERE, "results", f"mrt_candidates_{args.task}.json")
    return quality.write_json(results, output)


if __name__ == "__main__":
    main()
