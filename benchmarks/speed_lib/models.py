"""The models and inputs of the speed benchmark: realistic shapes built from configs with a word-level tokenizer,
synthetic batches, and the device helpers the other benchmarks share (`synchronize`, `on_accelerator`)."""

from __future__ import annotations

import torch

SHAPES = {  # name: (config kwargs, batch, source length, target length / max new tokens)
    "t5-small": dict(arch="t5", d_model=512, layers=6, heads=8, ffn=2048, vocab=32128),
    "marian-base": dict(arch="marian", d_model=512, layers=6, heads=8, ffn=2048, vocab=58101),
    # NLLB's vocabulary (256,206 tokens) on a t5-small body: where the logits dominate a step's memory
    "t5-small-256k": dict(arch="t5", d_model=512, layers=6, heads=8, ffn=2048, vocab=256206),
}
TASKS = {"translation": dict(src_len=32, tgt_len=32), "summarization": dict(src_len=256, tgt_len=48)}
# --quick: the same sources, half the new tokens, so that the whole table takes under 2 minutes.
QUICK_TASKS = {"translation": dict(src_len=32, tgt_len=16), "summarization": dict(src_len=256, tgt_len=24)}


def word_tokenizer(size: int):
    """Returns a word-level tokenizer of `size` tokens: `<pad>` 0, `</s>` 1, `<unk>` 2, then `w3`, `w4`, ..."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    vocab.update({f"w{i}": i for i in range(3, size)})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def build(shape: str, device: str):
    """Returns (model, tokenizer) of the given shape, randomly initialized, with a word-level tokenizer."""
    from hf_seqrl.models.tiny import build_tiny_model

    spec = SHAPES[shape]
    tok = word_tokenizer(spec["vocab"])
    # The tables in benchmarks/results/speed*.json were measured with MarianConfig's default forced_eos_token_id
    # (0, <pad> here), which replaces the last token of every Marian sample cut at max_new_tokens.
    marian_default = {"forced_eos_token_id": 0} if spec["arch"] == "marian" else {}
    model = build_tiny_model(spec["arch"], tokenizer=tok, d_model=spec["d_model"], layers=spec["layers"],
                             heads=spec["heads"], ffn=spec["ffn"], max_positions=512, seed=0, **marian_default)
    return model.to(device).train(), tok


def batch_for(task: str, batch: int, vocab: int, device: str):
    gen = torch.Generator().manual_seed(1)
    spec = TASKS[task]
    src = torch.randint(3, vocab, (batch, spec["src_len"]), generator=gen)
    src[:, -1] = 1
    labels = torch.randint(3, vocab, (batch, spec["tgt_len"]), generator=gen)
    labels[:, -1] = 1
    refs = [[" ".join(f"w{int(t)}" for t in row[: spec["tgt_len"] // 2 + 5])] for row in labels]
    return src.to(device), torch.ones_like(src).to(device), labels.to(device), refs


def synchronize(device: str) -> None:
    """Waits for the work queued on `device` (nothing to wait for on the CPU)."""
    kind = torch.device(device).type
    if kind != "cpu":
        torch.get_device_module(kind).synchronize()


def on_accelerator(device: str) -> bool:
    return torch.device(device).type != "cpu"
