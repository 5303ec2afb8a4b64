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
   Only content positions (before the gold EOS, not special tokens) are injected. The metric drop is the mean
   sentence metric of clean greedy decoding from `gold[:j]` minus that of decoding from the corrupted prefix.

4. Source reliance: the teacher-forced NLL of each gold target under *another* source of its batch (sources
   rotated by one) minus its NLL under its own source (`source_nll_gap`, nats per token), and the share of
   distinct greedy outputs (`distinct_rate`). A gap near 0 and a low distinct rate mean the model writes one
   generic output whatever the source: its metric differences are then template switches, not translation or
   summarization. Batches of one source have no other source and add nothing to the gap.

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

from .data import strip_start_token
from .losses import token_logprobs_from_logits
from .metrics import corpus_scores
from .rewards import get_reward, normalize_references
from .rollout import (completion_mask, decoder_start_id, ended_with_eos, eos_ids, expand_encoder_states, pad_id,
                      rollout_generation_config, shift_right, strip_decoded)

logger = logging.get_logger(__name__)

METRICS = ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum")
SUMMARY_KEYS = ("tf_nll", "tf_accuracy", "free_metric", "length_ratio", "horizon_gap", "horizon_accuracy_gap",
                "recovery_rate", "recovery_delay", "metric_drop", "source_nll_gap", "distinct_rate")


def greedy_generation_config(model, max_new_tokens: int) -> GenerationConfig:
    """Returns `rollout_generation_config` switched to plain greedy decoding (no beams, penalties, min lengths).

    The free-running outputs must be the argmax path of the distribution whose NLL the horizon curve measures.
    """
    config = rollout_generation_config(model, max_new_tokens)
    config.do_sample, config.top_k, config.top_p, config.temperature = False, None, None, None
    return config


def corpus_metric(predictions: list[str], references: list[list[str]], metric: str) -> float:
    """Returns corpus BLEU / chrF (sacrebleu, all references) or the mean sentence ROUGE F1, in [0, 1]."""
    return min(1.0, corpus_scores(predictions, references, (metric,))[metric] / 100.0)


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


def _decode(model, enc: dict, config: GenerationConfig, prefix: torch.Tensor | None = None):
    """Returns greedy decodes after the start token, their lengths before EOS, and whether each emitted EOS.

    Returns: token ids `(N, T)` (forced `prefix` included, pad after EOS), lengths `(N,)`, has_eos `(N,)`.
    """
    out, mask = strip_decoded(model.generate(**enc, generation_config=config, decoder_input_ids=prefix), model)
    has_eos = ended_with_eos(out, mask, eos_ids(model))
    return out, mask.sum(dim=1) - has_eos.long(), has_eos


def _position_stats(model, enc: dict, encoded, labels: torch.Tensor, greedy: torch.Tensor, banned: torch.Tensor):
    """Returns per-position NLL and correctness of the gold token under gold and greedy prefixes, and wrong tokens.

    One decoder forward over `encoded` (the encoder output of `enc`): a gold row and a greedy row per source.

    Args:
        labels (`torch.LongTensor` of shape `(B, T)`): gold tokens, -100 at padding.
        greedy (`torch.LongTensor` of shape `(B, T')`): greedy tokens, pad after EOS.
        banned (`torch.LongTensor` of shape `(S,)`): ids never injected as a mistake (EOS, pad, special tokens).

    Returns: `nll` and `correct` of shape `(B, 2, T)` (index 0 = gold prefix, 1 = greedy prefix), and `wrong`
    `(B, T)`: the most likely token other than the gold one after each gold prefix.
    """
    batch, length = labels.shape
    start, pad = decoder_start_id(model), pad_id(model)
    free = torch.nn.functional.pad(greedy, (0, max(0, length - greedy.shape[1])), value=pad)[:, :length]
    rows = torch.stack([shift_right(labels, start, pad), shift_right(free, start, pad)], dim=1).flatten(0, 1)
    with expand_encoder_states(model, 2):
        logits = model(encoder_outputs=encoded, attention_mask=enc["attention_mask"], decoder_input_ids=rows,
                       use_cache=False).logits.float()
    targets = labels.clamp(min=0)
    nll = -token_logprobs_from_logits(logits, targets.repeat_interleave(2, dim=0)).view(batch, 2, length)
    correct = (logits.argmax(dim=-1).view(batch, 2, length) == targets.unsqueeze(1)).float()
    # The k best gold-prefix candidates always hold one that is neither banned nor the gold token.
    candidates = logits.view(batch, 2, length, -1)[:, 0].topk(min(banned.numel() + 2, logits.shape[-1]), dim=-1).indices
    allowed = ~torch.isin(candidates, banned) & (candidates != targets.unsqueeze(-1))
    wrong = candidates.gather(-1, allowed.float().argmax(dim=-1, keepdim=True)).squeeze(-1)
    return nll, correct, wrong


def _other_source_nll(model, enc: dict, encoded, labels: torch.Tensor) -> torch.Tensor | None:
    """Returns the per-position NLL `(B, T)` of each gold row when the decoder reads the encoder output of the next
    source of the batch (`encoded` rotated by one), or None for a batch of one source."""
    if labels.shape[0] < 2:
        return None
    other = type(encoded)(last_hidden_state=encoded.last_hidden_state.roll(-1, dims=0))
    rows = shift_right(labels, decoder_start_id(model), pad_id(model))
    logits = model(encoder_outputs=other, attention_mask=enc["attention_mask"].roll(-1, dims=0),
                   decoder_input_ids=rows, use_cache=False).logits.float()
    return -token_logprobs_from_logits(logits, labels.clamp(min=0))


def _mean(total: float, count: float) -> float | None:
    # None, not NaN, keeps the report strict JSON.
    value = float(total) / count if count else None
    return value if value is None or math.isfinite(value) else None


class _Totals:
    """Running sums over batches, turned into the report's sections by `report`."""

    def __init__(self, max_horizon: int, positions: list[int]):
        self.horizon = torch.zeros(5, max_horizon, dtype=torch.float64)  # tf nll, tf ok, free nll, free ok, count
        self.tf_nll = self.tf_correct = self.tokens = 0.0
        self.source_gap = self.source_tokens = 0.0  # summed (other-source NLL - own-source NLL), and its tokens
        self.predictions, self.free_lengths, self.stopped = [], [], 0
        self.recovery = {j: dict(count=0, recovered=0, delay=0, clean=0.0, injected=0.0) for j in positions}

    def add_positions(self, labels, greedy_lengths, nll, correct):
        """Adds the teacher-forced totals and the paired horizon sums of a batch (shapes as `_position_stats`)."""
        is_gold = labels != -100
        self.tf_nll += float(nll[:, 0][is_gold].sum())
        self.tf_correct += float(correct[:, 0][is_gold].sum())
        self.tokens += float(is_gold.sum())
        horizon = min(self.horizon.shape[1], labels.shape[1])
        k = torch.arange(horizon, device=labels.device)
        # Paired: both curves count an example at k only if its greedy output was still running at k.
        valid = (is_gold[:, :horizon] & (k.unsqueeze(0) <= greedy_lengths.unsqueeze(1))).float()
        for row, values in enumerate([nll[:, 0], correct[:, 0], nll[:, 1], correct[:, 1], torch.ones_like(valid)]):
            self.horizon[row, :horizon] += (values[:, :horizon] * valid).sum(dim=0).double().cpu()

    def add_source_gap(self, labels, nll, other_nll):
        """Adds the gold tokens' NLL under another source minus under their own (shapes as `_position_stats`)."""
        if other_nll is not None:
            is_gold = labels != -100
            self.source_gap += float((other_nll - nll[:, 0])[is_gold].sum())
            self.source_tokens += float(is_gold.sum())

    def report(self, references, gold_content: list[int], metric: str) -> dict:
        """Returns the `gap`, `horizon`, `recovery` and `summary` sections."""
        n = len(references)
        gap = dict(metric=metric, num_examples=n, num_tokens=int(self.tokens), tf_nll=_mean(self.tf_nll, self.tokens),
                   tf_accuracy=_mean(self.tf_correct, self.tokens),
                   free_metric=corpus_metric(self.predictions, references, metric),
                   free_length=sum(self.free_lengths) / n, reference_length=sum(gold_content) / n,
                   free_stopped_rate=self.stopped / n, source_nll_gap=_mean(self.source_gap, self.source_tokens),
                   distinct_rate=len(set(self.predictions)) / n)
        gap["tf_perplexity"] = _mean(math.exp(min(gap["tf_nll"], 700.0)), 1) if gap["tf_nll"] is not None else None
        gap["length_ratio"] = _mean(gap["free_length"], gap["reference_length"])
        (tf_nll, tf_ok, free_nll, free_ok, count) = self.horizon.tolist()
        horizon = [dict(k=k, count=int(count[k]), tf_accuracy=_mean(tf_ok[k], count[k]),
                        tf_nll=_mean(tf_nll[k], count[k]), free_accuracy=_mean(free_ok[k], count[k]),
                        free_nll=_mean(free_nll[k], count[k]))
                   for k in range(len(count)) if count[k] > 0]
        rec = [dict(j=j, count=s["count"], recovery_rate=_mean(s["recovered"], s["count"]),
                    mean_tokens_to_rejoin=_mean(s["delay"], s["recovered"]), clean_metric=_mean(s["clean"], s["count"]),
                    injected_metric=_mean(s["injected"], s["count"]),
                    metric_drop=_mean(s["clean"] - s["injected"], s["count"]))
               for j, s in self.recovery.items() if s["count"]]
        total = {key: sum(s[key] for s in self.recovery.values()) for key in ("count", "recovered", "delay")}
        summary = dict(
            tf_nll=gap["tf_nll"], tf_accuracy=gap["tf_accuracy"], free_metric=gap["free_metric"],
            length_ratio=gap["length_ratio"],
            # token-weighted means over k >= 1, where the prefixes can differ
            horizon_gap=_mean(sum(free_nll[1:]) - sum(tf_nll[1:]), sum(count[1:])),
            horizon_accuracy_gap=_mean(sum(tf_ok[1:]) - sum(free_ok[1:]), sum(count[1:])),
            recovery_rate=_mean(total["recovered"], total["count"]),
            recovery_delay=_mean(total["delay"], total["recovered"]),
            metric_drop=_mean(sum(s["clean"] - s["injected"] for s in self.recovery.values()), total["count"]),
            source_nll_gap=gap["source_nll_gap"], distinct_rate=gap["distinct_rate"])
        return dict(gap=gap, horizon=horizon, recovery=rec, summary=summary)


def _recovery_batch(model, tokenizer, enc, labels, wrong, gold, references, j, budget, config, reward_fn, window,
                    stats):
    """Adds to `stats` the recovery counts and clean / injected metrics of decoding after position `j`.

    Args:
        enc: the sources of the rows still holding a content token at `j`; labels (`(N, T)`), wrong (`(N, T)`) the
            same rows as in `_position_stats`; gold, references: their token lists and reference rows.
    """
    prefix = shift_right(labels[:, : j + 1], decoder_start_id(model), pad_id(model))  # start + gold[:j]
    outputs = []
    for forced, new in ((prefix, budget - j), (torch.cat([prefix, wrong[:, j : j + 1]], dim=1), budget - j - 1)):
        config.max_new_tokens = max(new, 1)  # equal total lengths for the clean and the injected decode
        outputs.append(_decode(model, enc, config, forced)[0])
    clean, injected = outputs
    scores = [reward_fn(tokenizer.batch_decode(ids, skip_special_tokens=True), references) for ids in outputs]
    stats["count"] += len(references)
    stats["clean"] += sum(scores[0])
    stats["injected"] += sum(scores[1])
    ends = completion_mask(injected, eos_ids(model)).sum(dim=1).tolist()  # the continuation ends at its EOS
    for r, tokens in enumerate(gold):
        delay = rejoin_delay(injected[r, j + 1 : ends[r]].tolist(), tokens, j, window)
        if delay is not None:
            stats["recovered"] += 1
            stats["delay"] += delay


def run_diagnostics(model, tokenizer, sources: Sequence[str], references: Sequence[Any], *, max_horizon: int = 20,
                    inject_positions: Sequence[int] = (0, 1, 2, 4, 8), metric: str = "bleu", batch_size: int = 32,
                    max_new_tokens: int | None = None, max_examples: int | None = None, recovery_window: int = 4,
                    max_source_length: int | None = None, progress: bool = True) -> dict:
    """Returns the exposure-bias report, a JSON-serializable dict: `gap`, `horizon`, `recovery`, `summary`, `config`.

    Args:
        model: an encoder-decoder `PreTrainedModel` (left in its original train/eval mode afterwards).
        sources (`list[str]`), references (`list[str | list[str]]`): one row per source; the first reference is
            the teacher-forcing target, metrics use all of them.
        max_horizon (`int`): number of positions `k` on the horizon curve.
        inject_positions (`tuple[int]`): positions `j` where a mistake is injected.
        metric (`str`): "bleu" | "chrf" (sacrebleu corpus score for the gap, sentence score for the drop) or a
            ROUGE name (mean sentence F1).
        batch_size (`int`): sources per forward / `generate` call.
        max_new_tokens (`int`, *optional*): decode budget; defaults to twice the longest gold target plus 10.
        max_examples (`int`, *optional*): use only the first examples.
        recovery_window (`int`): how many consecutive gold tokens a continuation must reproduce to rejoin.
        max_source_length (`int`, *optional*): truncate sources to this many tokens.
        progress (`bool`): show a tqdm progress bar over batches.
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
    # Learned position tables (BART, Marian) end at max_position_embeddings; the start token takes a position.
    limit = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    gold = tokenizer(text_target=[refs[0] for refs in references], truncation=limit is not None,
                     max_length=limit)["input_ids"]
    gold = strip_start_token(gold, decoder_start_id(model))
    gold_content = [next((i for i, t in enumerate(g) if t in eos), len(g)) for g in gold]  # tokens before EOS
    budget = max_new_tokens or 2 * max(len(g) for g in gold) + 10
    budget = min(budget, limit - 1) if limit else budget
    config = greedy_generation_config(model, budget)
    vocab = model.get_output_embeddings().weight.shape[0]
    special = [*eos, pad_id(model), decoder_start_id(model), *tokenizer.all_special_ids]
    banned_ids = {i for i in special if 0 <= i < vocab}
    banned = torch.tensor(sorted(banned_ids), device=device)
    reward_fn = get_reward(metric)
    positions = sorted(set(int(j) for j in inject_positions))
    if positions and positions[0] < 0:
        raise ValueError(f"inject_positions must be >= 0, got {positions[0]}.")
    totals = _Totals(max_horizon, positions)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for lo in tqdm(range(0, len(sources), batch_size), desc="diagnostics", disable=not progress):
                idx = list(range(lo, min(lo + batch_size, len(sources))))
                enc = tokenizer([sources[i] for i in idx], return_tensors="pt", padding=True,
                                truncation=max_source_length is not None, max_length=max_source_length).to(device)
                enc = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
                length = max(len(gold[i]) for i in idx)
                labels = torch.tensor([gold[i] + [-100] * (length - len(gold[i])) for i in idx], device=device)
                config.max_new_tokens = budget
                greedy, greedy_lengths, has_eos = _decode(model, enc, config)
                totals.predictions += tokenizer.batch_decode(greedy, skip_special_tokens=True)
                totals.free_lengths += greedy_lengths.tolist()
                totals.stopped += int(has_eos.sum())
                # The encoder runs once for the teacher-forced rows of both the own and the rotated sources.
                encoded = model.get_encoder()(**enc, return_dict=True)
                nll, correct, wrong = _position_stats(model, enc, encoded, labels, greedy, banned)
                totals.add_positions(labels, greedy_lengths, nll, correct)
                totals.add_source_gap(labels, nll, _other_source_nll(model, enc, encoded, labels))
                for j in positions:
                    # Structural tokens (BART's leading <s>, language codes) are not mistakes one can inject.
                    rows = [r for r, i in enumerate(idx) if j < gold_content[i] and gold[i][j] not in banned_ids]
                    if rows:
                        _recovery_batch(model, tokenizer, {k: v[rows] for k, v in enc.items()}, labels[rows],
                                        wrong[rows], [gold[idx[r]] for r in rows], [references[idx[r]] for r in rows],
                                        j, budget, config, reward_fn, recovery_window, totals.recovery[j])
    finally:
        model.train(was_training)
    report = totals.report(references, gold_content, metric)
    report["config"] = dict(model=getattr(model.config, "_name_or_path", "") or model.config.model_type,
                            metric=metric, max_horizon=max_horizon, inject_positions=positions, batch_size=batch_size,
                            max_new_tokens=budget, max_examples=max_examples, recovery_window=recovery_window,
                            max_source_length=max_source_length, num_examples=len(sources))
    return report


def plot_diagnostics(report: dict, path: str) -> str:
    """Returns `path` after writing a PNG: the horizon curves (accuracy, NLL), the recovery per position, the gap."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("plot_diagnostics needs matplotlib: pip install 'matplotlib>=3.7'.") from err

    def series(rows, key):
        return [math.nan if row[key] is None else row[key] for row in rows]

    # A bare Figure on an Agg canvas leaves pyplot's global backend and figure list alone.
    fig = Figure(figsize=(16, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    ks = [row["k"] for row in report["horizon"]]
    for ax, key, label in zip(axes, ("accuracy", "nll"), ("Next-token accuracy", "NLL of the gold token")):
        ax.plot(ks, series(report["horizon"], f"tf_{key}"), "o-", label="prefix = reference (teacher forcing)")
        ax.plot(ks, series(report["horizon"], f"free_{key}"), "s--", label="prefix = own greedy output")
        better = "higher" if key == "accuracy" else "lower"
        ax.set(xlabel="prefix length k (tokens)", ylabel=f"{label} ({better} is better)", title=f"{label} vs horizon")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    # One legend below both horizon panels, where it cannot hide a point.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower left", ncol=2)
    rec, gap = report["recovery"], report["gap"]
    x = range(len(rec))
    axes[2].bar([i - 0.2 for i in x], series(rec, "recovery_rate"), 0.4, label="recovery rate")
    drop_label = f"{gap['metric']} drop (clean − injected)"
    axes[2].bar([i + 0.2 for i in x], series(rec, "metric_drop"), 0.4, label=drop_label)
    axes[2].set_xticks(list(x), [f"{row['j']}\n(n={row['count']})" for row in rec])
    axes[2].axhline(0.0, color="black", linewidth=0.8)
    axes[2].set(xlabel="position j of the injected mistake", ylabel="fraction / metric (0–1)",
                title="Recovery from an injected mistake", ylim=(min([0.0, *series(rec, "metric_drop")]) - 0.05, 1.3))
    axes[2].grid(alpha=0.3, axis="y")
    axes[2].legend(loc="upper center", ncol=2)
    fig.suptitle(
        f"Exposure-bias diagnostics ({gap['num_examples']} examples)\n"
        f"teacher forcing: NLL {gap['tf_nll'] or math.nan:.3f}/token, accuracy {gap['tf_accuracy'] or 0:.1%}   |   "
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
    """Returns the rows of a .csv / .tsv file, a JSON list of objects, or a JSON-lines file."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".csv", ".tsv", ".json", ".jsonl"):
        raise ValueError(f"{path}: unsupported file type {ext!r}; give a .json, .jsonl, .csv or .tsv file.")
    with open(path, newline="" if ext in (".csv", ".tsv") else None, encoding="utf-8") as f:
        if ext in (".csv", ".tsv"):
            return list(csv.DictReader(f, delimiter="\t" if ext == ".tsv" else ","))
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON lines ({err}); give one JSON object per line or a JSON list.") from err


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
            raise ValueError(f"{path}: no column {column!r} (set {flag} / --{flag.replace('_', '-')}); available "
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
    """Returns a plain-text table of the headline numbers, the horizon curves and the recovery per position."""
    def row(values, widths=(5, 7, 10, 10, 10, 10, 10)):
        cells = ["-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v) for v in values]
        return "".join(f"{cell:>{width}}" for cell, width in zip(cells, widths))

    lines = [f"{key:<22}{row([report['summary'][key]], (10,))}" for key in SUMMARY_KEYS]
    lines += ["", row(["k", "count", "tf_acc", "free_acc", "tf_nll", "free_nll"])]
    lines += [row([r[key] for key in ("k", "count", "tf_accuracy", "free_accuracy", "tf_nll", "free_nll")])
              for r in report["horizon"]]
    lines += ["", row(["j", "count", "recovery", "delay", "clean", "injected", "drop"])]
    lines += [row([r[key] for key in ("j", "count", "recovery_rate", "mean_tokens_to_rejoin", "clean_metric",
                                      "injected_metric", "metric_drop")]) for r in report["recovery"]]
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


def load_model_and_pairs(args: argparse.Namespace):
    """Returns `(model, tokenizer, sources, references)` named by the `--model`, `--data`, column, `--max-examples`
    and `--device` arguments shared by `hf-seqrl diagnose` and `hf-seqrl evaluate`."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    sources, references = load_pairs(args.data, args.source_column, args.target_column, args.max_examples)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, trust_remote_code=False).to(device)
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=False)
    return model, tokenizer, sources, references


def diagnose_from_args(args: argparse.Namespace) -> int:
    """Returns 0 after loading the model and data named in `args`, running the diagnostics and writing the report."""
    model, tokenizer, sources, references = load_model_and_pairs(args)
    report = run_diagnostics(model, tokenizer, sources, references, max_horizon=args.max_horizon,
                             inject_positions=args.inject_positions, metric=args.metric, batch_size=args.batch_size,
                             max_new_tokens=args.max_new_tokens, max_examples=args.max_examples)
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

    The headline numbers join the evaluation metrics as `eval_diag/<name>` (returned by `trainer.evaluate()`).
    The Trainer logs its metrics before `on_evaluate`; a callback bound to its trainer (`bind_trainer`, done
    by the hf-seqrl trainers themselves) logs the diagnostics as one more entry, so reporting integrations
    (TensorBoard, W&B) receive them; unbound, they extend the evaluation entry of `state.log_history`. Every
    process runs the diagnostics, so that sharded models (FSDP, ZeRO-3) decode in lockstep.
    """

    def __init__(self, tokenizer, sources: Sequence[str], references: Sequence[Any], every: int = 1, **run_kwargs):
        self.tokenizer, self.sources, self.references = tokenizer, list(sources), list(references)
        self.every, self.run_kwargs, self.num_evaluations = max(1, int(every)), run_kwargs, 0
        self.last_report: dict | None = None
        self.trainer = None

    def bind_trainer(self, trainer) -> "DiagnosticsCallback":
        """Logs the diagnostics through `trainer` (to its reporting integrations); returns the callback."""
        self.trainer = trainer
        return self

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        self.num_evaluations += 1
        if model is None or (self.num_evaluations - 1) % self.every:
            return
        run_kwargs = {"progress": False, **self.run_kwargs}
        self.last_report = run_diagnostics(model, self.tokenizer, self.sources, self.references, **run_kwargs)
        values = {f"eval_diag/{key}": value for key, value in self.last_report["summary"].items() if value is not None}
        if metrics is not None:
            metrics.update(values)
        if self.trainer is not None:
            from transformers import Trainer

            # The base `log`: hf-seqrl's own would flush its buffered train metrics into this entry.
            Trainer.log(self.trainer, dict(values))
        else:
            last = state.log_history[-1] if state.log_history else {}
            if metrics and all(key in last for key in metrics if key not in values):
                # Trainer.evaluate logged its metrics just before this event: extend that entry, not a new row.
                last.update(values)
            else:
                state.log_history.append({**values, "step": state.global_step})
        if state.is_world_process_zero:
            logger.info("diagnostics: " + ", ".join(f"{k}={v:.4f}" for k, v in values.items()))
