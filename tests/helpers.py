"""Helpers shared by the tests: tiny models built from configs (no Hub), toy data, trainer arguments, and the
measurements several tests make (parameters, held-out chrF, whole state dicts under sharding)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout: int = 420):
    """Returns `(completed process, seconds)` of `python benchmarks/SCRIPT ARGS` from the repository root, one thread,
    the repository on the path."""
    import subprocess
    import sys
    import time

    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    start = time.perf_counter()
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *map(str, args)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=timeout)
    return result, time.perf_counter() - start


def free_port() -> int:
    """Returns a TCP port of 127.0.0.1 free now, so that concurrent launches do not collide on accelerate's 29500."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env(tmp_path) -> dict[str, str]:
    """Returns the environment of a test's `accelerate launch`: one thread, offline, no user accelerate config and
    caches of its own (HF_HOME under `tmp_path`), DeepSpeed on CPU processes, the repository on the path."""
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                WANDB_DISABLED="true", HF_HOME=str(Path(tmp_path) / "hf_home"), DS_ACCELERATOR="cpu",
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


SHARED_DATA = os.path.join(REPO, "..", "shared", "data")
# What every test trainer runs with unless it says otherwise: a few logged steps, nothing saved or reported.
TRAIN_DEFAULTS = dict(per_device_train_batch_size=4, max_steps=4, learning_rate=1e-3, logging_steps=1, report_to=[],
                      save_strategy="no", max_new_tokens=8, disable_tqdm=True, lr_scheduler_type="constant", seed=0,
                      dataloader_pin_memory=False)


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


def overlap_reward(predictions, references, sources=None, **columns):
    """Non-zero, row-dependent rewards even for an untrained model's outputs (chrF would give 0 everywhere): the
    character-set overlap with the closest reference plus a length term."""
    return [max(len(set(p) & set(r)) / max(len(set(p) | set(r)), 1) + len(p) / 20 for r in refs)
            for p, refs in zip(predictions, references)]


def by_hand_mbr(candidates, utility):
    """The MBR pick written out: the highest mean utility against the other candidates, the first on a tie."""
    picks = []
    for cands in candidates:
        means = [sum(utility([c], [[o]])[0] for j, o in enumerate(cands) if j != i) / (len(cands) - 1)
                 for i, c in enumerate(cands)]
        picks.append(cands[means.index(max(means))])
    return picks


QE_CALLS: list[tuple[str, str]] = []  # (source, candidate) of each candidate `recording_length_qe` scored


def recording_length_qe(predictions, references, sources=None, **columns):
    """A reference-free reward for tests, named as users name theirs (`"helpers:recording_length_qe"`): the length
    of each prediction; every (source, prediction) it scores is appended to `QE_CALLS`."""
    QE_CALLS.extend(zip(sources, predictions))
    return [float(len(p)) for p in predictions]


def length_agreement(predictions, references, sources=None, **columns):
    """A utility by hand that random tiny models make informative: minus the length difference (MBR: the median)."""
    return [-abs(len(p) - len(refs[0])) for p, refs in zip(predictions, references)]


def source_overlap_reward(predictions, references, sources, **columns):
    """A reference-free reward of the sources alone: the character-set overlap with the source plus a length term."""
    return [len(set(p) & set(s)) / max(len(set(p) | set(s)), 1) + len(p) / 20 for p, s in zip(predictions, sources)]


def toy_pairs(n: int, seed: int = 0, task: str = "copy", alphabet: str = "abcdef", lengths=(3, 6)):
    """Returns (sources, targets) of a toy string task: copy or reverse random letter strings."""
    rng = random.Random(seed)
    sources = ["".join(rng.choice(alphabet) for _ in range(rng.randint(*lengths))) for _ in range(n)]
    targets = sources if task == "copy" else [s[::-1] for s in sources]
    return sources, list(targets)


def bpe_tokenizer(texts):
    """Returns a byte-level BPE tokenizer of 280 tokens trained on `texts` (pad 0, EOS 1, unk 2): ids that name other
    tokens than `ByT5Tokenizer`'s."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<pad>", "</s>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                       special_tokens=[("</s>", bpe.token_to_id("</s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


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


def copy_dataset(tokenizer, n: int = 16, seed: int = 0, **kwargs):
    """Returns a tokenized copy task (`toy_dataset`) of `n` strings of 2-5 letters from "abcd"; `kwargs` go to
    `toy_dataset` (`references`, `with_labels`)."""
    sources, targets = toy_pairs(n, seed=seed, alphabet="abcd", lengths=(2, 5))
    return toy_dataset(tokenizer, sources, targets, **kwargs)


def equal_length_dataset(tokenizer, n: int = 8):
    """Returns a tokenized copy task whose targets all have 4 letters: per-batch token means then add up exactly across
    accumulation steps."""
    sources, _ = toy_pairs(n, seed=5, alphabet="abcd", lengths=(4, 4))
    return toy_dataset(tokenizer, sources, sources)


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


def shard_t5(model):
    """Shards a T5 with FSDP2's `fully_shard`, each block and then the root (as accelerate's TRANSFORMER_BASED_WRAP
    does), in place; returns it. Needs an initialized process group."""
    from torch.distributed.fsdp import fully_shard

    for block in [*model.encoder.block, *model.decoder.block]:
        fully_shard(block)
    fully_shard(model)
    return model


def tiny_causal_model(arch: str = "llama", seed: int = 0, d_model: int = 32, layers: int = 2, dropout: float = 0.0):
    """Returns a tiny randomly initialized decoder-only model whose ids match `ByT5Tokenizer` (pad 0, eos 1);
    `dropout` is its attention dropout (Llama and Qwen2 have no other)."""
    from hf_seqrl.models.tiny import build_tiny_model

    return build_tiny_model(arch, vocab_size=384, d_model=d_model, layers=layers, dropout=dropout, max_positions=128,
                            pad_token_id=0, eos_token_id=1, seed=seed)


def text_pairs(causal: bool = False, n: int = 8, seed: int = 0, alphabet: str = "abcd"):
    """Returns a text dataset of the toy copy task (strings of 2-5 letters of `alphabet`) as users bring one: `source` /
    `target` columns, or for a decoder-only model `prompt` (`"<string>="`) / `completion`."""
    from datasets import Dataset

    sources, targets = toy_pairs(n, seed=seed, alphabet=alphabet, lengths=(2, 5))
    if causal:
        return Dataset.from_dict({"prompt": [s + "=" for s in sources], "completion": targets})
    return Dataset.from_dict({"source": sources, "target": targets})


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


def make_config(config_class, tmp_path, **kwargs):
    """Returns `config_class(output_dir=tmp_path / "out", **TRAIN_DEFAULTS)` with `kwargs` on top (the defaults that
    are fields of `config_class`)."""
    defaults = {k: v for k, v in TRAIN_DEFAULTS.items() if k in config_class.__dataclass_fields__}
    return config_class(**{"output_dir": str(tmp_path / "out"), **defaults, **kwargs})


def params(model) -> dict[str, torch.Tensor]:
    """Returns a copy of the model's state dict (to compare before and after training)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def heldout_chrf(model, tokenizer, sources, references, max_new_tokens: int = 8) -> float:
    """Returns the mean sentence chrF of the model's greedy outputs on `sources` against `references` (one string
    or a list of strings per source)."""
    from hf_seqrl.evaluation import generate_texts
    from hf_seqrl.rewards import get_reward

    predictions = generate_texts(model, tokenizer, list(sources), max_new_tokens=max_new_tokens, progress=False)
    references = [[r] if isinstance(r, str) else list(r) for r in references]
    return sum(get_reward("chrf")(predictions, references)) / len(predictions)


def target_loss(model, tokenizer, sources, targets) -> float:
    """Returns an encoder-decoder model's mean teacher-forced cross-entropy per target token on the pairs, in one
    batch (what a trainer's evaluation reports as its loss when the split fits one batch)."""
    labels = tokenizer(text_target=list(targets), padding=True, return_tensors="pt")["input_ids"]
    labels[labels == tokenizer.pad_token_id] = -100
    with torch.no_grad():
        return model.eval()(**tokenizer(list(sources), padding=True, return_tensors="pt"), labels=labels).loss.item()


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Returns the p-value of Pearson's chi-square test of `counts` against `probs` (cells of probability > 0)."""
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    statistic = ((counts[keep] - expected) ** 2 / expected).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic.double() / 2))


def skip_deepspeed_shm_build() -> None:
    """Keeps DeepSpeed from compiling its `deepspeed_shm_comm` C++ op on CPU.

    DeepSpeed's torch comm backend JIT-builds that op whenever `deepspeed.ops` reports it compatible, on every
    machine whose extension cache (`~/.cache/torch_extensions`) lacks it: 1-10 minutes on a fresh machine. Only its
    inference all-reduce uses it; ZeRO's collectives go through `torch.distributed` (gloo here). Call before the
    process group or `deepspeed.initialize` is set up.
    """
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


# ---- model rewards: a one-output classifier built from a config, and tiny COMET checkpoints ---------------------

def tiny_classifier(num_labels=1, seed=0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=384, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=num_labels, pad_token_id=0)
    return BertForSequenceClassification(config).eval()


# Tiny random COMET checkpoints of each class in the Hub layout, made and scored by unbabel-comet in an environment of
# its own (tests/fixtures/comet/make_fixtures.py).
COMET_FIXTURES = REPO / "tests" / "fixtures" / "comet"


def run_card_code(folder, repo_id: str) -> tuple[dict, str]:
    """Returns the namespace and the printed output of the model card's first Python block in `folder/README.md`,
    run with `repo_id` replaced by `folder` (as a user runs it with the model downloaded)."""
    import contextlib
    import io
    import re

    card = (Path(folder) / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", card, re.DOTALL).group(1)
    assert f'"{repo_id}"' in code and "pipeline(" not in code
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace(f'"{repo_id}"', f'"{folder}"'), "model card", "exec"), namespace)
    return namespace, out.getvalue().strip()


# ---- multilingual tokenizers as checkpoints ship them, built offline -------------------------------------------

MULTILINGUAL_TEXT = ["ein hund läuft im park", "a dog runs in the park", "eine katze schläft", "a cat sleeps",
                     "der mann liest ein buch", "the man reads a book", "en fr de ja"]


def sentencepiece_pieces(folder) -> list[tuple[str, float]]:
    """Trains a small unigram sentencepiece model over `MULTILINGUAL_TEXT` into `folder/spm.model` (ids as fairseq
    numbers them: <s> 0, <pad> 1, </s> 2, <unk> 3) and returns its `(piece, score)` pairs."""
    import io

    import sentencepiece as spm

    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(MULTILINGUAL_TEXT * 20), model_writer=proto, vocab_size=40,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False, bos_id=0,
                                   pad_id=1, eos_id=2, unk_id=3, minloglevel=2)
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "spm.model").write_bytes(proto.getvalue())
    model = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    return [(model.id_to_piece(i), model.get_score(i)) for i in range(model.get_piece_size())]


def multilingual_tokenizer(kind: str, folder, **kwargs):
    """Returns a real multilingual tokenizer of `kind` ("m2m100": `M2M100Tokenizer`, "nllb": `NllbTokenizerFast`,
    "mbart50": `MBart50TokenizerFast`) over a sentencepiece model trained in `folder`; `kwargs` (`src_lang`,
    `tgt_lang`) go to its constructor."""
    import json

    from transformers import M2M100Tokenizer, MBart50TokenizerFast, NllbTokenizerFast

    pieces = sentencepiece_pieces(folder)
    if kind == "m2m100":
        (Path(folder) / "vocab.json").write_text(json.dumps({piece: i for i, (piece, _) in enumerate(pieces)}))
        return M2M100Tokenizer(str(Path(folder) / "vocab.json"), str(Path(folder) / "spm.model"), **kwargs)
    if kind == "nllb":
        vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
        return NllbTokenizerFast(vocab=vocab, merges=[], **kwargs)
    if kind == "mbart50":
        return MBart50TokenizerFast(vocab=pieces, **kwargs)
    raise ValueError(kind)


def multilingual_model(tokenizer, seed: int = 0, dropout: float = 0.1):
    """Returns a tiny randomly initialized M2M100 (for M2M100 and NLLB tokenizers) or mBART model whose embedding
    holds every id of `tokenizer`, its language tokens included (M2M100's `len(tokenizer)` leaves them out)."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration, MBartConfig, MBartForConditionalGeneration

    from hf_seqrl.models.languages import language_codes

    size = max(len(tokenizer), max(language_codes(tokenizer).values(), default=0) + 1)
    shape = dict(vocab_size=size, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
                 pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=tokenizer.eos_token_id,
                 decoder_start_token_id=tokenizer.eos_token_id, dropout=dropout)
    torch.manual_seed(seed)
    if type(tokenizer).__name__.startswith("MBart"):
        return MBartForConditionalGeneration(MBartConfig(**shape))
    return M2M100ForConditionalGeneration(M2M100Config(**shape))


def step_context(trainer, text=None, inputs=None, unwrapped=None):
    """Returns a `StepContext` of `trainer`'s current step (slot 0) for calling one stage or service by hand."""
    from hf_seqrl.objectives.base import StepContext
    from hf_seqrl.types import BatchText

    step = trainer.state.global_step
    return StepContext(inputs or {}, text if text is not None else BatchText(None, None, {}),
                       unwrapped if unwrapped is not None else trainer.model, step, 0,
                       trainer.objective.on_policy(step))
