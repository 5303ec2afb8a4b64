"""The measurements behind `run_diagnostics`: teacher-forced and free-running passes, horizon curves, recovery
from injected mistakes and source reliance, summed over batches into one report (see the package docstring)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig

from ..data import normalize_references, tokenize_sources, tokenize_targets
from ..functional.logprobs import token_logprobs_from_logits
from ..evaluation import check_sources, corpus_scores
from ..models import family_for
from ..models.base import eval_mode
from ..models.tokens import completion_mask, ended_with_eos, eos_ids, pad_id
from ..models.languages import decode_texts
from ..rewards import get_reward
from .jacobian import JacobianTotals, jacobian_curves

METRICS = ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum")
BUDGET_EXTRA_TOKENS = 10  # added to the reference-relative budget: short references still leave room to go wrong


def greedy_generation_config(model, max_new_tokens: int) -> GenerationConfig:
    """Returns `rollout_generation_config` switched to plain greedy decoding (no beams, penalties, min lengths).

    The free-running outputs must be the argmax path of the distribution whose NLL the horizon curve measures.
    """
    config = family_for(model).generation_config(model, max_new_tokens)
    config.do_sample, config.top_k, config.top_p, config.temperature = False, None, None, None
    return config


def corpus_metric(predictions: list[str], references: list[list[str]], metric: str) -> float:
    """Returns corpus BLEU / chrF (sacrebleu, all references) or the mean sentence ROUGE F1, in [0, 100] as
    `hf_seqrl.evaluation.corpus_scores` gives them."""
    return corpus_scores(predictions, references, (metric,))[metric]


def decode_budget(reference_lengths: Sequence[int], ratio: float, max_new_tokens: int | None = None,
                  limit: int | None = None, source_lengths: Sequence[int] | None = None) -> int:
    """Returns the new-token budget of one batch's greedy decodes: `max_new_tokens` when given, else `ratio` times
    the longest reference of the batch's rows (every reference: the gold is chosen after decoding) plus
    `BUDGET_EXTRA_TOKENS`, and at most `ratio` times its longest source (in tokens) plus as much; below `limit` (the
    decoder's position table) when there is one.

    A row's budget follows its own batch, not the longest reference of the whole set: a model that never writes EOS
    decodes the whole budget in each of the `1 + 2 * len(inject_positions)` decodes of a batch. The source's cap binds
    where outputs are as long as their sources (translation); a summary's references bind before it.
    """
    budget = max_new_tokens or math.ceil(ratio * max(reference_lengths)) + BUDGET_EXTRA_TOKENS
    if max_new_tokens is None and source_lengths:
        budget = min(budget, math.ceil(ratio * max(source_lengths)) + BUDGET_EXTRA_TOKENS)
    return max(1, min(budget, limit - 1)) if limit else budget


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


def closest_references(predictions: Sequence[str], references: Sequence[Sequence[str]], reward_fn) -> list[int]:
    """Returns, per prediction, the index of its reference with the highest sentence score (ties: the lowest index).

    Args:
        predictions: one output per row; references: the rows of references, several or one per output.
        reward_fn: a sentence metric called as `reward_fn(predictions=..., references=..., sources=None)`, each
            prediction against one reference at a time. Rows of one reference are not scored.
    """
    pairs = [(row, r) for row, refs in enumerate(references) if len(refs) > 1 for r in range(len(refs))]
    chosen = [0] * len(predictions)
    if not pairs:
        return chosen
    scores = reward_fn(predictions=[predictions[row] for row, _ in pairs],
                       references=[[references[row][r]] for row, r in pairs], sources=None)
    best: dict[int, float] = {}
    for (row, r), score in zip(pairs, scores):
        if row not in best or score > best[row]:
            best[row], chosen[row] = score, r
    return chosen


def _decode(model, enc: dict, config: GenerationConfig, prefix: torch.Tensor | None = None):
    """Returns greedy decodes (target tokens), their lengths before EOS, and whether each emitted EOS.

    Returns: token ids `(N, T)` (forced `prefix` `(N, k)` included, pad after EOS), lengths `(N,)`, has_eos `(N,)`.
    """
    out, mask = family_for(model).continue_from(model, enc, prefix, config)
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
    free = torch.nn.functional.pad(greedy, (0, max(0, length - greedy.shape[1])), value=pad_id(model))[:, :length]
    rows = torch.stack([labels, free], dim=1).flatten(0, 1)
    logits = family_for(model).target_forward(model, encoded, rows, group=2).logits.float()
    targets = labels.clamp(min=0)
    nll = -token_logprobs_from_logits(logits, targets.repeat_interleave(2, dim=0)).view(batch, 2, length)
    correct = (logits.argmax(dim=-1).view(batch, 2, length) == targets.unsqueeze(1)).float()
    # The k best gold-prefix candidates always hold one that is neither banned nor the gold token.
    candidates = logits.view(batch, 2, length, -1)[:, 0].topk(min(banned.numel() + 2, logits.shape[-1]), dim=-1).indices
    allowed = ~torch.isin(candidates, banned) & (candidates != targets.unsqueeze(-1))
    wrong = candidates.gather(-1, allowed.float().argmax(dim=-1, keepdim=True)).squeeze(-1)
    return nll, correct, wrong


def _other_source_nll(model, enc: dict, encoded, labels: torch.Tensor) -> torch.Tensor | None:
    """Returns the per-position NLL `(B, T)` of each gold row when the model reads the next source (prompt) of the
    batch (`encoded` rotated by one), or None for a batch of one source."""
    if labels.shape[0] < 2:
        return None
    family = family_for(model)
    logits = family.target_forward(model, family.rotate(encoded), labels).logits.float()
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
                   free_stopped_rate=self.stopped / n, never_stopped=n - self.stopped,
                   source_nll_gap=_mean(self.source_gap, self.source_tokens),
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
            source_nll_gap=gap["source_nll_gap"], distinct_rate=gap["distinct_rate"],
            never_stopped_rate=gap["never_stopped"] / n)
        return dict(gap=gap, horizon=horizon, recovery=rec, summary=summary)


def _recovery_batch(model, tokenizer, enc, labels, wrong, gold, references, j, budget, config, reward_fn, window,
                    stats):
    """Adds to `stats` the recovery counts and clean / injected metrics of decoding after position `j`.

    Args:
        enc: the sources of the rows still holding a content token at `j`; labels (`(N, T)`), wrong (`(N, T)`) the
            same rows as in `_position_stats`; gold, references: their token lists and reference rows.
    """
    prefix = labels[:, :j]  # gold[:j]
    outputs = []
    for forced, new in ((prefix, budget - j), (torch.cat([prefix, wrong[:, j : j + 1]], dim=1), budget - j - 1)):
        config.max_new_tokens = max(new, 1)  # equal total lengths for the clean and the injected decode
        outputs.append(_decode(model, enc, config, forced)[0])
    clean, injected = outputs
    scores = [reward_fn(predictions=decode_texts(tokenizer, ids), references=references,
                        sources=None) for ids in outputs]
    stats["count"] += len(references)
    stats["clean"] += 100.0 * sum(scores[0])  # sentence scores in [0, 1], reported as corpus metrics are: 0-100
    stats["injected"] += 100.0 * sum(scores[1])
    ends = completion_mask(injected, eos_ids(model)).sum(dim=1).tolist()  # the continuation ends at its EOS
    for r, tokens in enumerate(gold):
        delay = rejoin_delay(injected[r, j + 1 : ends[r]].tolist(), tokens, j, window)
        if delay is not None:
            stats["recovered"] += 1
            stats["delay"] += delay


def run_diagnostics(model, tokenizer, sources: Sequence[str], references: Sequence[Any], *, max_horizon: int = 20,
                    inject_positions: Sequence[int] = (0, 1, 2, 4, 8), metric: str = "bleu", batch_size: int = 32,
                    max_new_tokens: int | None = None, max_new_tokens_ratio: float = 2.0,
                    max_examples: int | None = None, recovery_window: int = 4,
                    max_source_length: int | None = None, jacobian_positions: Sequence[int] = (1, 2, 4),
                    jacobian_horizon: int = 8, jacobian_epsilon: float = 1e-3, seed: int = 0,
                    progress: bool = True) -> dict:
    """Returns the exposure-bias report, a JSON-serializable dict: `gap`, `horizon`, `recovery`, `summary`, `config`
    and `gold_index` (per example, which of its references was the teacher-forcing target).

    Args:
        model: an encoder-decoder or decoder-only `PreTrainedModel` (left in its original train/eval mode
            afterwards).
        sources (`list[str]`), references (`list[str | list[str]]`): one row per source; the teacher-forcing
            target is the reference closest to the greedy output under `metric` (`closest_references`), metrics
            use all of them.
        max_horizon (`int`): number of positions `k` on the horizon curve.
        inject_positions (`tuple[int]`): positions `j` where a mistake is injected.
        metric (`str`): "bleu" | "chrf" (sacrebleu corpus score for the gap, sentence score for the drop) or a
            ROUGE name (mean sentence F1).
        batch_size (`int`): sources per forward / `generate` call.
        max_new_tokens (`int`, *optional*): one decode budget for every batch; max_new_tokens_ratio (`float`):
            without it, each batch's budget is this times the longest reference of its rows plus 10
            (`decode_budget`). The report counts the greedy outputs that ran out of budget without EOS
            (`gap.never_stopped`).
        max_examples (`int`, *optional*): use only the first examples.
        recovery_window (`int`): how many consecutive gold tokens a continuation must reproduce to rejoin.
        max_source_length (`int`, *optional*): truncate sources to this many tokens.
        jacobian_positions (`tuple[int]`): decoder input positions `k` perturbed for the empirical Jacobian (empty:
            skip it); jacobian_horizon (`int`): offsets after `k` measured; jacobian_epsilon (`float`): the
            perturbation's norm as a fraction of the embedding's (see `hf_seqrl.diagnostics.jacobian`).
        seed (`int`): seeds the perturbation directions.
        progress (`bool`): show a tqdm progress bar over the decodes and passes of every batch.
    """
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is not supported: choose one of {', '.join(METRICS)}.")
    family = family_for(model)
    references = normalize_references(references)
    if len(sources) != len(references):
        raise ValueError(f"Got {len(sources)} sources but {len(references)} reference rows: give one row per source.")
    sources, references = list(sources)[:max_examples], references[:max_examples]
    if not sources:
        raise ValueError("run_diagnostics got no examples.")
    if max_new_tokens_ratio <= 0:
        raise ValueError(f"max_new_tokens_ratio must be > 0, got {max_new_tokens_ratio}.")
    check_sources(family, tokenizer, sources, max_source_length)
    device, eos = model.device, eos_ids(model)
    # Learned position tables (BART, Marian) end at max_position_embeddings; the start token takes a position.
    limit = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    flat = iter(tokenize_targets(family, model, tokenizer, [ref for refs in references for ref in refs], limit))
    reference_ids = [[next(flat) for _ in refs] for refs in references]
    longest = [max(len(ids) for ids in row) for row in reference_ids]
    config = greedy_generation_config(model, decode_budget(longest, max_new_tokens_ratio, max_new_tokens, limit))
    vocab = model.get_output_embeddings().weight.shape[0]
    special = [*eos, pad_id(model), *family.structural_ids(model), *tokenizer.all_special_ids]
    banned_ids = {i for i in special if 0 <= i < vocab}
    banned = torch.tensor(sorted(banned_ids), device=device)
    reward_fn = get_reward(metric)
    positions = sorted(set(int(j) for j in inject_positions))
    if positions and positions[0] < 0:
        raise ValueError(f"inject_positions must be >= 0, got {positions[0]}.")
    jacobian_positions = sorted(set(int(k) for k in jacobian_positions))
    if (jacobian_positions and jacobian_positions[0] < 0) or jacobian_horizon < 1 or not 0 < jacobian_epsilon < 1:
        raise ValueError("jacobian_positions must be >= 0, jacobian_horizon >= 1 and jacobian_epsilon in (0, 1); got "
                         f"{jacobian_positions}, {jacobian_horizon}, {jacobian_epsilon}.")
    totals = _Totals(max_horizon, positions)
    jacobian = JacobianTotals(jacobian_positions, jacobian_horizon, jacobian_epsilon)
    generator = torch.Generator().manual_seed(seed)
    gold, gold_content, gold_index, budgets = [], [], [], []
    starts = range(0, len(sources), batch_size)
    # One step per decode or pass of a batch: a model that never writes EOS makes each decode last its whole budget.
    bar = tqdm(total=len(starts) * (2 + len(positions)), desc="diagnostics", disable=not progress)
    with eval_mode(model), torch.no_grad(), bar:
        for number, lo in enumerate(starts, 1):
            idx = list(range(lo, min(lo + batch_size, len(sources))))
            enc = tokenize_sources(family, tokenizer, [sources[i] for i in idx], max_source_length)
            enc = {key: value.to(device) for key, value in enc.items()}
            budget = decode_budget([longest[i] for i in idx], max_new_tokens_ratio, max_new_tokens, limit,
                                   enc["attention_mask"].sum(dim=1).tolist())
            budgets.append(budget)
            bar.set_postfix_str(f"batch {number}/{len(starts)}: greedy decode, up to {budget} new tokens")
            config.max_new_tokens = budget
            greedy, greedy_lengths, has_eos = _decode(model, enc, config)
            bar.update()
            bar.set_postfix_str(f"batch {number}/{len(starts)}: teacher-forced passes")
            predictions = decode_texts(tokenizer, greedy)
            gold_index += closest_references(predictions, [references[i] for i in idx], reward_fn)
            gold += [reference_ids[i][gold_index[i]] for i in idx]
            gold_content += [next((t for t, token in enumerate(gold[i]) if token in eos), len(gold[i]))
                             for i in idx]  # tokens before EOS
            length = max(len(gold[i]) for i in idx)
            labels = torch.tensor([gold[i] + [-100] * (length - len(gold[i])) for i in idx], device=device)
            totals.predictions += predictions
            totals.free_lengths += greedy_lengths.tolist()
            totals.stopped += int(has_eos.sum())
            # The encoder runs once for the teacher-forced rows of both the own and the rotated sources.
            encoded = family.encode(model, enc)
            nll, correct, wrong = _position_stats(model, enc, encoded, labels, greedy, banned)
            totals.add_positions(labels, greedy_lengths, nll, correct)
            totals.add_source_gap(labels, nll, _other_source_nll(model, enc, encoded, labels))
            if jacobian_positions:
                jacobian.add(*jacobian_curves(model, enc, encoded, greedy, greedy_lengths + has_eos.long(),
                                              jacobian_positions, jacobian_horizon, jacobian_epsilon, generator))
            bar.update()
            for j in positions:
                bar.set_postfix_str(f"batch {number}/{len(starts)}: recovery from a mistake at {j}")
                # Structural tokens (BART's leading <s>, language codes) are not mistakes one can inject.
                rows = [r for r, i in enumerate(idx) if j < gold_content[i] and gold[i][j] not in banned_ids]
                if rows:
                    _recovery_batch(model, tokenizer, {k: v[rows] for k, v in enc.items()}, labels[rows],
                                    wrong[rows], [gold[idx[r]] for r in rows], [references[idx[r]] for r in rows],
                                    j, budget, config, reward_fn, recovery_window, totals.recovery[j])
                bar.update()
    report = totals.report(references, gold_content, metric)
    report["gap"]["gold_not_first"] = sum(index > 0 for index in gold_index)
    report["gold_index"] = gold_index
    report["jacobian"] = jacobian.report()
    report["summary"]["jacobian_growth"] = report["jacobian"]["growth_factor"]
    report["config"] = dict(model=getattr(model.config, "_name_or_path", "") or model.config.model_type,
                            metric=metric, max_horizon=max_horizon, inject_positions=positions, batch_size=batch_size,
                            max_new_tokens=max_new_tokens, max_new_tokens_ratio=max_new_tokens_ratio,
                            decode_budgets=budgets, max_examples=max_examples, recovery_window=recovery_window,
                            max_source_length=max_source_length, num_examples=len(sources),
                            jacobian_positions=jacobian_positions, jacobian_horizon=jacobian_horizon,
                            jacobian_epsilon=jacobian_epsilon, seed=seed,
                            gold=f"closest reference to the greedy output under {metric} (ties: the first)")
    return report
