"""What a trainer takes in: the model and tokenizer checks, the dataset checks, and the text columns of a batch
(and what scoring its sequences with the rewards gives)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch


def check_model_family(family, supported: tuple[str, ...], trainer: str) -> None:
    """Raises a clear error unless `family` (from `hf_seqrl.families.family_for`) is one that `trainer` supports."""
    if family.name not in supported:
        kinds = {"seq2seq": "encoder-decoder (AutoModelForSeq2SeqLM)", "causal": "decoder-only (AutoModelForCausalLM)"}
        raise ValueError(f"{trainer} supports {' and '.join(kinds[k] for k in supported)} models only; got a "
                         f"{kinds[family.name]} model.")


class BatchText(NamedTuple):
    """The columns of a batch that stay out of the model: what rewards and evaluation read."""

    references: list[list[str]] | None
    sources: list[str] | None
    columns: dict[str, list]  # every other non-model column, one entry per row


class RewardValues(NamedTuple):
    """The rewards of `N` decoded sequences, one row of `BatchText` each, every reward function scored once."""

    predictions: list[str]  # the decoded sequences
    values: list[float | None]  # the reward of each, as the reward returned it (NaN / inf and None kept)
    parts: dict[str, list[float | None]]  # each reward function's values by name (a single reward: its own name)
    rewards: torch.Tensor  # `(N,)` float32, 0 where the sequence is left out
    left_out: torch.Tensor  # `(N,)` bool: no reward applies (None), or a non-finite one dropped

    def select(self, rows: torch.Tensor) -> RewardValues:
        """Returns the values of the sequences where the bool tensor `rows` `(N,)` is true."""
        keep = rows.tolist()

        def pick(values):
            return [v for v, k in zip(values, keep) if k]

        return RewardValues(pick(self.predictions), pick(self.values),
                            {name: pick(values) for name, values in self.parts.items()}, self.rewards[rows],
                            self.left_out[rows])

    def missing(self) -> int:
        """Returns how many sequences no reward applies to (`None`)."""
        return sum(value is None for value in self.values)

    def part_rewards(self) -> dict[str, torch.Tensor]:
        """Returns each part's values as a float32 tensor `(N,)`, NaN where that part gives no finite value (it
        returned None or NaN / inf) or the sequence is left out."""
        import torch

        def number(value):
            return float("nan") if value is None else value

        return {name: torch.tensor([number(v) for v in values], dtype=torch.float32, device=self.rewards.device)
                .masked_fill(self.left_out, float("nan")) for name, values in self.parts.items()}


def repeat_rows(text: BatchText, n: int) -> BatchText:
    """Returns `text` with each row repeated `n` times in place (the layout of `n` samples per source)."""
    def repeat(values):
        return None if values is None else [v for v in values for _ in range(n)]

    return BatchText(repeat(text.references), repeat(text.sources),
                     {key: repeat(values) for key, values in text.columns.items()})


def load_tokenizer_for(model):
    """Returns `AutoTokenizer.from_pretrained(model.name_or_path)`, or raises an error saying what to pass."""
    from transformers import AutoTokenizer

    name = getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "")
    if not name:
        raise ValueError(
            "processing_class was not given, and the model has no name_or_path to load a tokenizer from (it was built "
            "from a config): pass processing_class=<the tokenizer of its vocabulary>.")
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    except Exception as err:
        raise ValueError(
            f"processing_class was not given, and no tokenizer could be loaded from the model's name_or_path {name!r} "
            f"({type(err).__name__}: {err}). Pass processing_class=AutoTokenizer.from_pretrained(...) yourself."
        ) from err
