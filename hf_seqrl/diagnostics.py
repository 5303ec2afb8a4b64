"""Exposure-bias diagnostics for encoder-decoder models: a JSON report and a PNG plot.

Three measurements on `sources` and `references` (the first reference of each source is the gold target
used for teacher forcing; metrics use all references). Token positions count the tokenized gold target,
EOS included, without the decoder start token.

1. Gap: mean per-token NLL and accuracy of the gold target under gold prefixes (teacher forcing), next to
   the corpus metric and length of greedy free-running outputs.
2. Horizon: at each position `k`, next-token accuracy and NLL of the gold token `k` when the decoder prefix
   is the gold `gold[:k]` (`tf_*`) or the model's own greedy output `greedy[:k]` (`free_*`). Both curves
   average the same examples: those whose gold has a token at `k` and whose greedy output has not ended
   (emitted EOS) before `k`. At `k = 0` both prefixes are empty, so the curves coincide.
3. Recovery: at position `j`, the decoder is forced through `gold[:j]` plus the model's most likely token
   other than `gold[j]` (EOS, pad and special tokens excluded) and then decodes greedily. With
   `w = min(recovery_window, len(gold) - j - 1)`, the continuation `c` (tokens after the injected one, up to
   its EOS) *rejoins* the reference when some window `c[d:d+w]` equals some `gold[i:i+w]` with `i >= j`
   (substitutions, insertions and skips all count); `d`, the number of tokens before that window, is how fast.
   Only positions before the gold EOS are injected. The metric drop is the mean sentence metric of clean
   greedy decoding from `gold[:j]` minus that of decoding from the corrupted prefix.

All metric values are in [0, 1] (sacrebleu scores / 100), as for `hf_seqrl.rewards`.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, TrainerCallback
from transformers.utils import logging

from .losses import token_logprobs_from_logits
from .rewards import get_reward, normalize_references
from .rollout import completion_mask, decoder_start_id, eos_ids, expand_encoder_states, pad_id, shift_right

logger = logging.get_logger(__name__)

METRICS = ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum")
SUMMARY_KEYS = ("tf_nll", "tf_accuracy", "free_metric", "length_ratio", "horizon_gap", "horizon_accuracy_gap",
                "recovery_rate", "recovery_delay", "metric_drop")


def greedy_generation_config(model, max_new_tokens: int) -> GenerationConfig:
    """Returns a plain greedy generation config keeping only the model's structural tokens.

    Beam search, repetition penalties and minimum lengths are dropped: the free-running outputs must be the
    argmax path of the distribution whose NLL the horizon curve measures.
    """
    base = model.generation_config
    return GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, decoder_start_token_id=decoder_start_id(model),
        eos_token_id=base.eos_token_id if base.eos_token_id is not None else model.config.eos_token_id,
        pad_token_id=pad_id(model), bos_token_id=base.bos_token_id, forced_bos_token_id=base.forced_bos_token_id,
        forced_eos_token_id=base.forced_eos_token_id)


def corpus_metric(predictions: list[str], references: list[list[str]], metric: str) -> float:
    """Returns corpus BLEU / chrF (sacrebleu, all references) or the mean sentence ROUGE F1, in [0, 1]."""
    if metric in ("bleu", "chrf"):
        from sacrebleu.metrics import BLEU, CHRF

        # sacrebleu wants one stream per reference slot; None marks a source with fewer references.
        width = max(len(refs) for refs in references)
        streams = [[refs[r] if r < len(refs) else None for refs in references] for r in range(width)]
        scorer = BLEU() if metric == "bleu" else CHRF()
        return min(1.0, scorer.corpus_score(predictions, streams).score / 100.0)
    return sum(get_reward(metric)(predictions, references)) / max(len(predictions), 1)


def rejoin_delay(continuation: Sequence[int], gold: Sequence[int], j: int, window: int) -> int | None:
    """Returns how many continuation tokens precede its first window matching the gold from `j` on, or None.

    Args:
        continuation: tokens decoded after the injected token at position `j`, up to and including EOS.
        gold: the gold token ids, EOS included.
    """
    w = min(window, len(gold) - j - 1)
    if w < 1:
        return None
    grams = {tuple(gold[i:i + w]) for i in range(j, len(gold) - w + 1)}
    for d in range(len(continuation) - w + 1):
        if tuple(continuation[d:d + w]) in grams:
            return d
    return None


def _ended_length(ids: torch.Tensor, eos: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns, per row of `ids` (`(N, T)`), the number of tokens before the first EOS and whether one occurs."""
    mask = completion_mask(ids, eos)
    if not eos:
        return mask.sum(dim=1), torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    has_eos = (torch.isin(ids, torch.tensor(eos, device=ids.device)) & mask).any(dim=1)
    return mask.sum(dim=1) - has_eos.long(), has_eos


def _decode(model, enc: dict, config: GenerationConfig, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """Returns greedy decodes `(N, T)` after the decoder start token (forced `prefix` included), pad after EOS."""
    out = model.generate(**enc, generation_config=config, decoder_input_ids=prefix)[:, 1:]
    if out.shape[1] == 0:
        out = out.new_full((out.shape[0], 1), pad_id(model))
    return out.masked_fill(~completion_mask(out, eos_ids(model)), pad_id(model))


def _position_stats(model, enc: dict, labels: torch.Tensor, greedy: torch.Tensor, banned: torch.Tensor):
    """Returns per-position NLL and correctness of the gold token under gold and greedy prefixes, and wrong tokens.

    One forward: the encoder runs once, the decoder scores a gold row and a greedy row per source.

    Args:
        labels (`torch.LongTensor` of shape `(B, T)`): gold tokens, -100 at padding.
        greedy (`torch.LongTensor` of shape `(B, T')`): greedy tokens, pad after EOS.
        banned (`torch.LongTensor` of shape `(S,)`): ids never injected as a mistake (EOS, pad, special tokens).

    Returns: `nll` and `correct` of shape `(B, 2, T)` (index 0 = gold prefix, 1 = greedy prefix), and `wrong`
    `(B, T)`: the most likely token other than the gold one after each gold prefix.
    """
    batch, length = labels.shape
    start, pad = decoder_start_id(model), pad_id(model)
    free_inputs = labels.new_full((batch, length), pad)
    free_inputs[:, 0] = start
    n = min(length - 1, greedy.shape[1])
    free_inputs[:, 1:1 + n] = greedy[:, :n]
    rows = torch.stack([shift_right(labels, start, pad), free_inputs], dim=1).flatten(0, 1)  # (2B, T)
    with expand_encoder_states(model, 2):
        logits = model(**enc, decoder_input_ids=rows, use_cache=False).logits.float()
    targets = labels.clamp(min=0)
    nll = -token_logprobs_from_logits(logits, targets.repeat_interleave(2, dim=0)).view(batch, 2, length)
    correct = (logits.argmax(dim=-1).view(batch, 2, length) == targets.unsqueeze(1)).float()
    # The k best gold-prefix candidates always hold one that is neither banned nor the gold token.
    candidates = logits.view(batch, 2, length, -1)[:, 0].topk(banned.numel() + 2, dim=-1).indices
    allowed = ~torch.isin(candidates, banned) & (candidates != targets.unsqueeze(-1))
    wrong = candidates.gather(-1, allowed.float().argmax(dim=-1, keepdim=True)).squeeze(-1)
    return nll, correct, wrong


def _pad_labels(token_lists: list[list[int]], device) -> torch.Tensor:
    length = max(len(t) for t in token_lists)
    return torch.tensor([t + [-100] * (length - len(t)) for t in token_lists], device=device)


def _mean(total: float, count: float) -> float | None:
    return float(total) / count if count else None


def run_diagnostics(model, tokenizer, sources: Sequence[str], references: Sequence[Any], *, max_horizon: int = 20,
                    inject_positions: Sequence[int] = (0, 1, 2, 4, 8), metric: str = "bleu", batch_size: int = 32,
                    max_new_tokens: int | None = None, max_examples: int | None = None, recovery_window: int = 4,
                    max_source_length: int | None = None, progress: bool = True) -> dict:
    """Returns the exposure-bias report: a JSON-serializable dict with `gap`, `horizon`, `recovery`, `summary`, `config`.

    Args:
        model: an encoder-decoder `PreTrainedModel` (left in its original train/eval mode afterwards).
        sources (`list[str]`), references (`list[str | list[str]]`): one row per source; the first reference is
            the teacher-forcing target, metrics use all of them.
        max_horizon (`int`): number of positions `k` on the horizon curve.
        inject_positions (`tuple[int]`): positions `j` where a mistake is injected.
        metric (`str`): "bleu" | "chrf" (sacrebleu corpus score for the gap, sentence score for the drop) or a
            ROUGE name (mean sentence F1).
        max_new_tokens (`int`, *optional*): decode budget; defaults to twice the longest gold target plus 10.
        recovery_window (`int`): how many consecutive gold tokens a continuation must reproduce to rejoin.
    """
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is not supported: choose one of {', '.join(METRICS)}.")
    if not getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("run_diagnostics needs an encoder-decoder model (model.config.is_encoder_decoder is False).")
    references = normalize_references(references)
    if len(sources) != len(references):
        raise ValueError(f"Got {len(sources)} sources but {len(references)} reference rows: give one row per source.")
    sources, references = list(sources)[:max_examples], references[:max_examples]
    if not sources:
        raise ValueError("run_diagnostics got no examples.")
    device, eos = model.device, eos_ids(model)
    gold = tokenizer(text_target=[refs[0] for refs in references])["input_ids"]
    gold_content = [next((i for i, t in enumerate(g) if t in eos), len(g)) for g in gold]  # tokens before EOS
    budget = max_new_tokens or 2 * max(len(g) for g in gold) + 10
    config = greedy_generation_config(model, budget)
    vocab = model.get_output_embeddings().weight.shape[0]
    banned = torch.tensor(sorted({i for i in [*eos, pad_id(model), decoder_start_id(model),
                                               *tokenizer.all_special_ids] if 0 <= i < vocab}), device=device)
    reward_fn = get_reward(metric)
    positions = sorted(set(int(j) for j in inject_positions))
    h_sums = torch.zeros(5, max_horizon, dtype=torch.float64)  # tf nll, tf correct, free nll, free correct, count
    tf_nll = tf_correct = num_tokens = 0.0
    predictions, free_lengths, stopped = [], [], 0
    rec = {j: dict(count=0, recovered=0, delay=0, clean=0.0, injected=0.0) for j in positions}

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for lo in tqdm(range(0, len(sources), batch_size), desc="diagnostics", disable=not progress):
                idx = list(range(lo, min(lo + batch_size, len(sources))))
                enc = tokenizer([sources[i] for i in idx], return_tensors="pt", padding=True,
                                truncation=max_source_length is not None, max_length=max_source_length).to(device)
                enc = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
                labels = _pad_labels([gold[i] for i in idx], device)
                greedy = _decode(model, enc, config)
                lengths, has_eos = _ended_length(greedy, eos)
                predictions += tokenizer.batch_decode(greedy, skip_special_tokens=True)
                free_lengths += lengths.tolist()
                stopped += int(has_eos.sum())

                nll, correct, wrong = _position_stats(model, enc, labels, greedy, banned)
                is_gold = labels != -100
                tf_nll += float(nll[:, 0][is_gold].sum())
                tf_correct += float(correct[:, 0][is_gold].sum())
                num_tokens += float(is_gold.sum())
                horizon = min(max_horizon, labels.shape[1])
                k = torch.arange(horizon, device=device)
                # Paired: both curves count an example at k only if its greedy output was still running at k.
                valid = (is_gold[:, :horizon] & (k.unsqueeze(0) <= lengths.unsqueeze(1))).float()
                for row, values in enumerate([nll[:, 0], correct[:, 0], nll[:, 1], correct[:, 1]]):
                    h_sums[row, :horizon] += (values[:, :horizon] * valid).sum(dim=0).double().cpu()
                h_sums[4, :horizon] += valid.sum(dim=0).double().cpu()

                for j in positions:
                    rows = [r for r, i in enumerate(idx) if j < gold_content[i]]
                    if not rows:
                        continue
                    sub = {key: value[rows] for key, value in enc.items()}
                    prefix = shift_right(labels[rows, : j + 1], decoder_start_id(model), pad_id(model))  # start+gold[:j]
                    config.max_new_tokens = max(budget - j, 1)
                    clean = _decode(model, sub, config, prefix)
                    injected_prefix = torch.cat([prefix, wrong[rows, j : j + 1]], dim=1)
                    config.max_new_tokens = max(budget - j - 1, 1)
                    injected = _decode(model, sub, config, injected_prefix)
                    refs = [references[idx[r]] for r in rows]
                    scores = [reward_fn(tokenizer.batch_decode(ids, skip_special_tokens=True), refs)
                              for ids in (clean, injected)]
                    stats = rec[j]
                    stats["count"] += len(rows)
                    stats["clean"] += sum(scores[0])
                    stats["injected"] += sum(scores[1])
                    cont_lengths = completion_mask(injected, eos).sum(dim=1).tolist()
                    for r, row in enumerate(rows):
                        delay = rejoin_delay(injected[r, j + 1 : cont_lengths[r]].tolist(), gold[idx[row]], j,
                                             recovery_window)
                        if delay is not None:
                            stats["recovered"] += 1
                            stats["delay"] += delay
                config.max_new_tokens = budget
    finally:
        model.train(was_training)

    n = len(sources)
    gap = dict(metric=metric, num_examples=n, num_tokens=int(num_tokens), tf_nll=_mean(tf_nll, num_tokens),
               tf_accuracy=_mean(tf_correct, num_tokens), free_metric=corpus_metric(predictions, references, metric),
               free_length=sum(free_lengths) / n, reference_length=sum(gold_content) / n,
               free_stopped_rate=stopped / n)
    gap["tf_perplexity"] = math.exp(min(gap["tf_nll"], 700.0))
    gap["length_ratio"] = _mean(gap["free_length"], gap["reference_length"])
    sums = h_sums.tolist()
    horizon = [dict(k=k, count=int(sums[4][k]), tf_accuracy=_mean(sums[1][k], sums[4][k]),
                    tf_nll=_mean(sums[0][k], sums[4][k]), free_accuracy=_mean(sums[3][k], sums[4][k]),
                    free_nll=_mean(sums[2][k], sums[4][k])) for k in range(max_horizon) if sums[4][k] > 0]
    recovery = [dict(j=j, count=s["count"], recovery_rate=_mean(s["recovered"], s["count"]),
                     mean_tokens_to_rejoin=_mean(s["delay"], s["recovered"]), clean_metric=_mean(s["clean"], s["count"]),
                     injected_metric=_mean(s["injected"], s["count"]),
                     metric_drop=_mean(s["clean"] - s["injected"], s["count"])) for j, s in rec.items() if s["count"]]
    later = sum(sums[4][1:])  # horizon gaps are token-weighted means over k >= 1
    injected_total = sum(s["count"] for s in rec.values())
    recovered_total = sum(s["recovered"] for s in rec.values())
    summary = dict(
        tf_nll=gap["tf_nll"], tf_accuracy=gap["tf_accuracy"], free_metric=gap["free_metric"],
        length_ratio=gap["length_ratio"], horizon_gap=_mean(sum(sums[2][1:]) - sum(sums[0][1:]), later),
        horizon_accuracy_gap=_mean(sum(sums[1][1:]) - sum(sums[3][1:]), later),
        recovery_rate=_mean(recovered_total, injected_total),
        recovery_delay=_mean(sum(s["delay"] for s in rec.values()), recovered_total),
        metric_drop=_mean(sum(s["clean"] - s["injected"] for s in rec.values()), injected_total))
    run_config = dict(model=getattr(model.config, "_name_or_path", "") or model.config.model_type, metric=metric,
                      max_horizon=max_horizon, inject_positions=positions, batch_size=batch_size,
                      max_new_tokens=budget, max_examples=max_examples, recovery_window=recovery_window,
                      max_source_length=max_source_length, num_examples=n)
    return dict(gap=gap, horizon=horizon, recovery=recovery, summary=summary, config=run_config)


def _series(rows: list[dict], key: str) -> list[float]:
    return [math.nan if row[key] is None else row[key] for row in rows]


def plot_diagnostics(report: dict, path: str) -> str:
    """Returns `path` after writing a PNG of the horizon curves, the recovery per position and the gap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # A bare Figure with the Agg canvas leaves pyplot's global backend and figure list untouched.
    fig = Figure(figsize=(16, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax_acc, ax_nll, ax_rec = fig.subplots(1, 3)
    ks = [row["k"] for row in report["horizon"]]
    for ax, key, label in ((ax_acc, "accuracy", "next-token accuracy"), (ax_nll, "nll", "NLL of the gold token")):
        ax.plot(ks, _series(report["horizon"], f"tf_{key}"), "o-", label="prefix = reference (teacher forcing)")
        ax.plot(ks, _series(report["horizon"], f"free_{key}"), "s--", label="prefix = own greedy output")
        ax.set(xlabel="prefix length k (tokens)", ylabel=label, title=f"{label.capitalize()} vs horizon")
        ax.grid(alpha=0.3)
        ax.legend()
    ax_acc.set_ylim(-0.02, 1.02)
    recovery = report["recovery"]
    if recovery:
        x = list(range(len(recovery)))
        ax_rec.bar([i - 0.2 for i in x], _series(recovery, "recovery_rate"), 0.4, label="recovery rate")
        ax_rec.bar([i + 0.2 for i in x], _series(recovery, "metric_drop"), 0.4,
                   label=f"{report['gap']['metric']} drop (clean − injected)")
        ax_rec.set_xticks(x, [f"{row['j']}\n(n={row['count']})" for row in recovery])
        ax_rec.axhline(0.0, color="black", linewidth=0.8)
        ax_rec.legend()
    else:
        ax_rec.text(0.5, 0.5, "no position to inject\n(references too short)", ha="center", va="center")
    ax_rec.set(xlabel="position j of the injected mistake", ylabel="fraction / metric (0–1)",
               title="Recovery from an injected mistake")
    ax_rec.grid(alpha=0.3, axis="y")
    gap = report["gap"]
    fig.suptitle(
        f"Exposure-bias diagnostics ({gap['num_examples']} examples)\n"
        f"teacher forcing: NLL {gap['tf_nll']:.3f}/token, accuracy {gap['tf_accuracy']:.1%}   |   "
        f"free-running greedy: {gap['metric']} {gap['free_metric']:.3f}, length {gap['free_length']:.1f} vs "
        f"reference {gap['reference_length']:.1f} tokens, {gap['free_stopped_rate']:.0%} stopped with EOS")
    fig.savefig(path, dpi=110)
    return path


def write_report(report: dict, output_dir: str) -> dict[str, str]:
    """Returns the paths `{"json": ..., "png": ...}` of `diagnostics.json` and `diagnostics.png` in `output_dir`."""
    os.makedirs(output_dir, exist_ok=True)
    paths = {"json": os.path.join(output_dir, "diagnostics.json"), "png": os.path.join(output_dir, "diagnostics.png")}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, allow_nan=False)
    plot_diagnostics(report, paths["png"])
    return paths


def _read_records(path: str) -> list[dict]:
    ext = os.path.splitext(path[:-3] if path.endswith(".gz") else path)[1].lower()
    if ext in (".csv", ".tsv"):
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f, delimiter="\t" if ext == ".tsv" else ","))
    if ext not in (".json", ".jsonl"):
        raise ValueError(f"{path}: unsupported file type {ext!r}; give a .json, .jsonl, .csv or .tsv file.")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # JSON lines
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1 and all(isinstance(r, dict) for r in lists[0]):  # {"data": [records]}
            return lists[0]
        if lists and len(lists) == len(data):  # {"column": [values]}
            return [dict(zip(data, values)) for values in zip(*data.values())]
        return [data]
    return data


def load_pairs(path: str, source_column: str = "source", target_column: str = "target",
               max_examples: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Returns `(sources, references)` read from a local .json / .jsonl / .csv / .tsv file.

    A target cell may be a string or a list of references (SciTLDR's `target`); a source cell that is a list of
    strings (SciTLDR's sentences) is joined with spaces.
    """
    records = _read_records(path)
    if not records:
        raise ValueError(f"{path} has no rows.")
    for column, flag in ((source_column, "source_column"), (target_column, "target_column")):
        if column not in records[0]:
            raise KeyError(f"{path}: no column {column!r} (set {flag} / --{flag.replace('_', '-')}); available "
                           f"columns: {', '.join(map(str, records[0]))}.")
    sources, targets = [], []
    for i, record in enumerate(records[:max_examples]):
        source = record.get(source_column)
        if isinstance(source, list):
            source = " ".join(str(s).strip() for s in source)
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"{path}: row {i} has an empty or non-string {source_column!r}.")
        sources.append(source)
        targets.append(record.get(target_column))
    return sources, normalize_references(targets, field_name=f"{path}: {target_column}")


def format_summary(report: dict) -> str:
    """Returns a short plain-text table of the headline numbers, the horizon curves and the recovery."""
    def fmt(value):
        return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = [f"{'summary':<24}value"] + [f"{key:<24}{fmt(report['summary'][key])}" for key in SUMMARY_KEYS]
    lines += ["", f"{'k':>4}{'count':>7}{'tf_acc':>9}{'free_acc':>10}{'tf_nll':>9}{'free_nll':>10}"]
    lines += [f"{r['k']:>4}{r['count']:>7}{fmt(r['tf_accuracy']):>9}{fmt(r['free_accuracy']):>10}"
              f"{fmt(r['tf_nll']):>9}{fmt(r['free_nll']):>10}" for r in report["horizon"]]
    lines += ["", f"{'j':>4}{'count':>7}{'recovery':>10}{'delay':>8}{'clean':>9}{'injected':>10}{'drop':>9}"]
    lines += [f"{r['j']:>4}{r['count']:>7}{fmt(r['recovery_rate']):>10}{fmt(r['mean_tokens_to_rejoin']):>8}"
              f"{fmt(r['clean_metric']):>9}{fmt(r['injected_metric']):>10}{fmt(r['metric_drop']):>9}"
              for r in report["recovery"]]
    return "\n".join(lines)


def add_diagnose_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Returns `parser` with the `hf-seqrl diagnose` arguments added and `func` set to `diagnose_from_args`."""
    parser.add_argument("--model", required=True, help="Local directory of a seq2seq model and its tokenizer.")
    parser.add_argument("--data", required=True, help="A .json, .jsonl, .csv or .tsv file of source/target pairs.")
    parser.add_argument("--source-column", default="source")
    parser.add_argument("--target-column", default="target", help="A string or a list of references per row.")
    parser.add_argument("--output", default="hf_seqrl_diagnostics", help="Where diagnostics.json/.png go.")
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--metric", default="bleu", choices=METRICS)
    parser.add_argument("--max-horizon", type=int, default=20)
    parser.add_argument("--inject-positions", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--device", default=None, help="Default: cuda if available, else cpu.")
    parser.set_defaults(func=diagnose_from_args)
    return parser


def diagnose_from_args(args: argparse.Namespace) -> int:
    """Returns 0 after loading the model and data named in `args`, running the diagnostics and writing the report."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    sources, references = load_pairs(args.data, args.source_column, args.target_column, args.max_examples)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, trust_remote_code=False).to(device)
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=False)
    report = run_diagnostics(model, tokenizer, sources, references, max_horizon=args.max_horizon,
                             inject_positions=args.inject_positions, metric=args.metric, batch_size=args.batch_size,
                             max_new_tokens=args.max_new_tokens)
    paths = write_report(report, args.output)
    print(format_summary(report))
    print(f"\nwrote {paths['json']} and {paths['png']}")
    return 0


def diagnose_main(argv: list[str] | None = None) -> int:
    """Returns the exit status of `hf-seqrl diagnose` run with `argv` (default: sys.argv[1:])."""
    parser = add_diagnose_arguments(argparse.ArgumentParser(
        prog="hf-seqrl diagnose", description="Exposure-bias diagnostics of a seq2seq model on a data file."))
    args = parser.parse_args(argv)
    return args.func(args)


class DiagnosticsCallback(TrainerCallback):
    """Runs `run_diagnostics` on a small held-out set at every `every`-th evaluation.

    The headline numbers join the evaluation metrics as `eval_diag/<name>` (returned by `trainer.evaluate()`)
    and the evaluation entry of `state.log_history`. The Trainer logs its metrics before `on_evaluate`, so
    reporting integrations (TensorBoard, W&B) do not receive them. Every process runs the diagnostics, so that
    sharded models (FSDP, ZeRO-3) decode in lockstep.
    """

    def __init__(self, tokenizer, sources: Sequence[str], references: Sequence[Any], every: int = 1, **run_kwargs):
        self.tokenizer, self.sources, self.references = tokenizer, list(sources), list(references)
        self.every, self.run_kwargs, self.num_evaluations = max(1, int(every)), run_kwargs, 0
        self.last_report: dict | None = None

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        self.num_evaluations += 1
        if model is None or (self.num_evaluations - 1) % self.every:
            return
        run_kwargs = {"progress": False, **self.run_kwargs}
        self.last_report = run_diagnostics(model, self.tokenizer, self.sources, self.references, **run_kwargs)
        values = {f"eval_diag/{key}": value for key, value in self.last_report["summary"].items() if value is not None}
        if metrics is not None:
            metrics.update(values)
        # The eval entry was appended to log_history just before this event: extend it rather than add a row.
        if state.log_history and metrics is not None and set(metrics) & set(state.log_history[-1]):
            state.log_history[-1].update(values)
        else:
            state.log_history.append({**values, "step": state.global_step})
        if state.is_world_process_zero:
            logger.info("diagnostics: " + ", ".join(f"{k}={v:.4f}" for k, v in values.items()))
