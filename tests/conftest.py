"""Shared fixtures: tiny encoder-decoder models built from configs (no Hub) and toy datasets."""

from __future__ import annotations

import os
import random
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
warnings.filterwarnings("ignore", message=".*pin_memory.*")
# Tiny models gain nothing from intra-op threads, and spinning OpenMP threads collapse when the two cores
# are shared with another process (one forward+backward went from 17 ms to 1 s).
torch.set_num_threads(1)

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


def byt5_tokenizer():
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()


def tiny_model(arch: str = "t5", seed: int = 0, dropout: float = 0.0, d_model: int = 32, layers: int = 1):
    """Returns a tiny randomly initialized encoder-decoder whose ids match `ByT5Tokenizer` (pad 0, eos 1)."""
    from hf_seqrl.models.tiny import build_tiny_model

    # A BART bos distinct from eos, as in pretrained BARTs; ByT5 has none, so it borrows <unk> (2).
    bos = {"bos_token_id": 2} if arch == "bart" else {}
    return build_tiny_model(arch, vocab_size=384, d_model=d_model, layers=layers, dropout=dropout, max_positions=128,
                            pad_token_id=0, eos_token_id=1, seed=seed, **bos)


def toy_pairs(n: int, seed: int = 0, task: str = "copy", alphabet: str = "abcdef", lengths=(3, 6)):
    """Returns (sources, targets) of a toy string task: copy or reverse random letter strings."""
    rng = random.Random(seed)
    sources = ["".join(rng.choice(alphabet) for _ in range(rng.randint(*lengths))) for _ in range(n)]
    targets = sources if task == "copy" else [s[::-1] for s in sources]
    return sources, list(targets)


def toy_dataset(tokenizer, sources, targets, references=None, with_labels=True):
    from datasets import Dataset

    columns = {"input_ids": [], "attention_mask": []}
    enc = tokenizer(list(sources))
    columns["input_ids"], columns["attention_mask"] = enc["input_ids"], enc["attention_mask"]
    if with_labels:
        columns["labels"] = tokenizer(text_target=list(targets))["input_ids"]
    if references is not None:
        columns["references"] = references
    return Dataset.from_dict(columns)


@pytest.fixture
def tokenizer():
    return byt5_tokenizer()


def whole_state_dict(model) -> dict:
    """Returns the model's state dict with whole tensors on CPU: parameters partitioned by DeepSpeed ZeRO-3 are
    gathered, FSDP2's DTensors made full (both collective: every rank calls it)."""
    from torch.distributed.tensor import DTensor

    def whole():
        return {name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu().clone()
                for name, value in model.state_dict().items()}

    if any(hasattr(p, "ds_id") for p in model.parameters()):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            return whole()
    return whole()


def tiny_causal_model(arch: str = "llama", seed: int = 0, d_model: int = 32, layers: int = 2):
    """Returns a tiny randomly initialized decoder-only model whose ids match `ByT5Tokenizer` (pad 0, eos 1)."""
    from hf_seqrl.models.tiny import build_tiny_model

    return build_tiny_model(arch, vocab_size=384, d_model=d_model, layers=layers, max_positions=128, pad_token_id=0,
                            eos_token_id=1, seed=seed)


def prompt_completion_dataset(tokenizer, n: int = 16, seed: int = 0, task: str = "reverse", alphabet: str = "abcd",
                              lengths=(2, 5), **kwargs):
    """Returns a tokenized causal-LM dataset of a toy string task: prompt `"<string>="`, completion its copy or
    reversal (`hf_seqrl.data.tokenize_prompt_completion`)."""
    from datasets import Dataset

    from hf_seqrl.data import tokenize_prompt_completion

    sources, targets = toy_pairs(n, seed=seed, task=task, alphabet=alphabet, lengths=lengths)
    raw = Dataset.from_dict({"prompt": [s + "=" for s in sources], "completion": targets})
    return raw.map(tokenize_prompt_completion, batched=True, remove_columns=raw.column_names,
                   fn_kwargs=dict(tokenizer=tokenizer, **kwargs))
