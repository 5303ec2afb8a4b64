"""The demo's task: toy translation into three *dialects* of one target language, generated in code from the seed,
with its word-level tokenizer, tiny model and datasets.

Each dialect is a word-for-word lexicon over the same target word forms, shuffled, so a form that
translates source word "a" in one dialect translates "b" in another: only a (source word, output word)
pair tells which dialect a sentence is in. Every training pair shows one dialect drawn at random; the
three renderings of a source are all its references, so any consistent dialect scores 100 BLEU.

Why sequence-level training has something to fix: cross-entropy asks for the mixture (each source word
has three equally likely translations). A one-layer model learns that mixture long before it learns to
read the dialect off its own prefix, so its greedy output switches dialect mid-sentence: every word is
right in *some* dialect, but bigrams and longer n-grams rarely match any one reference. More
cross-entropy keeps paying for all three dialects (run alone for 8,000 steps, its dev BLEU stayed
between 17 and 31, seed 0); SCST, rewarded by sentence BLEU against all references, only has to commit
to one. With a single dialect there is nothing to fix: cross-entropy reaches 100 BLEU by itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2; pad doubles as the decoder start token


@dataclass(frozen=True)
class DemoSettings:
    """Sizes and hyper-parameters of one demo run."""

    vocab_size: int = 24  # source words; each dialect maps them onto the same `vocab_size` target forms
    dialects: int = 3
    min_words: int = 4
    max_words: int = 8
    train_size: int = 4000
    dev_size: int = 200  # decides when the warm-up has plateaued
    test_size: int = 300  # the table only
    d_model: int = 64
    d_ff: int = 128
    num_heads: int = 4
    num_layers: int = 1  # small on purpose: the dialect must be hard to read off the prefix
    batch_size: int = 32
    warmup_lr: float = 3e-3
    lr: float = 1e-3  # both arms compared from C
    eval_every: int = 250  # warm-up steps between dev evaluations
    patience: int = 2  # stop after this many dev evaluations without a new best
    max_warmup_steps: int = 2500
    compare_steps: int = 300  # steps of each arm from C
    num_samples: int = 1
    baseline: str = "greedy"  # SCST's self-critical baseline; "mean" needs num_samples >= 2
    rl_weight: float = 0.9

    @property
    def max_new_tokens(self) -> int:
        """Returns the decoding length: the longest target and `</s>`, with room to see an output run long."""
        return self.max_words + 4


FULL = DemoSettings()
QUICK = DemoSettings(vocab_size=12, train_size=1000, dev_size=60, test_size=60, max_words=6, eval_every=100,
                     max_warmup_steps=300, compare_steps=20)


# ---- the task ---------------------------------------------------------------------------------------


def _pseudo_words(rng: random.Random, count: int, syllables: int, taken: set[str]) -> list[str]:
    """Returns `count` new pronounceable words of `syllables` consonant-vowel syllables."""
    words = []
    while len(words) < count:
        word = "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(syllables))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


def _dialect_lexicons(rng: random.Random, forms: list[str], dialects: int) -> list[list[str]]:
    """Returns one shuffled copy of `forms` per dialect, no two dialects translating a word alike."""
    lexicons: list[list[str]] = []
    while len(lexicons) < dialects:
        candidate = rng.sample(forms, len(forms))
        # Rejection keeps the references of a source distinct word by word (about e^-k tries each).
        if all(a != b for lexicon in lexicons for a, b in zip(candidate, lexicon)):
            lexicons.append(candidate)
    return lexicons


def make_task(seed: int, settings: DemoSettings) -> dict:
    """Returns the task: `words` (vocabulary) and `train` / `dev` / `test` rows.

    A row is `{"source": str, "target": str, "references": list[str]}`: `target` is the rendering in one
    random dialect (the training label), `references` the renderings in all dialects.
    """
    rng = random.Random(seed)
    taken: set[str] = set()
    source_words = _pseudo_words(rng, settings.vocab_size, 2, taken)
    target_forms = _pseudo_words(rng, settings.vocab_size, 3, taken)
    lexicons = _dialect_lexicons(rng, target_forms, settings.dialects)

    def row() -> dict:
        ids = [rng.randrange(settings.vocab_size) for _ in range(rng.randint(settings.min_words, settings.max_words))]
        references = [" ".join(lexicon[i] for i in ids) for lexicon in lexicons]
        return {"source": " ".join(source_words[i] for i in ids), "target": rng.choice(references),
                "references": references}

    sizes = {"train": settings.train_size, "dev": settings.dev_size, "test": settings.test_size}
    task = {name: [row() for _ in range(size)] for name, size in sizes.items()}
    task["words"] = source_words + target_forms
    return task


# ---- tokenizer, model, data -------------------------------------------------------------------------


def build_tokenizer(words: list[str]):
    """Returns a word-level `PreTrainedTokenizerFast` over `words` that appends `</s>` to every text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for word in words:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def build_model(tokenizer, settings: DemoSettings, max_new_tokens: int):
    """Returns a freshly initialized tiny `MarianMTModel` (sinusoidal positions) for `tokenizer`."""
    from ..models.tiny import build_tiny_model

    model = build_tiny_model(
        "marian", tokenizer=tokenizer, d_model=settings.d_model, layers=settings.num_layers, heads=settings.num_heads,
        ffn=settings.d_ff, max_positions=2 * max_new_tokens, activation_function="relu",
        # At the default 0.02 the token embeddings are dwarfed by the unit-scale sinusoidal positions and
        # the model ignores the source for ~2,000 steps before it learns anything.
        init_std=0.1,
    )
    model.generation_config.max_new_tokens = max_new_tokens
    return model


def to_dataset(rows: list[dict], tokenizer, max_source_length: int | None = None, max_target_length: int | None = None,
               decoder_start_token_id: int | None = None):
    """Returns a `datasets.Dataset` with `input_ids`, `attention_mask`, `labels` (of each row's `target`, less a
    leading `decoder_start_token_id`) and all `references` of `rows` (dicts with `source`, `target`, `references`)."""
    from datasets import Dataset

    from ..data import strip_start_token

    sources = tokenizer([r["source"] for r in rows], truncation=max_source_length is not None,
                        max_length=max_source_length)
    labels = tokenizer(text_target=[r["target"] for r in rows], truncation=max_target_length is not None,
                       max_length=max_target_length)["input_ids"]
    return Dataset.from_dict({"input_ids": sources["input_ids"], "attention_mask": sources["attention_mask"],
                              "labels": strip_start_token(labels, decoder_start_token_id),
                              "references": [r["references"] for r in rows]})
