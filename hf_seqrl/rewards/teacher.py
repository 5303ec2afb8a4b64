"""`TeacherLikelihoodReward`: a teacher's length-normalized log-likelihood of the decoded text, given the source, as a
sequence reward. It reads text, so the teacher may have any tokenizer and either family (e.g. a 7B decoder-only
teacher for a Marian student); the token-level divergences of `DistillationTrainer` need the student's tokenizer."""

from __future__ import annotations

from .neural import ModelReward, _from_pretrained, _tokenizer_for, unique


class TeacherLikelihoodReward(ModelReward):
    """The mean log-probability per token that a teacher gives each prediction after its source: `(1/|y|) sum_t
    log p_teacher(y_t | y_<t, x)`, the prediction tokenized by the teacher's own tokenizer (its EOS counted).

    An encoder-decoder teacher reads the source as its input and the prediction as its target; a decoder-only teacher
    reads `prompt_template` with the source in its `{source}` field (default: the source alone; with
    `use_chat_template` wrapped as a user message in the tokenizer's chat template) and scores the prediction as the
    continuation. Every distinct (source, prediction) pair of a call is scored once, `batch_size` to a forward, in
    eval mode on the trainer's device (the trainers place it, as the other model rewards).

    Args:
        model (`str` or `PreTrainedModel`): the teacher (a Hub id, a folder, or a loaded model).
        tokenizer (*optional*): the teacher's tokenizer (default: loaded from the model's `name_or_path`).
        prompt_template (`str`, *optional*): decoder-only teachers: the prompt, with a `{source}` field.
        use_chat_template (`bool`, *optional*, defaults to `False`): decoder-only teachers: the prompt as a chat turn.
        batch_size (`int`, *optional*, defaults to `16`), max_length (`int`, *optional*, defaults to `512`); device.
    """

    needs_references = False  # it reads the source and the prediction alone

    def __init__(self, model, tokenizer=None, prompt_template: str | None = None, use_chat_template: bool = False,
                 batch_size: int = 16, max_length: int = 512, device=None):
        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoConfig

        if prompt_template is not None and "{source}" not in prompt_template:
            raise ValueError(f"TeacherLikelihoodReward: prompt_template={prompt_template!r} has no {{source}} field.")
        if isinstance(model, str) or hasattr(model, "__fspath__"):
            seq2seq = getattr(AutoConfig.from_pretrained(str(model)), "is_encoder_decoder", False)
            model = _from_pretrained(AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM, model)
        self.model = model
        self.seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
        self.tokenizer = _tokenizer_for(self.model, tokenizer)
        if self.tokenizer.pad_token_id is None:
            raise ValueError("TeacherLikelihoodReward: the teacher's tokenizer has no pad token; set tokenizer.pad_token "
                             "(e.g. to its eos_token) before building the reward.")
        self.prompt_template, self.use_chat_template, self.max_length = prompt_template, use_chat_template, max_length
        self.__name__ = "teacher_likelihood"
        super().__init__(batch_size, device)

    def prompt(self, source: str) -> str:
        """Returns what a decoder-only teacher reads before the prediction."""
        text = source if self.prompt_template is None else self.prompt_template.format(source=source)
        if self.use_chat_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        return text

    def rows(self, pairs: list[tuple[str, str]]):
        """Returns the model inputs of `pairs` `(source, prediction)` and the target ids `(R, L)` the scores read:
        the prediction's tokens (EOS included) where they are predicted, -100 elsewhere."""
        import torch

        tok, eos = self.tokenizer, self.tokenizer.eos_token_id
        if self.seq2seq:
            inputs = tok([s for s, _ in pairs], padding=True, truncation=True, max_length=self.max_length,
                         return_tensors="pt")
            labels = tok(text_target=[p for _, p in pairs], padding=True, truncation=True, max_length=self.max_length,
                         return_tensors="pt")
            targets = labels["input_ids"].masked_fill(labels["attention_mask"] == 0, -100)
            return {**inputs, "labels": targets}, targets
        rows, targets = [], []
        for source, prediction in pairs:
            prompt = tok(self.prompt(source), add_special_tokens=not self.use_chat_template)["input_ids"]
            completion = tok(prediction, add_special_tokens=False)["input_ids"] + ([] if eos is None else [eos])
            ids = (prompt + completion)[-self.max_length:]
            rows.append(ids)
            # position t predicts token t + 1: a completion token at t + 1 is scored from position t
            targets.append(([-100] * (len(ids) - len(completion)) + completion)[1:] + [-100])
        width = max(len(ids) for ids in rows)
        pad = tok.pad_token_id
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in rows])
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in rows])
        target = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
        return {"input_ids": input_ids, "attention_mask": mask}, target

    def __call__(self, predictions, references=None, sources=None, **columns) -> list[float]:
        import torch

        if not predictions:
            return []
        if sources is None:
            raise ValueError("TeacherLikelihoodReward scores each prediction given its source: add a `sources` column "
                             "(or text columns) to the dataset.")
        distinct, positions = unique(list(zip(sources, predictions)))
        device = self.model_device
        scores: list[float] = []
        with torch.inference_mode():
            for chunk in self.batches(distinct):
                inputs, targets = self.rows(chunk)
                inputs = {key: value.to(device) for key, value in inputs.items()}
                logits = self.model(**inputs).logits.float()
                targets = targets.to(device)
                counted = targets != -100
                logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
                per_row = (logprobs * counted).sum(-1) / counted.sum(-1).clamp(min=1)
                scores += per_row.tolist()
        return [scores[i] for i in positions]
