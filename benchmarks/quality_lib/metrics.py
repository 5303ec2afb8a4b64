"""What the quality benchmark scores with: the rewarded arms' reward, the corpus and extra metrics of a split, and
the evaluation of a model (test per decoding, dev, exposure-bias diagnostics)."""

from __future__ import annotations

from .settings import Settings
from .task import minilm_path

BERTSCORE_LAYER = 4  # MiniLM's hidden layer that BERTScore matches (of 6), as reward and as metric
_MODEL_METRICS: dict = {}


def model_metric(name: str):
    """Returns the MiniLM model reward `name` (`embedding`: embedding similarity, `bertscore`: BERTScore F1,
    `reward_model`: MiniLM with a fresh one-output head on prediction-reference pairs, for timing only), built once
    per process."""
    if name not in _MODEL_METRICS:
        from hf_seqrl.rewards import BERTScoreReward, EmbeddingSimilarityReward, RewardModelReward

        if name == "embedding":
            _MODEL_METRICS[name] = EmbeddingSimilarityReward(minilm_path())
        elif name == "source_embedding":  # against the source: an English encoder scores a copied source 1.0
            _MODEL_METRICS[name] = EmbeddingSimilarityReward(minilm_path(), compare="sources")
        elif name == "bertscore":
            _MODEL_METRICS[name] = BERTScoreReward(minilm_path(), num_layers=BERTSCORE_LAYER)
        else:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            torch.manual_seed(0)
            head = AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=1)
            _MODEL_METRICS[name] = RewardModelReward(head, AutoTokenizer.from_pretrained(minilm_path()),
                                                     pair="prediction-reference")
    return _MODEL_METRICS[name]


MODEL_REWARDS = ("embedding", "source_embedding", "bertscore", "reward_model")


def guard_part(name: str, settings: Settings):
    """Returns the guard `name` (`settings.guards`): a reward name, or the target-language guard in `guard_lang`
    (its language identifier loaded once per process and language)."""
    if name == "target_language":
        key = f"target_language:{settings.guard_lang}"
        if key not in _MODEL_METRICS:
            from hf_seqrl.rewards import target_language_reward

            _MODEL_METRICS[key] = target_language_reward(settings.guard_lang)
        return _MODEL_METRICS[key]
    return name


def arm_reward(settings: Settings):
    """Returns the `reward_funcs` of the rewarded arms: `settings.reward` (names joined by "+", averaged), else the
    task's first metric; gated by `settings.guards` (`rewards.guard`) when there are any."""
    names = (settings.reward or settings.metrics[0]).split("+")
    funcs = [model_metric(n) if n in MODEL_REWARDS else n for n in names]
    reward = funcs[0] if len(funcs) == 1 else funcs
    if settings.guards:
        from hf_seqrl.rewards import build_reward, guard

        return guard(build_reward(reward) if len(funcs) > 1 else reward,
                     *(guard_part(name, settings) for name in settings.guards))
    return reward


def source_copy(predictions: list[str], sources: list[str]) -> float:
    """Returns the share (in %) of the predictions' word 3-grams that occur in their source: copying the source."""
    def grams(text):
        words = text.lower().split()
        return [tuple(words[i:i + 3]) for i in range(len(words) - 2)]

    found = total = 0
    for prediction, source in zip(predictions, sources):
        mine, theirs = grams(prediction), set(grams(source))
        found += sum(g in theirs for g in mine)
        total += len(mine)
    return 100.0 * found / max(total, 1)


def scored_metrics(settings: Settings) -> tuple[str, ...]:
    """Returns every metric a split is scored with: the task's, then the extra ones."""
    return tuple(settings.metrics) + tuple(settings.extra_metrics)


# ---- evaluation ------------------------------------------------------------------------------------------


def score(model, tokenizer, rows: list[dict], settings: Settings, beams: int, desc: str,
          predictions_out: list | None = None) -> dict[str, float]:
    """Returns the corpus metrics of `model` on `rows`, against every reference of each source (the outputs are
    appended to `predictions_out` when given)."""
    from hf_seqrl.evaluation import generate_texts

    predictions = generate_texts(model, tokenizer, [r["source"] for r in rows], num_beams=beams,
                                 batch_size=settings.eval_batch, max_new_tokens=settings.max_new_tokens,
                                 max_source_length=settings.max_source_tokens, desc=desc)
    if predictions_out is not None:
        predictions_out.extend(predictions)
    return score_predictions(predictions, rows, settings)


def score_predictions(predictions: list[str], rows: list[dict], settings: Settings) -> dict[str, float]:
    """Returns the corpus metrics of `predictions` (one per row of `rows`), against every reference of each source,
    with the extra metrics, the length ratio, BLEU's brevity penalty and the share of distinct outputs."""
    from hf_seqrl.evaluation import corpus_scores

    references = [r["references"] for r in rows]
    out = {name: round(value, 2) for name, value in corpus_scores(predictions, references, settings.metrics).items()}
    for name in settings.extra_metrics:  # sentence scores, best reference, averaged, in %
        if name == "source_copy":
            out[name] = round(source_copy(predictions, [r["source"] for r in rows]), 2)
        elif name in ("target_language", "repetition"):  # the guards as metrics: mean share, in %
            from hf_seqrl.rewards.guards import repetition_rate

            values = guard_part(name, settings)(predictions) if name == "target_language" else \
                [repetition_rate(p) for p in predictions]
            out[name] = round(100.0 * sum(values) / max(len(values), 1), 2)
        else:
            values = model_metric(name)(predictions, references)
            out[name] = round(100.0 * sum(values) / max(len(values), 1), 2)
    # Output words over first-reference words, summed over the rows: how much a metric change is a length change.
    words = sum(len(r["references"][0].split()) for r in rows)
    out["length_ratio"] = round(sum(len(p.split()) for p in predictions) / max(words, 1), 3)
    if "bleu" in out:  # BLEU = brevity penalty × n-gram precisions: the part of a BLEU change due to length
        from hf_seqrl.evaluation import bleu_brevity

        out["bleu_bp"] = round(bleu_brevity(predictions, [r["references"] for r in rows])["bp"], 4)
    # Share of distinct outputs: near 0 when the model writes one template whatever the source.
    out["distinct"] = round(len(set(predictions)) / max(len(predictions), 1), 3)
    return out


def evaluate(model, tokenizer, splits: dict, settings: Settings, name: str) -> dict:
    """Returns test scores per decoding, the dev score (greedy) and the exposure-bias diagnostics summary."""
    from hf_seqrl.diagnostics import run_diagnostics

    result = {"dev": score(model, tokenizer, splits["dev"], settings, 1, f"{name}: dev")}
    for beams in settings.beams:
        label = "greedy" if beams == 1 else f"beam{beams}"
        kept = [] if settings.record_predictions and beams == 1 else None
        result[label] = score(model, tokenizer, splits["test"], settings, beams, f"{name}: test {label}", kept)
        if kept is not None:
            result["greedy_predictions"] = kept
    test = splits["test"][:settings.diag_examples]
    report = run_diagnostics(model, tokenizer, [r["source"] for r in test], [r["references"] for r in test],
                             max_horizon=settings.diag_horizon, inject_positions=settings.diag_inject,
                             metric=settings.metrics[0],
                             batch_size=settings.eval_batch, max_new_tokens=settings.max_new_tokens,
                             max_source_length=settings.max_source_tokens, progress=False)
    result["diagnostics"] = {key: (round(value, 4) if isinstance(value, float) else value)
                             for key, value in report["summary"].items()}
    return result


def flagged_changes(before: list[str], after: list[str], references: list[list[str]]) -> dict:
    """Returns how a model's outputs changed where `token_match` pointed: over the words of the `before` outputs
    (C's), those `token_match` penalizes (no word of the best-chrF reference aligns to them) and the others, the share
    that is not in a longest common word subsequence with the `after` output of the same source (changed or gone),
    each in %, and their ratio (> 1: training changed the penalized words more than the rest)."""
    from hf_seqrl.rewards.token_match import WORD, TokenMatchReward, aligned_words

    reward = TokenMatchReward()
    counts = {"flagged": [0, 0], "unflagged": [0, 0]}  # [changed, total]
    for old, new, refs in zip(before, after, references):
        words = list(WORD.finditer(old))
        penalized = {start for start, _, _ in reward.value(old, list(refs))["spans"]}
        kept = aligned_words([w.group() for w in words], new.split())
        for word, stays in zip(words, kept):
            bucket = counts["flagged" if word.start() in penalized else "unflagged"]
            bucket[0] += not stays
            bucket[1] += 1
    out = {f"{key}_words": total for key, (_, total) in counts.items()}
    out.update({f"{key}_changed": round(100.0 * changed / max(total, 1), 2)
                for key, (changed, total) in counts.items()})
    out["ratio"] = round(out["flagged_changed"] / out["unflagged_changed"], 3) if out["unflagged_changed"] else None
    return out
