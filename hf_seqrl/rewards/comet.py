"""COMET (Rei et al., 2020) on transformers 5: the scoring of unbabel-comet 2.2.7, which pins `transformers<5`.

`load_comet` reads a COMET checkpoint in the Hub layout (`hparams.yaml` beside `checkpoints/model.ckpt`) and builds the
model natively: the encoder (`encoder_model` "XLM-RoBERTa" → `XLMRobertaModel`, InfoXLM included; "XLM-RoBERTa-XL" →
`XLMRobertaXLModel`) from the config and tokenizer of `pretrained_model` and the checkpoint's weights, the layer mix,
and the heads. `CometModel.score` scores as `predict` does for the four classes of the Hub's COMET models:

- `regression_metric` (wmt22-comet-da): sentence embeddings (layer mix, pooling) of src, mt and ref, a feed-forward
  over `[mt, ref, mt*ref, |mt-ref|, mt*src, |mt-src|]`; `referenceless_regression_metric` (wmt20-comet-qe-da): the
  same over `[mt, src, mt*src, |mt-src|]`;
- `unified_metric` (wmt22-cometkiwi-da): a feed-forward over the first token of `<s> mt </s></s> src </s>` (or mt with
  ref); with both src and ref, the mean over [mt:src], [mt:ref] and [mt:src:ref];
- `xcomet_metric` (XCOMET-XL / XXL): as unified, plus a tag per mt token (no error, minor, major, critical) from which
  error spans are read; the score is `0.12 s_src + 0.33 s_ref + 0.33 s_unified + 0.22 mqm` (each s clipped at 1; without
  a reference `0.78 s_src + 0.22 mqm`), mqm = 1 - min(25, minor + 5 major + 10 critical) / 25.

tests/unit/test_comet.py holds every class to the scores unbabel-comet recorded (tests/fixtures/comet/make_fixtures.py).
The checkpoint is read with `torch.load(weights_only=True)`: nothing in it runs.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

CLASSES = ("regression_metric", "referenceless_regression_metric", "unified_metric", "xcomet_metric")
ENCODERS = {"XLM-RoBERTa": ("XLMRobertaConfig", "XLMRobertaModel"),
            "XLM-RoBERTa-XL": ("XLMRobertaXLConfig", "XLMRobertaXLModel")}
SEVERITY_PENALTY = {"minor": 1, "major": 5, "critical": 10}  # MQM points; xCOMET caps their sum at 25
XCOMET_WEIGHTS = (0.12, 0.33, 0.33, 0.22)  # [mt:src], [mt:ref], [mt:src:ref] regression scores, MQM score
SPAN_INPUT_WEIGHTS = (0.1667, 0.3333, 0.5)  # the three inputs' share of the tag probabilities


class CometScores(NamedTuple):
    """What `CometModel.score` returns: one score per input, and for a word-level model (xCOMET) the error spans of
    each translation (dicts with `text`, `confidence`, `severity`, `start`, `end`: character offsets in the mt) and,
    for xCOMET, the MQM score read from them."""

    scores: list[float]
    error_spans: list[list[dict]] | None = None
    mqm_scores: list[float] | None = None


def sparsemax(z: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Returns the Euclidean projection of the vector `z` `(n,)` onto the probability simplex (Martins & Astudillo,
    2016); `dim` (0) is there to share `torch.softmax`'s call."""
    z = z - z.max()
    ordered = z.sort(descending=True).values
    partial = ordered.cumsum(0) - 1
    support = (torch.arange(1, len(z) + 1, dtype=z.dtype, device=z.device) * ordered > partial).sum()
    return (z - partial[support - 1] / support).clamp(min=0)


class LayerMix(nn.Module):
    """`gamma * sum_k w_k * h_k` over the encoder's hidden layers (embeddings first), `w = softmax` (or `sparsemax`) of
    one scalar per layer; with `layer_norm`, each layer is first normalised over all its unmasked values of a sentence.
    Parameter names follow COMET's `LayerwiseAttention`, so its state dict loads as is."""

    def __init__(self, num_layers: int, transformation: str, layer_norm: bool):
        super().__init__()
        self.scalar_parameters = nn.ParameterList([nn.Parameter(torch.zeros(1)) for _ in range(num_layers)])
        self.gamma = nn.Parameter(torch.ones(1))
        # Only the exact name selects sparsemax: COMET maps anything else (its "sparsemax_patch" too) to softmax.
        self.transform = sparsemax if transformation == "sparsemax" else torch.softmax
        self.layer_norm = layer_norm

    def forward(self, layers: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """Returns the mixed states `(B, T, d)` of `layers` (each `(B, T, d)`), `mask` `(B, T)` marking the tokens."""
        weights = self.transform(torch.cat(list(self.scalar_parameters)), dim=0)
        if self.layer_norm:
            layers = [self.normalized(layer, mask.float()) for layer in layers]
        return self.gamma * sum(weight * layer for weight, layer in zip(weights, layers))

    @staticmethod
    def normalized(layer: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Returns `layer` `(B, T, d)` less its mean over each sentence's unmasked values, over their std."""
        keep = mask.unsqueeze(-1)
        count = mask.sum(1) * layer.shape[-1]
        mean = ((layer * keep).flatten(1).sum(1) / count).view(-1, 1, 1)
        variance = (((layer * keep - mean) * keep) ** 2).flatten(1).sum(1) / count
        return (layer - mean) / torch.sqrt(variance + 1e-12).view(-1, 1, 1)


class Estimator(nn.Module):
    """COMET's feed-forward head, one score per row of features: `Linear, activation, Dropout` per hidden size, then
    `Linear` and the optional final activation, in one `nn.Sequential` indexed as COMET's `estimator.ff`."""

    def __init__(self, in_dim: int, hidden_sizes: list[int], activation: str, final_activation: str | None):
        super().__init__()
        sizes = [in_dim] + list(hidden_sizes)
        layers: list[nn.Module] = []
        for a, b in zip(sizes, sizes[1:]):
            # COMET's rule for the name: nn.<name.title()> ("tanh" and "Tanh" are nn.Tanh)
            layers += [nn.Linear(a, b), getattr(nn, activation.title())(), nn.Dropout(0.0)]
        layers.append(nn.Linear(sizes[-1], 1))
        if final_activation:
            layers.append(getattr(nn, final_activation.title())())
        self.ff = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Returns the scores `(N,)` of `features` `(N, in_dim)`."""
        return self.ff(features.to(self.ff[0].weight.dtype)).view(-1)


class CometModel(nn.Module):
    """A COMET model (see the module docstring), built by `load_comet`.

    Args:
        hparams (`dict`): the checkpoint's hyper-parameters (`class_identifier`, `layer`, `pool`, `hidden_sizes`, ...).
        encoder (`PreTrainedModel`): the XLM-R (XL) encoder, weights loaded.
        tokenizer: its XLM-R tokenizer.
    """

    def __init__(self, hparams: dict, encoder, tokenizer):
        super().__init__()
        self.hparams, self.encoder, self.tokenizer = dict(hparams), encoder, tokenizer
        self.kind = hparams["class_identifier"]
        self.unified = self.kind in ("unified_metric", "xcomet_metric")
        self.num_layers = encoder.config.num_hidden_layers + 1
        # XLM-R's positions start after the padding index: two of max_position_embeddings are never used.
        self.max_positions = encoder.config.max_position_embeddings - 2
        self.layer = hparams.get("sent_layer" if self.unified else "layer", hparams.get("layer", "mix"))
        if self.layer != "mix" and not (isinstance(self.layer, int) and 0 <= self.layer < self.num_layers):
            raise ValueError(f"COMET checkpoint: layer {self.layer!r} is not 'mix' nor one of the encoder's "
                             f"{self.num_layers} layers.")
        self.layerwise_attention = LayerMix(self.num_layers, hparams.get("layer_transformation", "softmax"),
                                            bool(hparams.get("layer_norm", False))) if self.layer == "mix" else None
        self.pool = "cls" if self.unified else hparams.get("pool", "avg")
        width = encoder.config.hidden_size
        features = {"regression_metric": 6, "referenceless_regression_metric": 4}.get(self.kind, 1) * width
        self.estimator = Estimator(features, hparams.get("hidden_sizes", [3072, 1024]),
                                   hparams.get("activations", "Tanh"), hparams.get("final_activation"))
        self.word_level = self.kind == "xcomet_metric" or (self.unified and bool(hparams.get("word_level_training")))
        if self.word_level:
            self.labels = ["O"] + [f"I-{name}" for name in hparams.get("error_labels", ["minor", "major", "critical"])]
            self.hidden2tag = nn.Linear(width, len(self.labels))
        segments = hparams.get("input_segments", ["mt", "src", "ref"]) if self.kind == "unified_metric" else []
        # xCOMET reads mt, src and ref whatever its hparams say; a unified model reads its input_segments.
        self.reads_source = self.kind != "unified_metric" or "src" in segments
        self.reads_references = self.kind in ("regression_metric", "xcomet_metric") or "ref" in segments
        self.needs_references = self.kind == "regression_metric" or bool(segments) and "src" not in segments

    @property
    def device(self) -> torch.device:
        """Returns where the model runs (its heads' device)."""
        return self.estimator.ff[0].weight.device

    def tokenize(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Returns each text's token ids (with `<s>` and `</s>`, truncated as COMET truncates) and character offsets."""
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_positions - 2,
                                 return_offsets_mapping=True)
        return [(list(ids), [tuple(o) for o in offsets])
                for ids, offsets in zip(encoded["input_ids"], encoded["offset_mapping"])]

    def hidden_layers(self, sequences: list[list[int]]) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Returns the encoder's hidden layers (embeddings first, each `(B, T, d)`, float32), the padded ids `(B, T)`
        and the mask `(B, T)` of `sequences` (token id lists), padded on the right."""
        pad = self.tokenizer.pad_token_id
        width = max(len(s) for s in sequences)
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences], device=self.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences], device=self.device)
        out = self.encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        return [h.float() for h in out.hidden_states], ids, mask

    def sentence_layer(self, layers: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """Returns the states `(B, T, d)` the sentence-level head reads: the layer mix, or the configured layer."""
        return self.layerwise_attention(layers, mask) if self.layerwise_attention is not None else layers[self.layer]

    def embed(self, token_ids: list[list[int]], batch_size: int) -> torch.Tensor:
        """Returns the sentence embeddings `(N, d)` of the regression classes for `token_ids`, shortest first in
        batches of `batch_size`."""
        order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))
        pieces = []
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            layers, ids, mask = self.hidden_layers([token_ids[i] for i in chunk])
            states = self.sentence_layer(layers, mask)
            # COMET masks by the pad id (a literal "<pad>" in a text too) and divides by the attention mask's count.
            padding = ids.eq(pad).unsqueeze(-1)
            if self.pool == "avg":
                pooled = states.masked_fill(padding, 0.0).sum(1) / mask.sum(1, keepdim=True).float()
            elif self.pool == "max":
                pooled = states.masked_fill(padding, float("-inf")).max(dim=1).values
            elif self.pool == "cls":
                pooled = states[:, 0]
            elif self.pool == "default":
                pooled = layers[-1][:, 0]
            else:
                raise ValueError(f"COMET checkpoint: unknown pool {self.pool!r} (avg, max, cls or default).")
            pieces.append(pooled)
        return torch.cat(pieces)[torch.tensor(order, device=self.device).argsort()]

    def concatenate(self, parts: list[list[int]]) -> list[int]:
        """Returns COMET's joint input of token id lists `[mt, other, ...]`: `<s> mt </s></s> other </s>`, cut at
        `max_positions` when the segments are too long together."""
        pad, cls, sep = self.tokenizer.pad_token_id, self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        parts = [[t for t in part if t != pad] for part in parts]
        joined = parts[0]
        for part in parts[1:]:
            joined = [cls] + joined[1:-1] + [sep, sep] + part[1:-1] + [sep]
        if sum(len(p) - 2 for p in parts) > self.max_positions - (1 + 2 * len(parts)):
            joined = joined[:self.max_positions]
        return joined

    def forward_joint(self, sequences: list[list[int]], mt_lengths: list[int], batch_size: int):
        """Returns the unified head's score of each joint input `(N,)` and, for a word-level model, the tag
        probabilities over its first `mt_lengths[i]` tokens (a list of `(L_i, C)` tensors; else None)."""
        scores = torch.empty(len(sequences), device=self.device)
        probs: list[torch.Tensor | None] = [None] * len(sequences)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            layers, _, mask = self.hidden_layers([sequences[i] for i in chunk])
            scores[chunk] = self.estimator(self.sentence_layer(layers, mask)[:, 0])
            if self.word_level:
                tags = self.hidden2tag(layers[self.hparams.get("word_layer", 24)].to(self.hidden2tag.weight.dtype))
                for row, i in enumerate(chunk):
                    probs[i] = tags[row, :mt_lengths[i]].float().softmax(dim=-1)
        return scores, (probs if self.word_level else None)

    def score(self, sources: list[str], translations: list[str], references: list[str] | None = None,
              batch_size: int = 32) -> CometScores:
        """Returns the COMET scores of `translations` given `sources` and (for the models that read them)
        `references`, one of each per translation, as unbabel-comet's `predict` gives them. Every distinct text is
        tokenized once; a regression model embeds each distinct text once, a unified model encodes each distinct
        joint input once."""
        if references is None and self.needs_references:
            raise ValueError(f"This COMET model ({self.kind}) needs references.")
        if not translations:
            return CometScores([], [] if self.word_level else None, [] if self.kind == "xcomet_metric" else None)
        texts = list(dict.fromkeys(list(sources) + list(translations) + list(references or [])))
        tokens = dict(zip(texts, self.tokenize(texts)))
        if not self.unified:
            distinct = {text: i for i, text in enumerate(texts)}
            vectors = self.embed([tokens[t][0] for t in texts], batch_size)
            src, mt = (vectors[[distinct[t] for t in column]] for column in (sources, translations))
            if self.kind == "referenceless_regression_metric":
                features = [mt, src, mt * src, (mt - src).abs()]
            else:
                ref = vectors[[distinct[t] for t in references]]
                features = [mt, ref, mt * ref, (mt - ref).abs(), mt * src, (mt - src).abs()]
            return CometScores(self.estimator(torch.cat(features, dim=1)).tolist())
        return self.score_unified(sources, translations, references, tokens, batch_size)

    def score_unified(self, sources, translations, references, tokens, batch_size) -> CometScores:
        """`score` for the unified and xCOMET classes (`tokens`: each text's ids and offsets)."""
        use_src, use_ref = self.reads_source, references is not None and self.reads_references
        columns = [c for c, used in (("src", use_src), ("ref", use_ref)) if used]
        rows = [dict(mt=m, src=s, ref=r) for m, s, r in zip(translations, sources, references or sources)]
        # With both, three inputs as COMET builds them; each distinct input is encoded once.
        kinds = [("src",), ("ref",), ("src", "ref")] if len(columns) == 2 else [tuple(columns)]
        inputs = list(dict.fromkeys((row["mt"],) + tuple(row[c] for c in kind) for kind in kinds for row in rows))
        sequences = [self.concatenate([tokens[text][0] for text in key]) for key in inputs]
        mt_lengths = [len(tokens[key[0]][0]) for key in inputs]
        scores, probs = self.forward_joint(sequences, mt_lengths, batch_size)
        where = {key: i for i, key in enumerate(inputs)}
        index = torch.tensor([[where[(row["mt"],) + tuple(row[c] for c in kind)] for kind in kinds] for row in rows],
                             device=self.device)  # (N, inputs per row)
        if self.kind != "xcomet_metric":
            final = scores[index].mean(dim=1)
        else:  # without a reference, the one input has the three inputs' weight
            weights = XCOMET_WEIGHTS[:3] if len(kinds) == 3 else (sum(XCOMET_WEIGHTS[:3]),)
            final = (scores[index].clamp(max=1.0) * torch.tensor(weights, device=self.device)).sum(dim=1)
        if not self.word_level:
            return CometScores(final.tolist())
        span_weights = SPAN_INPUT_WEIGHTS if len(kinds) == 3 else (1.0,)
        spans = []
        for row, picks in zip(rows, index.tolist()):
            mixed = sum(weight * probs[i] for weight, i in zip(torch.tensor(span_weights), picks))
            spans.append(self.error_spans(mixed, *tokens[row["mt"]]))
        if self.kind != "xcomet_metric":
            return CometScores(final.tolist(), spans)
        mqm = [(25 - min(25, sum(SEVERITY_PENALTY.get(s["severity"], 0) for s in found))) / 25 for found in spans]
        final = final + torch.tensor(mqm, device=self.device) * XCOMET_WEIGHTS[3]
        return CometScores(final.tolist(), spans, mqm)

    def error_spans(self, probs: torch.Tensor, ids: list[int], offsets: list[tuple[int, int]]) -> list[dict]:
        """Returns the error spans COMET reads from the tag probabilities `probs` `(L, C)` of one mt (token `ids`,
        character `offsets`): runs of tokens tagged with an error, the first token's severity naming the run; a run
        still open at the mt's end is dropped, as COMET drops it."""
        found, current = [], None
        confidence, labels = probs.max(dim=-1)
        for token, label, prob, offset in zip(ids, labels.tolist(), confidence.tolist(), offsets):
            if label != 0 and current is None:
                current = dict(tokens=[token], severity=self.labels[label][2:], offset=list(offset), probs=[prob])
            elif label != 0:
                current["tokens"].append(token)
                current["probs"].append(prob)
                current["offset"][1] = offset[1]
            elif current is not None:
                found.append(current)
                current = None
        return [{"text": self.tokenizer.decode(span["tokens"]), "confidence": sum(span["probs"]) / len(span["probs"]),
                 "severity": span["severity"], "start": span["offset"][0], "end": span["offset"][1]} for span in found]


def checkpoint_file(name: str | os.PathLike) -> Path:
    """Returns the `model.ckpt` of a checkpoint file, a model folder (`checkpoints/model.ckpt` inside) or a Hub id
    (downloaded with `huggingface_hub.snapshot_download`: `hparams.yaml` and the checkpoint only)."""
    path = Path(name)
    if not path.exists():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(repo_id=str(name), allow_patterns=["hparams.yaml", "checkpoints/model.ckpt"]))
    if path.is_dir():
        path = path / "checkpoints" / "model.ckpt"
    if not path.is_file():
        raise FileNotFoundError(f"No COMET checkpoint at {path}: give a model.ckpt, a folder holding checkpoints/"
                                "model.ckpt and hparams.yaml, or a Hub id such as 'Unbabel/wmt22-comet-da'.")
    return path


class _Unread:
    """What an object of any class other than tensors and plain containers in a checkpoint becomes: an empty
    `OrderedDict` (the only non-plain type the weights-only unpickler lets a pickle fill), its class never imported."""

    def __new__(cls, *args, **kwargs):
        return OrderedDict()


def read_checkpoint(path: Path) -> tuple[dict, dict | None]:
    """Returns the state dict and the hyper-parameters of a COMET checkpoint, read with `torch.load(weights_only=True)`.
    Objects of other classes (a training loop's state, argparse namespaces) are read as empty placeholders, never
    built; the hyper-parameters are then None (the caller reads `hparams.yaml`)."""
    import pickle
    import zipfile

    mmap = zipfile.is_zipfile(path)  # only the zip format maps; an XL checkpoint then never sits in memory twice
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        return checkpoint["state_dict"], checkpoint.get("hyper_parameters")
    except pickle.UnpicklingError:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    with torch.serialization.safe_globals([(_Unread, name) for name in names]):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    return checkpoint["state_dict"], None


def load_tokenizer(source: str):
    """Returns the XLM-R tokenizer of `source`: its `tokenizer.json` as written (the pipeline unbabel-comet's fast
    tokenizer runs, whose character offsets place the error spans), else transformers' `XLMRobertaTokenizer` built from
    the sentencepiece model (the same ids; a span's offsets may then differ by the space before a word)."""
    import transformers
    from transformers.utils import cached_file

    if cached_file(source, "tokenizer.json", _raise_exceptions_for_missing_entries=False) is not None:
        return transformers.PreTrainedTokenizerFast.from_pretrained(source)
    return transformers.XLMRobertaTokenizer.from_pretrained(source)


def load_comet(name: str | os.PathLike, pretrained_model: str | os.PathLike | None = None, dtype=None) -> CometModel:
    """Returns the `CometModel` of a COMET checkpoint.

    Args:
        name (`str` or `os.PathLike`): a `model.ckpt`, a folder in the Hub layout (`hparams.yaml` beside
            `checkpoints/model.ckpt`), or a Hub id (`"Unbabel/wmt22-comet-da"`).
        pretrained_model (`str`, *optional*): where the encoder's config and tokenizer come from (default: the
            checkpoint's `pretrained_model`, e.g. `"xlm-roberta-large"`; a relative path there is read from the model
            folder first). Its weights are never loaded: the checkpoint has them.
        dtype (`torch.dtype` or `str`, *optional*): the encoder's dtype (e.g. `torch.bfloat16` on a GPU); the layer mix
            and the heads stay in float32.
    """
    import yaml
    import transformers

    path = checkpoint_file(name)
    folder = path.parent.parent  # where COMET keeps hparams.yaml
    state, hparams = read_checkpoint(path)
    from_yaml = yaml.safe_load((folder / "hparams.yaml").read_text()) if (folder / "hparams.yaml").is_file() else {}
    hparams = {**from_yaml, **(hparams or {}), **{k: from_yaml[k] for k in ("class_identifier",) if k in from_yaml}}
    kind, encoder_model = hparams.get("class_identifier"), hparams.get("encoder_model", "XLM-RoBERTa")
    if kind not in CLASSES:
        raise ValueError(f"COMET checkpoint {path}: class {kind!r} is not supported (supported: {', '.join(CLASSES)}).")
    if encoder_model not in ENCODERS:
        raise ValueError(f"COMET checkpoint {path}: encoder {encoder_model!r} is not supported (supported: "
                         f"{', '.join(ENCODERS)}).")
    source = os.fspath(hparams.get("pretrained_model", "xlm-roberta-large"))
    # A relative pretrained_model in the checkpoint names a folder beside it (as the test fixtures have it).
    source = os.fspath(folder / source) if not os.path.isabs(source) and (folder / source).is_dir() else source
    source = os.fspath(pretrained_model) if pretrained_model is not None else source
    config_class, model_class = (getattr(transformers, n) for n in ENCODERS[encoder_model])
    tokenizer = load_tokenizer(source)
    prefix = "encoder.model."
    encoder_state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    encoder = model_class.from_pretrained(None, config=config_class.from_pretrained(source), state_dict=encoder_state,
                                          add_pooling_layer=False, dtype=dtype)
    model = CometModel(hparams, encoder, tokenizer)
    # The heads only (the encoder has its weights); COMET's layer-dropout buffers and metric states are left out.
    loaded = model.load_state_dict({k: v for k, v in state.items() if not k.startswith("encoder.")}, strict=False)
    missing = [k for k in loaded.missing_keys if not k.startswith("encoder.")]
    if missing:
        raise ValueError(f"COMET checkpoint {path} lacks {missing[:5]} for a {kind}.")
    return model.eval().requires_grad_(False)
