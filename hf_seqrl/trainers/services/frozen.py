"""Frozen models scored on the policy's tokens: the KL reference (a frozen copy of the policy, or the policy's own
network with its adapter off), and any other model that reads the policy's tokens (a teacher).

Each pass runs under `torch.no_grad()` and the policy's autocast (the models never went through `accelerator.prepare`).
A teacher runs in eval mode. The KL reference follows the policy's mode instead and replays the random draws of the
policy's next scoring pass: with dropout on, both passes thin the same units, so the KL measures the weights'
difference only (0 at the first step).
"""

from __future__ import annotations

import contextlib
import copy

import torch

from ...models.base import replayed_rng
from .adapters import add_reference_adapter, is_peft_model, reference_of


def vocabulary_size(model) -> int | None:
    """Returns the number of rows of `model`'s output layer (its logits' width), None when it has none."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return None if weight is None else int(weight.shape[0])


# The loading arguments of `teacher_model_init_kwargs` that also say where a model's tokenizer is.
HUB_ARGUMENTS = ("revision", "subfolder", "token", "cache_dir", "local_files_only")


def saved_vocabulary(model, **hub_arguments) -> dict | None:
    """Returns the vocabulary of the tokenizer saved with `model` (at its `name_or_path`, read with `hub_arguments` of
    `HUB_ARGUMENTS`), None when the model names no folder or Hub id, none holds `tokenizer_config.json` or
    `tokenizer.json` (`AutoTokenizer` would build a default one from the config), or it does not load."""
    from transformers import AutoTokenizer
    from transformers.utils import cached_file

    name = getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "")
    if not name:
        return None
    arguments = {k: v for k, v in hub_arguments.items() if k in HUB_ARGUMENTS}
    try:
        if not any(cached_file(name, file, _raise_exceptions_for_missing_entries=False,
                               _raise_exceptions_for_connection_errors=False, **arguments)
                   for file in ("tokenizer_config.json", "tokenizer.json")):
            return None
        return AutoTokenizer.from_pretrained(name, trust_remote_code=False, **arguments).get_vocab()
    except (OSError, ValueError, ImportError):  # unreadable, or its tokenizer needs a package not installed
        return None


def conflicting_ids(vocabulary: dict, other: dict) -> list[int]:
    """Returns the ids that both vocabularies (token -> id) define with different tokens, in order: none when one only
    adds tokens at ids the other leaves free."""
    tokens = {i: token for token, i in other.items()}
    return sorted(i for token, i in vocabulary.items() if tokens.get(i, token) != token)


class FrozenModel:
    """A model the trainer scores without training it.

    Args:
        name (`str`): what logs and errors call it (`"reference"`, `"teacher"`).
        model (*optional*): the model itself; None for the policy's own network (an adapter's base).
        policy (*optional*): a callable returning the unwrapped policy, for `model=None`.
        adapter (`str`, *optional*): with `model=None`, the policy's frozen adapter that gives this model (None: the
            adapter off).
        follow_policy (`bool`): run in the policy's mode, replaying its random draws (the KL reference); else eval mode.
    """

    def __init__(self, name: str, model=None, policy=None, adapter: str | None = None, follow_policy: bool = False,
                 width: int | None = None):
        self.name, self.model, self.policy, self.adapter, self.follow_policy = name, model, policy, adapter, follow_policy
        self.width = width  # the policy's vocabulary, where this model's output layer pads it with more rows

    @classmethod
    def reference_of(cls, policy_model, device, policy) -> FrozenModel:
        """Returns the KL reference of `policy_model` (unwrapped): its network with the adapter off (or a frozen copy
        of the adapter it came with), never a second copy of the base weights; a frozen copy of a model without an
        adapter, on `device`."""
        if is_peft_model(policy_model):
            return cls("reference", policy=policy, adapter=add_reference_adapter(policy_model), follow_policy=True)
        return cls("reference", copy.deepcopy(policy_model).to(device).requires_grad_(False), follow_policy=True)

    @classmethod
    def teacher(cls, model, device, policy_model, name: str = "teacher", tokenizer=None,
                hub_arguments: dict | None = None) -> FrozenModel:
        """Returns `model` frozen in eval mode on `device`, after checking it reads the policy's tokens.

        - Its output layer is as wide as `policy_model`'s, or wider where it was saved with the policy's `tokenizer`
          (its vocabulary read from its folder or Hub id, `saved_vocabulary`) whose tokens both layers cover: the
          extra rows only pad it (Qwen2.5-7B's 152,064 rows against Qwen2.5-0.5B's 151,936), and a divergence
          compares its distribution over the policy's rows (`width`).
        - At any width, a teacher saved with a tokenizer in which an id names another token than in `tokenizer`'s
          (`conflicting_ids`) is refused; tokens one side only adds are not a conflict. A model object without a
          folder is checked by width only.
        """
        width, policy_width = vocabulary_size(model), vocabulary_size(policy_model)
        vocabulary = saved_vocabulary(model, **(hub_arguments or {})) if tokenizer is not None else None
        conflicts = [] if vocabulary is None else conflicting_ids(vocabulary, tokenizer.get_vocab())
        padded = (width is not None and policy_width is not None and width > policy_width and tokenizer is not None
                  and len(tokenizer) <= policy_width and vocabulary is not None and not conflicts)
        if width is not None and policy_width is not None and width != policy_width and not padded:
            raise ValueError(
                f"{name}_model has an output layer of {width} tokens and the policy one of {policy_width}: a {name} "
                "scores the policy's tokens, so it needs the policy's tokenizer (the same vocabulary). Pass a model "
                "trained with that tokenizer; a wider output layer whose extra rows only pad it is taken when the "
                f"{name} comes as a folder or Hub id holding that tokenizer.")
        if conflicts:
            raise ValueError(
                f"{name}_model was saved with a tokenizer whose ids name other tokens than the policy's "
                f"(processing_class) does: {len(conflicts)} ids differ, the first {conflicts[0]}. It cannot score the "
                f"policy's tokens. Pass a {name} trained with the policy's tokenizer; for a {name} with another "
                "tokenizer, reward with rewards.TeacherLikelihoodReward.")
        return cls(name, model.to(device).requires_grad_(False).eval(), width=policy_width if padded else None)

    @property
    def card_name(self) -> str:
        """Returns what a model card calls this model: where it was loaded from, else its class."""
        model = self.model if self.model is not None else self.policy()
        return getattr(model.config, "_name_or_path", "") or type(model).__name__

    @contextlib.contextmanager
    def active(self):
        """Within the context, yields the model to run (the policy with its adapter switched for `model=None`)."""
        if self.model is not None:
            yield self.model
            return
        with reference_of(self.policy(), self.adapter) as model:
            yield model

    @contextlib.contextmanager
    def running(self, accelerator, training: bool, rng_state=None, device=None):
        """Within the context, yields the model ready for a pass: no grad, the policy's autocast, in the policy's
        mode (`training`) with `rng_state` replayed when it follows the policy, else in eval mode."""
        replay = replayed_rng(rng_state, device) if self.follow_policy and rng_state is not None \
            else contextlib.nullcontext()
        with self.active() as model, torch.no_grad(), accelerator.autocast(), replay:
            mode = model.training
            model.train(training if self.follow_policy else False)
            try:
                yield model
            finally:
                if self.model is not None:
                    model.train(mode)
