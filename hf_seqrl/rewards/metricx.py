"""MetricX-24 (Juraska et al., 2024) as a reward, natively on transformers: `MetricXReward`.

The `metricx24` code of google-research/metricx defines its own `MT5ForRegression` and pins an older transformers; its
checkpoints (`google/metricx-24-hybrid-{large,xl,xxl}-v2p6`) are mT5 encoder-decoders whose weights load into
`MT5ForConditionalGeneration` unchanged. What MetricX-24's prediction does, and what this module does the same way:

- the input text is `"source: {source} candidate: {candidate} reference: {reference}"`, or without the reference,
  `"source: {source} candidate: {candidate}"`, for quality estimation (`--qe`; the hybrid models read both forms);
- it is tokenized with the `google/mt5-xl` tokenizer, truncated to `max_input_length` (1536 for MetricX-24), and the
  last token, the EOS the tokenizer appends, is removed;
- the decoder runs one step from token 0 (pad, mT5's decoder start); the score is the logit of `<extra_id_10>`
  (id 250089) at that position, clamped to [0, 25]. It is an MQM-like error score: 0 is a perfect translation, 25 the
  worst, so the reward is its negation (or `1 - score / 25`).

mT5's configuration in transformers 5 always asks for tied input and output embeddings, but a checkpoint that holds
both `shared.weight` and `lm_head.weight` with different values (MetricX's do) keeps them untied on load; a test loads
such a checkpoint and reads the score from its own head.
"""

from __future__ import annotations

from collections.abc import Sequence

from .convention import best_per_owner
from .neural import ModelReward, _from_pretrained, _tokenizer_for, unique

METRICX_SCORE_TOKEN_ID = 250089  # <extra_id_10> in the mT5 vocabulary
METRICX_MAX_SCORE = 25.0
# MetricX feeds the decoder token 0 whatever the config says; 0 is also mT5's decoder start (its pad).
METRICX_DECODER_START_ID = 0


def metricx_input(source: str, candidate: str, reference: str | None = None) -> str:
    """Returns the text MetricX-24 reads: `"source: {source} candidate: {candidate} reference: {reference}"`, or without
    the `reference: ...` part when `reference` is None (quality estimation)."""
    text = f"source: {source} candidate: {candidate}"
    return text if reference is None else f"{text} reference: {reference}"


def clamp_score(score: float) -> float:
    """Returns `score` clamped to MetricX's range [0, 25] (as its model does before returning the score)."""
    return min(max(float(score), 0.0), METRICX_MAX_SCORE)


def reward_from_score(score: float, normalize: bool = False) -> float:
    """Returns the reward of a MetricX score (an error score, lower is better): `-score`, in [-25, 0], or with
    `normalize`, `1 - score / 25`, in [0, 1]; the score is clamped to [0, 25] first."""
    score = clamp_score(score)
    return 1.0 - score / METRICX_MAX_SCORE if normalize else -score


def drop_eos(token_ids: Sequence[int], eos_token_id: int | None) -> list[int]:
    """Returns `token_ids` without its last token when that is `eos_token_id` (MetricX-24 removes the EOS the tokenizer
    appends: its models were trained on inputs without one)."""
    token_ids = list(token_ids)
    return token_ids[:-1] if token_ids and eos_token_id is not None and token_ids[-1] == eos_token_id else token_ids


class MetricXReward(ModelReward):
    """MetricX-24 (hybrid, reference-based or quality estimation) as a reward: the negated MetricX score of each
    prediction, with several references the best (lowest-error) one.

    The score is the one MetricX-24's own prediction gives (see the module's docstring): an error score in [0, 25],
    lower is better, so the reward is `-score` (in [-25, 0]; 0 is a perfect translation), or `1 - score / 25` (in
    [0, 1]) with `normalize=True`, which mixes with BLEU or chrF at comparable weights. Every distinct input is scored
    once (a source's samples often repeat), inputs of similar length batched together, under `torch.inference_mode()`.
    A prediction without a reference is scored without one (the quality-estimation form), and so is every prediction
    with `qe=True`. Without sources the source is empty, as MetricX-24 reads reference-only data; quality estimation
    needs the sources.

    Args:
        model (`str` or `MT5ForConditionalGeneration`, *optional*, defaults to
            `"google/metricx-24-hybrid-large-v2p6"`): a MetricX-24 checkpoint (Hub id or folder; `-xl-` and `-xxl-`
            agree better with human judgments, the large one is fastest) or a loaded mT5 model.
        tokenizer (*optional*, defaults to `"google/mt5-xl"`): the tokenizer, or its name (MetricX checkpoints ship
            none; all MetricX-24 models use mT5-XL's).
        qe (`bool`, *optional*, defaults to `False`): quality estimation: score source and candidate only, never the
            references (MetricX-24's `--qe`).
        normalize (`bool`, *optional*, defaults to `False`): the reward `1 - score / 25` instead of `-score`.
        score_token_id (`int`, *optional*, defaults to `250089`): the token whose logit is the score
            (`<extra_id_10>` in the mT5 vocabulary; another id for a model with another vocabulary).
        max_length (`int`, *optional*, defaults to `1536`): input tokens before the EOS is removed (MetricX-24 was
            trained with 1536).
        batch_size (`int`, *optional*, defaults to `16`): inputs per forward.
        dtype (`torch.dtype` or `str`, *optional*): the model's dtype (`torch.bfloat16` halves its memory on a GPU;
            float16 overflows in mT5); default: the checkpoint's (float32), or a given model's own.
        device (*optional*): where the model runs (the trainers place it on theirs).
    """

    def __init__(self, model="google/metricx-24-hybrid-large-v2p6", tokenizer="google/mt5-xl", qe: bool = False,
                 normalize: bool = False, score_token_id: int = METRICX_SCORE_TOKEN_ID, max_length: int = 1536,
                 batch_size: int = 16, dtype=None, device=None):
        import torch
        from transformers import MT5ForConditionalGeneration

        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.model = _from_pretrained(MT5ForConditionalGeneration, model, **({} if dtype is None else {"dtype": dtype}))
        if dtype is not None:
            self.model.to(dtype)  # a model given loaded
        vocab_size = self.model.get_output_embeddings().weight.shape[0]
        if not 0 <= score_token_id < vocab_size:
            raise ValueError(f"MetricXReward: score_token_id={score_token_id} is outside the model's vocabulary of "
                             f"{vocab_size} tokens.")
        self.tokenizer = _tokenizer_for(self.model, tokenizer)
        self.qe, self.normalize, self.score_token_id, self.max_length = qe, normalize, score_token_id, max_length
        self.__name__ = "metricx_qe" if qe else "metricx"
        self.needs_references = not qe
        super().__init__(batch_size, device)

    def inputs(self, predictions, references, sources) -> tuple[list[str], list[int]]:
        """Returns the MetricX input texts to score and the prediction each belongs to: one per reference, or one
        without a reference for a prediction that has none (and for every prediction with `qe=True`)."""
        if sources is None:
            if self.qe:
                raise ValueError("MetricXReward(qe=True) needs the sources: add a `sources` column (or text columns) "
                                 "to the dataset.")
            sources = [""] * len(predictions)
        texts, owners = [], []
        for i, (source, prediction) in enumerate(zip(sources, predictions)):
            refs = [] if self.qe else list(references[i])
            for reference in refs or [None]:
                texts.append(metricx_input(source, prediction, reference))
                owners.append(i)
        return texts, owners

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Returns the token ids of each text as MetricX-24 feeds them: truncated to `max_length`, the final EOS
        removed."""
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
        return [drop_eos(ids, self.tokenizer.eos_token_id) for ids in encoded]

    def scores(self, texts: Sequence[str]) -> list[float]:
        """Returns the MetricX score (clamped to [0, 25]) of each input text, every distinct text scored once."""
        import torch

        distinct, positions = unique(list(texts))
        token_ids = self.encode(distinct)
        order = sorted(range(len(distinct)), key=lambda i: len(token_ids[i]))
        pad = self.tokenizer.pad_token_id or 0
        device = self.model_device
        found = [0.0] * len(distinct)
        with torch.inference_mode():
            for chunk in self.batches(order):
                width = max(len(token_ids[i]) for i in chunk)
                input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, i in enumerate(chunk):
                    input_ids[row, :len(token_ids[i])] = torch.tensor(token_ids[i], dtype=torch.long)
                    attention_mask[row, :len(token_ids[i])] = 1
                decoder_input_ids = torch.full((len(chunk), 1), METRICX_DECODER_START_ID, dtype=torch.long)
                logits = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                    decoder_input_ids=decoder_input_ids.to(device)).logits
                values = logits[:, 0, self.score_token_id].float().clamp(0.0, METRICX_MAX_SCORE).tolist()
                for i, value in zip(chunk, values):
                    found[i] = value
        return [found[i] for i in positions]

    def __call__(self, predictions, references, sources=None, **columns) -> list[float]:
        if not predictions:
            return []
        texts, owners = self.inputs(predictions, references, sources)
        rewards = [reward_from_score(score, self.normalize) for score in self.scores(texts)]
        return best_per_owner(rewards, owners, len(predictions))
