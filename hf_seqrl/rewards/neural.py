"""Rewards that a model computes: sentence-embedding similarity, BERTScore, a sequence-classification reward model and
COMET (run natively by `comet`).

Each is a small class with the reward calling convention, built from a local folder, a Hub id or a loaded model. The
model runs in eval mode under `torch.inference_mode()`, `batch_size` texts (or pairs) per forward, and every exact
duplicate is scored once: a source's references, repeated for each of its samples, are encoded once per call. The
trainers move a model reward to their own device on every process (`place_on`); it is never part of the trained
model, so DDP, ZeRO and FSDP never wrap or shard it (`unsharded_loading` keeps a ZeRO-3 run's `from_pretrained` from
partitioning it). A model handed to `reward_funcs` directly becomes one of these by its head (`model_reward`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Sequence

from .convention import best_per_owner, check_reward_spec, reference_pairs, reward_model_kind


@contextlib.contextmanager
def unsharded_loading():
    """Within the context, `from_pretrained` builds whole models even while a DeepSpeed ZeRO-3 config is active (which
    would otherwise partition every model loaded in the process): a reward model runs whole on each process."""
    deepspeed = sys.modules.get("transformers.integrations.deepspeed")
    reference = getattr(deepspeed, "_hf_deepspeed_config_weak_ref", None)
    config = reference() if reference is not None else None
    if config is None:
        yield
        return
    deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        deepspeed.set_hf_deepspeed_config(config)


def _from_pretrained(auto_class, name_or_model, **kwargs):
    """Returns `name_or_model` itself when it is a model, else `auto_class.from_pretrained(name)`, unsharded and
    without remote code."""
    if not isinstance(name_or_model, (str, os.PathLike)):
        return name_or_model
    with unsharded_loading():
        return auto_class.from_pretrained(os.fspath(name_or_model), trust_remote_code=False, **kwargs)


def _tokenizer_for(model, tokenizer):
    """Returns `tokenizer` (a tokenizer, a name, or None: the model's own `name_or_path`)."""
    from transformers import AutoTokenizer

    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    tokenizer = None if tokenizer is None else os.fspath(tokenizer)
    name = tokenizer or getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
    if not name:
        raise ValueError(f"{type(model).__name__} has no name_or_path to load its tokenizer from: pass tokenizer=.")
    return AutoTokenizer.from_pretrained(name, trust_remote_code=False)


def unique(items: Sequence) -> tuple[list, list[int]]:
    """Returns `(distinct items in first-seen order, index of each item among them)`."""
    index: dict = {}
    positions = [index.setdefault(item, len(index)) for item in items]
    return list(index), positions


class ModelReward:
    """What the model rewards share: the device, eval mode, the batch size. `needs_references` says whether the
    reward scores against references (a dataset of sources alone cannot train it); a subclass that reads the sources
    alone, or can, says so."""

    model = None
    needs_references = True

    def __init__(self, batch_size: int, device=None):
        if batch_size < 1:
            raise ValueError(f"{type(self).__name__}: batch_size must be >= 1, got {batch_size}.")
        self.batch_size = batch_size
        self.device = None
        if device is not None:
            self.to(device)

    def to(self, device):
        """Moves the reward's model to `device` (eval mode, no gradients); returns the reward."""
        import torch

        self.device = torch.device(device)
        self.model.to(self.device).eval().requires_grad_(False)
        return self

    @property
    def model_device(self):
        """Returns where the reward's model runs: its device, or where its parameters are."""
        return self.device or next(self.model.parameters()).device

    def batches(self, items: list) -> list[list]:
        """Returns `items` in consecutive slices of `batch_size`."""
        return [items[i:i + self.batch_size] for i in range(0, len(items), self.batch_size)]


class EmbeddingSimilarityReward(ModelReward):
    """Cosine similarity of sentence embeddings: each prediction against its references (the best one), or against its
    source (`compare="sources"`: quality estimation with a cross-lingual encoder such as LaBSE).

    A sentence's embedding is the mean of the encoder's last hidden states over its tokens (`pooling="mean"`, as
    sentence-transformers' MiniLM / MPNet models), or its first token's (`pooling="cls"`), L2-normalized. Every
    distinct text of a call is embedded once, shortest texts batched together.

    Args:
        model (`str` or `PreTrainedModel`): an encoder (`AutoModel`), e.g. `"sentence-transformers/all-MiniLM-L6-v2"`.
        tokenizer (*optional*): its tokenizer (default: loaded from the model's `name_or_path`).
        compare (`str`, *optional*, defaults to `"references"`): `"references"` or `"sources"`.
        pooling (`str`, *optional*, defaults to `"mean"`): `"mean"` or `"cls"`.
        batch_size (`int`, *optional*, defaults to `64`), max_length (`int`, *optional*, defaults to `256`).
        device (*optional*): where the encoder runs (the trainers place it on theirs).
    """

    def __init__(self, model, tokenizer=None, compare: str = "references", pooling: str = "mean",
                 batch_size: int = 64, max_length: int = 256, device=None):
        from transformers import AutoModel

        if compare not in ("references", "sources"):
            raise ValueError(f"EmbeddingSimilarityReward: compare={compare!r} is not 'references' or 'sources'.")
        if pooling not in ("mean", "cls"):
            raise ValueError(f"EmbeddingSimilarityReward: pooling={pooling!r} is not 'mean' or 'cls'.")
        self.model = _from_pretrained(AutoModel, model)
        self.tokenizer = _tokenizer_for(self.model, tokenizer)
        self.compare, self.pooling, self.max_length = compare, pooling, max_length
        self.__name__ = "embedding_similarity" if compare == "references" else "embedding_similarity_source"
        self.needs_references = compare == "references"
        super().__init__(batch_size, device)

    def embed(self, texts: list[str]):
        """Returns the normalized embeddings `(len(texts), d)` of `texts`, each distinct text encoded once."""
        import torch

        distinct, positions = unique(texts)
        order = sorted(range(len(distinct)), key=lambda i: len(distinct[i]))
        device = self.model_device
        rows = [None] * len(distinct)
        with torch.inference_mode():
            for chunk in self.batches(order):
                encoded = self.tokenizer([distinct[i] for i in chunk], padding=True, truncation=True,
                                         max_length=self.max_length, return_tensors="pt").to(device)
                hidden = self.model(**encoded).last_hidden_state.float()
                if self.pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
                for i, row in zip(chunk, pooled):
                    rows[i] = row
        if not rows:
            return torch.empty(0)
        return torch.stack(rows)[torch.tensor(positions, device=rows[0].device)]

    def __call__(self, predictions, references, sources=None, **columns) -> list[float]:
        if not predictions:
            return []
        if self.compare == "sources":
            if sources is None:
                raise ValueError("EmbeddingSimilarityReward(compare='sources') needs the sources: add a `sources` "
                                 "column (or text columns) to the dataset, or compare='references'.")
            targets, owners = list(sources), list(range(len(predictions)))
        else:
            owners, targets = reference_pairs(references)
        vectors = self.embed(list(predictions) + targets)
        mine, theirs = vectors[:len(predictions)], vectors[len(predictions):]
        similarity = (mine[owners] * theirs).sum(dim=-1).tolist()
        return best_per_owner(similarity, owners, len(predictions))


class BERTScoreReward(ModelReward):
    """BERTScore (Zhang et al., 2020) through the `bert-score` package: greedy cosine matching of contextual token
    embeddings of prediction and reference, precision, recall or F1, with several references the best one.

    `bert_score.BERTScorer` embeds the distinct sentences of a call once, in batches of `batch_size`; an empty
    prediction scores 0. Requires `pip install bert-score` (the `hf-seqrl[neural]` extra).

    Args:
        model (`str`): a `model_type` of bert-score (`"roberta-large"`, ...) or a local folder.
        num_layers (`int`, *optional*): the hidden layer whose states are matched (required for a local folder).
        score (`str`, *optional*, defaults to `"f1"`): `"precision"`, `"recall"` or `"f1"`.
        idf (`bool`, *optional*, defaults to `False`), idf_sentences (`list[str]`, *optional*): inverse document
            frequency weights from these sentences (e.g. the training references).
        rescale_with_baseline (`bool`), baseline_path (`str`), lang (`str`): as in bert-score.
        batch_size (`int`, *optional*, defaults to `64`); device (*optional*).
    """

    SCORES = ("precision", "recall", "f1")

    def __init__(self, model: str = "roberta-large", num_layers: int | None = None, score: str = "f1",
                 idf: bool = False, idf_sentences: list[str] | None = None, rescale_with_baseline: bool = False,
                 baseline_path: str | None = None, lang: str | None = None, batch_size: int = 64, device=None):
        try:
            from bert_score import BERTScorer
        except ImportError as err:
            raise ImportError("BERTScoreReward needs the bert-score package: pip install 'hf-seqrl[neural]' (or "
                              "pip install bert-score).") from err
        if score not in self.SCORES:
            raise ValueError(f"BERTScoreReward: score={score!r} is not one of {self.SCORES}.")
        if idf and not idf_sentences:
            raise ValueError("BERTScoreReward(idf=True) needs idf_sentences= (e.g. the training references).")
        try:
            with unsharded_loading():
                self.scorer = BERTScorer(model_type=os.fspath(model), num_layers=num_layers, idf=idf, idf_sents=idf_sentences,
                                         rescale_with_baseline=rescale_with_baseline, baseline_path=baseline_path,
                                         lang=lang, batch_size=batch_size, device="cpu")
        except KeyError as err:
            raise ValueError(f"BERTScoreReward: bert-score has no default layer for {model!r}: pass num_layers= (e.g. "
                             "the layer count of the model's encoder, or fewer).") from err
        self.model, self.score = self.scorer._model, score
        self.__name__ = f"bertscore_{score}"
        super().__init__(batch_size, device)

    def to(self, device):
        super().to(device)
        self.scorer.device = str(self.device)
        return self

    def __call__(self, predictions, references, sources=None, **columns) -> list[float]:
        import torch

        # An empty prediction scores 0, as bert-score scores it (whose own path for it fails under transformers 5).
        pairs = [(i, ref) for i, ref in zip(*reference_pairs(references)) if predictions[i].strip()]
        if not pairs:
            return [0.0] * len(predictions)
        owners = [i for i, _ in pairs]
        with torch.inference_mode():
            precision, recall, f1 = self.scorer.score([predictions[i] for i in owners], [ref for _, ref in pairs],
                                                      batch_size=self.batch_size)
        values = {"precision": precision, "recall": recall, "f1": f1}[self.score]
        best = best_per_owner(values.tolist(), owners, len(predictions))
        return [0.0 if value == float("-inf") else value for value in best]


class RewardModelReward(ModelReward):
    """A sequence-classification model with one output scoring text pairs (as TRL takes a reward model).

    Args:
        model (`str` or `PreTrainedModel`): an `AutoModelForSequenceClassification` with `num_labels=1`.
        tokenizer (*optional*): its tokenizer (default: loaded from the model's `name_or_path`).
        pair (`str`, *optional*, defaults to `"source-prediction"`): what the model reads: `"source-prediction"`
            (quality estimation), `"prediction-reference"` (with several references the best one counts) or
            `"prediction"` alone.
        batch_size (`int`, *optional*, defaults to `32`), max_length (`int`, *optional*, defaults to `512`); device.
    """

    PAIRS = ("source-prediction", "prediction-reference", "prediction")

    def __init__(self, model, tokenizer=None, pair: str = "source-prediction", batch_size: int = 32,
                 max_length: int = 512, device=None):
        from transformers import AutoModelForSequenceClassification

        if pair not in self.PAIRS:
            raise ValueError(f"RewardModelReward: pair={pair!r} is not one of {self.PAIRS}.")
        self.model = _from_pretrained(AutoModelForSequenceClassification, model)
        if getattr(self.model.config, "num_labels", None) != 1:
            raise ValueError(f"RewardModelReward needs a model with one output (num_labels=1), got "
                             f"num_labels={self.model.config.num_labels}: a classifier's labels are no reward.")
        self.tokenizer = _tokenizer_for(self.model, tokenizer)
        self.pair, self.max_length = pair, max_length
        self.__name__ = f"reward_model:{pair}"
        self.needs_references = pair == "prediction-reference"
        super().__init__(batch_size, device)

    def pairs(self, predictions, references, sources) -> tuple[list[tuple], list[int]]:
        """Returns the `(text, text_pair or None)` inputs to score and the prediction each belongs to."""
        if self.pair == "prediction":
            return [(p, None) for p in predictions], list(range(len(predictions)))
        if self.pair == "source-prediction":
            if sources is None:
                raise ValueError("RewardModelReward(pair='source-prediction') needs the sources: add a `sources` "
                                 "column (or text columns) to the dataset, or choose another pair.")
            return list(zip(sources, predictions)), list(range(len(predictions)))
        owners, flat = reference_pairs(references)
        return [(predictions[i], ref) for i, ref in zip(owners, flat)], owners

    def __call__(self, predictions, references, sources=None, **columns) -> list[float]:
        import torch

        if not predictions:
            return []
        inputs, owners = self.pairs(predictions, references, sources)
        distinct, positions = unique(inputs)
        device = self.model_device
        scores: list[float] = []
        with torch.inference_mode():
            for chunk in self.batches(distinct):
                first = [a for a, _ in chunk]
                second = None if chunk[0][1] is None else [b for _, b in chunk]
                encoded = self.tokenizer(first, second, padding=True, truncation=True, max_length=self.max_length,
                                         return_tensors="pt").to(device)
                scores += self.model(**encoded).logits[:, 0].float().tolist()
        return best_per_owner([scores[i] for i in positions], owners, len(predictions))


class CometReward(ModelReward):
    """COMET (Rei et al., 2020) computed natively on transformers 5 (`hf_seqrl.rewards.comet`, equal to unbabel-comet
    2.2.7's `predict` within 1e-5): reference-based regression (`wmt22-comet-da`), referenceless regression
    (`wmt20-comet-qe-da`), unified models (`wmt22-cometkiwi-da`) and xCOMET, with several references the best one.

    A regression model embeds every distinct source, reference and prediction of a call once, so a source and its
    references are encoded once for all its samples; a unified model or xCOMET encodes each distinct joint input once.
    xCOMET's error spans of the last call are kept in `last_error_spans` (for sample logs).

    Args:
        model (`str`, `os.PathLike` or `comet.CometModel`): a folder in the Hub layout (`hparams.yaml` beside
            `checkpoints/model.ckpt`), a `model.ckpt`, a Hub id (`"Unbabel/wmt22-comet-da"`), or a loaded model
            (`hf_seqrl.rewards.comet.load_comet`).
        batch_size (`int`, *optional*, defaults to `32`): inputs per encoder forward; device (*optional*).
        dtype (`torch.dtype` or `str`, *optional*): the encoder's dtype, e.g. `"bfloat16"` on a GPU (the layer mix and
            the heads stay in float32).
        pretrained_model (`str`, *optional*): where the encoder's config and tokenizer come from, in place of the
            checkpoint's `pretrained_model` (a local copy of `xlm-roberta-large`, say).
        use_references (`bool`, *optional*): `False` scores a unified model or xCOMET from the source alone (quality
            estimation); by default a model reads the references when it can.
        token_rewards (`bool`, *optional*, defaults to `False`): xCOMET only: each prediction's value is its score
            with its error spans, each span's value the weight of its severity (`severity_weights`): a token-level
            reward (docs/rewards.md, "Token-level rewards"; Ramos et al., 2026).
        severity_weights (`dict[str, float]`, *optional*): the value of a minor, major and critical span; by default
            xCOMET's own MQM penalties (1, 5, 10 points) over its 25-point scale, negated: -0.04, -0.2, -0.4.
    """

    SEVERITY_WEIGHTS = {"minor": -1 / 25, "major": -5 / 25, "critical": -10 / 25}

    def __init__(self, model="Unbabel/wmt22-comet-da", batch_size: int = 32, device=None, dtype=None,
                 pretrained_model=None, use_references: bool | None = None, token_rewards: bool = False,
                 severity_weights: dict[str, float] | None = None):
        from .comet import CometModel, load_comet

        if isinstance(model, (str, os.PathLike)):
            with unsharded_loading():
                model = load_comet(model, pretrained_model=pretrained_model, dtype=dtype)
        elif not isinstance(model, CometModel):
            raise TypeError(f"CometReward takes a COMET checkpoint (folder, model.ckpt or Hub id) or a CometModel, "
                            f"not a {type(model).__name__}: hf-seqrl runs COMET itself (unbabel-comet needs "
                            "transformers < 5).")
        if use_references and not model.reads_references or use_references is False and model.needs_references:
            raise ValueError(f"CometReward: this COMET model ({model.kind}) cannot run with use_references="
                             f"{use_references}.")
        if token_rewards and model.kind != "xcomet_metric":
            raise ValueError(f"CometReward(token_rewards=True) needs an xCOMET checkpoint, whose error spans say which "
                             f"tokens are wrong; this model is a {model.kind}.")
        weights = {**self.SEVERITY_WEIGHTS, **(severity_weights or {})}
        if set(weights) != set(self.SEVERITY_WEIGHTS) or not all(math.isfinite(w) for w in weights.values()):
            raise ValueError(f"CometReward: severity_weights={severity_weights!r} must give finite values to some of "
                             f"{sorted(self.SEVERITY_WEIGHTS)}.")
        self.token_rewards, self.severity_weights = token_rewards, weights
        self.model = model
        self.uses_references = model.reads_references and use_references is not False
        self.needs_references = self.uses_references  # quality estimation (use_references=False) reads sources alone
        self.reuses_embeddings = not model.unified
        self.last_error_spans: list[list[dict]] | None = None
        self.__name__ = "comet"
        super().__init__(batch_size, device)

    def __call__(self, predictions, references, sources=None, **columns) -> list:
        """Returns each prediction's COMET score (with references, its best; `None` for a prediction without any);
        with `token_rewards`, `{"score": score, "spans": [(start, end, severity weight), ...]}` instead."""
        import torch

        if not predictions:
            return []
        if sources is None:
            raise ValueError("CometReward needs the sources: add a `sources` column (or text columns) to the dataset.")
        if self.uses_references:
            owners, flat = reference_pairs(references)
        else:
            owners, flat = list(range(len(predictions))), None
        with torch.inference_mode():
            result = self.model.score([sources[i] for i in owners], [predictions[i] for i in owners], flat,
                                      self.batch_size)
        best: dict[int, int] = {}
        for row, owner in enumerate(owners):
            if owner not in best or result.scores[row] > result.scores[best[owner]]:
                best[owner] = row
        if result.error_spans is not None:
            self.last_error_spans = [result.error_spans[best[i]] if i in best else [] for i in range(len(predictions))]
        scores = [result.scores[best[i]] if i in best else None for i in range(len(predictions))]
        if not self.token_rewards:
            return scores
        return [None if score is None else {"score": score, "spans": [
            (span["start"], span["end"], self.severity_weights[span["severity"]]) for span in found]}
                for score, found in zip(scores, self.last_error_spans)]


def model_reward(model) -> ModelReward:
    """Returns the model reward for a model given directly to `reward_funcs`, by its head
    (`convention.reward_model_kind`): a sequence classifier with one output scores (source, prediction) pairs
    (`RewardModelReward`), a `comet.CometModel` is a `CometReward`, a bare encoder gives `EmbeddingSimilarityReward`. Anything
    else is refused (`convention.check_reward_spec` names the classes to wrap it in)."""
    kind = reward_model_kind(model)
    if kind is None:
        check_reward_spec([model])
    return {"comet": CometReward, "reward_model": RewardModelReward, "encoder": EmbeddingSimilarityReward}[kind](model)
