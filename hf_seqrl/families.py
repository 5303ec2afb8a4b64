"""Model families: what differs between encoder-decoder and decoder-only models, behind one small interface.

Trainers, rollouts and diagnostics call a `ModelFamily` and never branch on the model type. A family knows how a
source (seq2seq) or prompt (causal) is read from a batch, how samples and the greedy row are decoded, how decoding
continues from a given prefix, and which logits score given target tokens. `family_for(model)` picks the family.

Coordinates. Every method speaks in *target* coordinates: `targets[:, t]` is the t-th token the model writes (a
seq2seq label, a causal completion token), and `logits[:, t]` its distribution given the source/prompt and
`targets[:, :t]`. A batch is the dict the collator yields (`input_ids`, `attention_mask`, and `labels` when the
dataset has them); a causal row holds prompt + completion with `labels` = -100 on the prompt.
"""

from __future__ import annotations

import torch
from transformers.modeling_outputs import BaseModelOutput

from . import causal
from .rollout import (Rollout, ScoredRollout, decoder_start_id, expand_encoder_states, pad_id,
                      rollout_generation_config, sample_from_prefix, sample_rollout, score_rollout, shift_right,
                      strip_decoded)

SUPPORTED = ("encoder-decoder models (AutoModelForSeq2SeqLM: T5, BART, Marian, mBART, Pegasus, or an "
             "EncoderDecoderModel)", "decoder-only models (AutoModelForCausalLM: Llama, Qwen2, Mistral, GPT-2, ...)")


def _unwrap(model):
    return model.module if hasattr(model, "module") else model


class ModelFamily:
    """The interface; see the module docstring for its coordinates. Methods take unwrapped models unless noted."""

    name: str = ""
    auto_class: str = ""  # the transformers Auto class that loads a trained model of this family

    def generation_config(self, model, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, max_length=None):
        """Returns the `GenerationConfig` of rollouts: the model's own distribution, structural tokens only."""
        raise NotImplementedError

    def sample(self, model, batch: dict, generation_config, num_samples: int = 1, with_greedy: bool = False) -> Rollout:
        """Returns `num_samples` samples per source and, with `with_greedy`, its greedy decode (in one decode; the
        encoder runs once per source, a long prompt is read once)."""
        raise NotImplementedError

    def score(self, model, batch: dict, sample_ids, num_samples: int, gold_labels=None,
              temperature: float = 1.0) -> ScoredRollout:
        """Returns the token log-probs (with grad) of `sample_ids` `(B*n, T)` under the (possibly wrapped) model;
        `gold_logits` is aligned with `gold_labels` (the batch's `labels`) when they are given."""
        raise NotImplementedError

    def generate(self, model, batch: dict, **generate_kwargs):
        """Returns `model.generate`'s output for the sources/prompts of `batch`, target tokens only for causal
        models (the seq2seq output keeps its decoder start token, as `generate` returns it)."""
        raise NotImplementedError

    def continue_from(self, model, batch: dict, prefix, generation_config):
        """Returns `(ids (N, T), mask (N, T))`: greedy/sampled targets that start with `prefix` `(N, k)` (pad after
        EOS, mask true up to and including it)."""
        raise NotImplementedError

    def encode(self, model, batch: dict):
        """Returns what every pass over `batch` reads (seq2seq: the encoder output, with grad when enabled)."""
        raise NotImplementedError

    def rotate(self, encoded, shifts: int = -1):
        """Returns `encoded` with its sources rolled by `shifts` rows (each target then reads another source)."""
        raise NotImplementedError

    def select(self, encoded, index: torch.Tensor | None):
        """Returns `encoded` with its rows gathered by `index` `(N,)` (row i reads source `index[i]`; gradients flow
        back to the gathered rows); `None` returns it unchanged."""
        raise NotImplementedError

    def detach(self, encoded):
        """Returns `encoded` cut from the graph (what no-grad passes over the same sources read)."""
        raise NotImplementedError

    def target_labels(self, batch: dict) -> torch.Tensor:
        """Returns the gold targets of a batch in target coordinates, `(B, T)`, -100 after each row's last token."""
        raise NotImplementedError

    def target_forward(self, model, encoded, targets, repeats: int = 1, output_hidden_states: bool = False):
        """Returns the model output whose `logits[:, t]` `(N, T, V)` score `targets[:, t]` `(B*repeats, T)` (the
        teacher-forced pass; -100 read as pad) and, when asked, `hidden_states` `(N, T, d)`: the last layer at the
        same positions, position t reading the input that precedes `targets[:, t]`."""
        raise NotImplementedError

    def input_embeddings(self, model):
        """Returns the embedding module whose output feeds the target positions (perturbed by the diagnostics)."""
        return model.get_input_embeddings()

    def target_offset(self, encoded) -> int:
        """Returns the position in the embedded rows of target position 0's input."""
        return 0

    def teacher_forcing(self, model, batch: dict):
        """Returns `(fed (B, S), aligned_labels (B, S))`: the inputs of teacher forcing and the labels their logits
        predict, position by position (as scheduled sampling mixes them)."""
        raise NotImplementedError

    def fed_inputs(self, batch: dict, fed, encoded) -> dict:
        """Returns the model inputs (with `labels`) of feeding `fed` instead of the gold inputs."""
        raise NotImplementedError

    def tokenize(self, examples: dict, tokenizer, source_column: str, target_column: str, max_source_length=None,
                 max_target_length=None, prefix: str = "", decoder_start_token_id=None, prompt_template=None,
                 use_chat_template: bool = False) -> dict:
        """Returns the tokenized features of source/target pairs (a `datasets.map(batched=True)` function): what
        `data.tokenize_pairs` (seq2seq) or `data.tokenize_prompt_completion` (causal) make of them."""
        raise NotImplementedError

    def label_start_id(self, model) -> int | None:
        """Returns the token that tokenized labels must not start with (the decoder start token), or None."""
        return None

    def tokenize_sources(self, tokenizer, sources, max_length=None) -> dict:
        """Returns the padded `input_ids` / `attention_mask` tensors `(B, S)` of source or prompt texts."""
        raise NotImplementedError

    def tokenize_targets(self, model, tokenizer, texts, max_length=None) -> list[list[int]]:
        """Returns the target token ids of reference texts, EOS included, as the model writes them."""
        raise NotImplementedError

    def structural_ids(self, model) -> list[int]:
        """Returns token ids that start a target without being part of it (never an injected mistake)."""
        return []

    def check_rows(self, dataset, name: str) -> None:
        """Raises a clear error naming a row of a `datasets.Dataset` that this family cannot train on."""

    def prediction_step(self, trainer, parent, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Returns `(loss, generated, labels)` of an evaluation batch; `parent` is `Seq2SeqTrainer.prediction_step`."""
        return parent(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)


class Seq2SeqFamily(ModelFamily):
    """Encoder-decoder models: the source is the encoder's input; targets follow the decoder start token."""

    name, auto_class = "seq2seq", "AutoModelForSeq2SeqLM"

    def generation_config(self, model, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, max_length=None):
        return rollout_generation_config(model, max_new_tokens, temperature, top_k, top_p, max_length=max_length)

    def sample(self, model, batch, generation_config, num_samples=1, with_greedy=False):
        return sample_rollout(model, batch["input_ids"], batch.get("attention_mask"), generation_config, num_samples,
                              with_greedy=with_greedy)

    def sample_from_prefix(self, model, batch, prefix, generation_config, num_samples=1, with_greedy=False):
        return sample_from_prefix(model, batch["input_ids"], batch.get("attention_mask"), prefix, generation_config,
                                  num_samples, with_greedy=with_greedy)

    def score(self, model, batch, sample_ids, num_samples, gold_labels=None, temperature=1.0):
        inner = _unwrap(model)
        return score_rollout(model, batch["input_ids"], batch.get("attention_mask"), sample_ids, num_samples,
                             decoder_start_id(inner), pad_id(inner), gold_labels, temperature)

    def generate(self, model, batch, **generate_kwargs):
        return model.generate(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                              **generate_kwargs)

    def continue_from(self, model, batch, prefix, generation_config):
        forced = None if prefix is None else torch.cat(
            [prefix.new_full((prefix.shape[0], 1), decoder_start_id(model)), prefix], dim=1)
        out = model.generate(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                             generation_config=generation_config, decoder_input_ids=forced)
        return strip_decoded(out, model)

    def encode(self, model, batch):
        out = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                                  return_dict=True)
        return {"encoder_outputs": BaseModelOutput(last_hidden_state=out.last_hidden_state),
                "attention_mask": batch.get("attention_mask")}

    def rotate(self, encoded, shifts=-1):
        states = encoded["encoder_outputs"].last_hidden_state.roll(shifts, dims=0)
        mask = encoded["attention_mask"]
        return {"encoder_outputs": BaseModelOutput(last_hidden_state=states),
                "attention_mask": None if mask is None else mask.roll(shifts, dims=0)}

    def select(self, encoded, index):
        if index is None:
            return encoded
        states, mask = encoded["encoder_outputs"].last_hidden_state, encoded["attention_mask"]
        return {"encoder_outputs": BaseModelOutput(last_hidden_state=states[index]),
                "attention_mask": None if mask is None else mask[index]}

    def detach(self, encoded):
        states = encoded["encoder_outputs"].last_hidden_state.detach()
        return {"encoder_outputs": BaseModelOutput(last_hidden_state=states), "attention_mask": encoded["attention_mask"]}

    def target_labels(self, batch):
        return batch["labels"]

    def target_forward(self, model, encoded, targets, repeats=1, output_hidden_states=False):
        inner = _unwrap(model)
        rows = shift_right(targets, decoder_start_id(inner), pad_id(inner))
        with expand_encoder_states(model, repeats):
            out = model(encoder_outputs=encoded["encoder_outputs"], attention_mask=encoded["attention_mask"],
                        decoder_input_ids=rows, output_hidden_states=output_hidden_states, use_cache=False)
        if output_hidden_states:
            out.hidden_states = out.decoder_hidden_states[-1]
        return out

    def input_embeddings(self, model):
        return model.get_decoder().get_input_embeddings()

    def teacher_forcing(self, model, batch):
        labels = batch["labels"]
        return shift_right(labels, decoder_start_id(model), pad_id(model)), labels

    def fed_inputs(self, batch, fed, encoded):
        inputs = {k: v for k, v in batch.items() if k not in ("input_ids", "decoder_input_ids")}
        inputs.update(encoder_outputs=encoded["encoder_outputs"], decoder_input_ids=fed)
        return inputs

    def tokenize(self, examples, tokenizer, source_column, target_column, max_source_length=None,
                 max_target_length=None, prefix="", decoder_start_token_id=None, prompt_template=None,
                 use_chat_template=False):
        from .data import tokenize_pairs

        if prompt_template is not None or use_chat_template:
            raise ValueError("prompt_template and use_chat_template shape the prompts of decoder-only models; an "
                             "encoder-decoder model reads the source itself (source_prefix adds a task prefix).")
        return tokenize_pairs(examples, tokenizer, source_column, target_column, max_source_length,
                              max_target_length, prefix, decoder_start_token_id)

    def label_start_id(self, model):
        return decoder_start_id(model)

    def tokenize_sources(self, tokenizer, sources, max_length=None):
        enc = tokenizer(list(sources), return_tensors="pt", padding=True, truncation=max_length is not None,
                        max_length=max_length)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def tokenize_targets(self, model, tokenizer, texts, max_length=None):
        from .data import strip_start_token

        ids = tokenizer(text_target=list(texts), truncation=max_length is not None, max_length=max_length)["input_ids"]
        return strip_start_token(ids, decoder_start_id(model))

    def structural_ids(self, model):
        return [decoder_start_id(model)]


class CausalFamily(ModelFamily):
    """Decoder-only models: the prompt precedes the completion in one row; only completion tokens count."""

    name, auto_class = "causal", "AutoModelForCausalLM"

    def generation_config(self, model, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, max_length=None):
        return causal.causal_generation_config(model, max_new_tokens, temperature, top_k, top_p, max_length)

    def sample(self, model, batch, generation_config, num_samples=1, with_greedy=False):
        return causal.sample_causal(model, batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                                    generation_config, num_samples, with_greedy)

    def sample_from_prefix(self, model, batch, prefix, generation_config, num_samples=1, with_greedy=False):
        return causal.sample_causal(model, batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                                    generation_config, num_samples, with_greedy, prefix_ids=prefix)

    def score(self, model, batch, sample_ids, num_samples, gold_labels=None, temperature=1.0):
        return causal.score_causal(model, batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                                   sample_ids, num_samples, pad_id(_unwrap(model)), gold_labels, temperature)

    def prompts(self, model, batch):
        """Returns the left-padded prompts `(ids (B, P), mask (B, P))` of a batch."""
        return causal.split_prompts(batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                                    pad_id(_unwrap(model)))

    def generate(self, model, batch, **generate_kwargs):
        # Prompts differ in length: a `max_length` (Seq2SeqTrainer's generation_max_length) counts completion tokens.
        if generate_kwargs.get("max_length") is not None and generate_kwargs.get("max_new_tokens") is None:
            generate_kwargs["max_new_tokens"] = generate_kwargs.pop("max_length")
        generate_kwargs.pop("max_length", None)
        # `synced_gpus` (set by Seq2SeqTrainer under ZeRO-3 and FSDP) reaches `generate`, which then keeps every rank
        # stepping until all ranks' rows have ended.
        prompt_ids, prompt_mask = self.prompts(model, batch)
        ids, _ = causal.generate_completions(_unwrap(model), prompt_ids, prompt_mask, **generate_kwargs)
        return ids

    def prediction_step(self, trainer, parent, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        if not trainer.args.predict_with_generate or prediction_loss_only:
            return parent(model, inputs, prediction_loss_only, ignore_keys)
        loss, _, _ = parent(model, inputs, True, ignore_keys)  # the teacher-forced loss of the completions
        inputs = trainer._prepare_inputs(inputs)
        if not gen_kwargs and hasattr(trainer, "_gen_kwargs"):
            gen_kwargs = trainer._gen_kwargs.copy()
        gen_kwargs = {k: v for k, v in gen_kwargs.items() if v is not None}
        with torch.no_grad():
            generated = self.generate(trainer.accelerator.unwrap_model(model), inputs, **gen_kwargs)
        labels = inputs.get("labels")
        return loss, generated, None if labels is None else causal.completion_labels(labels)

    def check_rows(self, dataset, name):
        columns = getattr(dataset, "column_names", None)
        if not isinstance(columns, list) or "labels" not in columns or not hasattr(dataset, "iter"):
            return
        offset = 0
        for batch in dataset.select_columns(["input_ids", "labels"]).iter(batch_size=1000):
            for i, (ids, labels) in enumerate(zip(batch["input_ids"], batch["labels"])):
                if len(ids) != len(labels):
                    raise ValueError(
                        f"{name} row {offset + i}: a causal LM reads 'labels' aligned with 'input_ids' (prompt + "
                        f"completion, -100 on the prompt), but they have {len(labels)} and {len(ids)} tokens. Build the "
                        "rows with hf_seqrl.data.tokenize_prompt_completion.")
                if labels and labels[0] != -100:
                    raise ValueError(f"{name} row {offset + i}: its first token is already a label, so it has no "
                                     "prompt to sample from: set labels to -100 on the prompt tokens.")
            offset += len(batch["labels"])

    def continue_from(self, model, batch, prefix, generation_config):
        prompt_ids, prompt_mask = causal.append_prefix(*self.prompts(model, batch), prefix)
        ids, _ = causal.generate_completions(model, prompt_ids, prompt_mask, generation_config=generation_config)
        ids = ids if prefix is None else torch.cat([prefix, ids], dim=1)
        mask = causal.completion_mask(ids, causal.eos_ids(model))
        return ids.masked_fill(~mask, pad_id(model)), mask

    def encode(self, model, batch):
        prompt_ids, prompt_mask = self.prompts(model, batch)
        return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask}

    def rotate(self, encoded, shifts=-1):
        return {key: value.roll(shifts, dims=0) for key, value in encoded.items()}

    def select(self, encoded, index):
        return encoded if index is None else {key: value[index] for key, value in encoded.items()}

    def detach(self, encoded):
        return encoded  # token ids: nothing to cut

    def target_labels(self, batch):
        return causal.completion_labels(batch["labels"])

    def target_forward(self, model, encoded, targets, repeats=1, output_hidden_states=False):
        return causal.completion_forward(model, encoded["prompt_ids"], encoded["prompt_mask"],
                                         targets.masked_fill(targets == -100, pad_id(_unwrap(model))), repeats,
                                         output_hidden_states)

    def target_offset(self, encoded):
        return encoded["prompt_ids"].shape[1] - 1

    def teacher_forcing(self, model, batch):
        labels = batch["labels"]
        # The logits at position t predict the token at t + 1.
        aligned = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
        return batch["input_ids"], aligned

    def fed_inputs(self, batch, fed, encoded):
        return {**batch, "input_ids": fed}

    def tokenize(self, examples, tokenizer, source_column, target_column, max_source_length=None,
                 max_target_length=None, prefix="", decoder_start_token_id=None, prompt_template=None,
                 use_chat_template=False):
        from .data import tokenize_prompt_completion

        if prefix and prompt_template is None:
            prompt_template = prefix + "{prompt}"
        return tokenize_prompt_completion(examples, tokenizer, source_column, target_column, max_source_length,
                                          max_target_length, prompt_template, use_chat_template)

    def tokenize_sources(self, tokenizer, sources, max_length=None):
        from .data import prompt_token_ids

        rows = [prompt_token_ids(source, tokenizer, max_length) for source in sources]
        width = max(len(row) for row in rows)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return {"input_ids": torch.tensor([[pad] * (width - len(row)) + row for row in rows]),
                "attention_mask": torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])}

    def tokenize_targets(self, model, tokenizer, texts, max_length=None):
        from .data import completion_token_ids

        return [completion_token_ids(text, tokenizer, max_length) for text in texts]

    def structural_ids(self, model):
        bos = model.generation_config.bos_token_id
        return [] if bos is None else [int(bos)]


FAMILIES = {"seq2seq": Seq2SeqFamily(), "causal": CausalFamily()}


def family_for_config(config) -> ModelFamily:
    """Returns the family of a model config: seq2seq when `config.is_encoder_decoder`, else causal."""
    return FAMILIES["seq2seq" if getattr(config, "is_encoder_decoder", False) else "causal"]


def family_for(model) -> ModelFamily:
    """Returns the family of `model`, or raises an error naming the supported models."""
    if model is None:
        raise ValueError("Pass `model=`: one of " + "; ".join(SUPPORTED) + ".")
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return FAMILIES["seq2seq"]
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate) and can_generate() and model.get_output_embeddings() is not None:
        return FAMILIES["causal"]
    raise ValueError(
        f"{type(model).__name__} is neither an encoder-decoder model (config.is_encoder_decoder) nor a causal "
        "language model that generates text (a model with an LM head). hf-seqrl trains " + " and ".join(SUPPORTED)
        + ": load one with AutoModelForSeq2SeqLM or AutoModelForCausalLM.")


def load_pretrained(name_or_path: str, **kwargs):
    """Returns the model at `name_or_path`, loaded with its family's Auto class (from its config)."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(name_or_path, **kwargs)
    return getattr(transformers, family_for_config(config).auto_class).from_pretrained(name_or_path, **kwargs)
