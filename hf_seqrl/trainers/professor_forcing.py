"""`ProfessorForcingTrainer`: teacher forcing plus an adversarial term on the decoder's hidden states.

Lamb et al. (2016): a discriminator learns to tell the decoder's hidden-state sequences under teacher forcing from
those under free running (the model reading its own outputs); the model is trained with cross-entropy plus a loss
that makes its free-running states look teacher-forced, so its behaviour on its own prefixes is pulled towards its
behaviour on gold prefixes.

One step, per batch of `B` sources:
1. no grad: the model writes its own output for each source (greedy or sampled, `sampling`);
2. one decoder pass over `2B` rows, the encoder run once: row `2i` reads the gold target (teacher forcing), row
   `2i + 1` the model's own output; the last decoder hidden states of both, and the cross-entropy of the gold rows;
3. the discriminator takes one step of its own optimizer on the detached states (gold rows real, own rows fake);
4. loss = cross-entropy + `adversarial_weight` · mean softplus(−D(own rows)), with the discriminator frozen.
The gradient of the adversarial term reaches the model through the hidden states of its own outputs (the tokens
themselves are discrete and carry none).
"""

from __future__ import annotations

import inspect
import os

import torch
from torch import nn

from .. import losses
from ..configs import ProfessorForcingConfig
from ..functional.adversarial import adversarial_loss, discriminator_loss
from ..papers import Method, Paper
from ..models.tokens import right_pad
from .base import SeqRLBaseTrainer

LAMB_2016 = Paper(key="lamb2016professor", cite="Lamb et al., 2016", url="https://arxiv.org/abs/1610.09038",
                  title="Professor Forcing: A New Algorithm for Training Recurrent Networks", citation="""\
@inproceedings{lamb2016professor,
  title     = {Professor Forcing: A New Algorithm for Training Recurrent Networks},
  author    = {Lamb, Alex and Goyal, Anirudh and Zhang, Ying and Zhang, Saizheng and Courville, Aaron and
               Bengio, Yoshua},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year      = {2016},
  url       = {https://arxiv.org/abs/1610.09038}
}""")

DISCRIMINATOR_FILE = "discriminator.safetensors"
DISCRIMINATOR_OPTIMIZER_FILE = "discriminator_optimizer.pt"


class HiddenStateDiscriminator(nn.Module):
    """Returns one logit per hidden-state sequence: > 0 for "teacher-forced", < 0 for "free-running".

    A linear projection, then a bidirectional GRU (`kind="gru"`) or one transformer encoder layer
    (`kind="transformer"`), mean-pooled over the positions of each sequence.

    Args:
        input_size (`int`): width of the decoder's hidden states.
        hidden_size (`int`): width of the discriminator.
        kind (`str`): `"gru"` or `"transformer"`.
    """

    def __init__(self, input_size: int, hidden_size: int, kind: str = "gru"):
        super().__init__()
        self.kind = kind
        self.project = nn.Linear(input_size, hidden_size)
        if kind == "gru":
            self.body = nn.GRU(hidden_size, hidden_size, batch_first=True, bidirectional=True)
            width = 2 * hidden_size
        else:
            heads = 4 if hidden_size % 4 == 0 else 1
            self.body = nn.TransformerEncoderLayer(hidden_size, heads, dim_feedforward=2 * hidden_size, dropout=0.0,
                                                   batch_first=True)
            width = hidden_size
        self.head = nn.Linear(width, 1)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Returns the logits `(N,)` of hidden states `(N, T, d)` whose valid positions are `mask` `(N, T)`."""
        x = torch.tanh(self.project(hidden.float()))
        if self.kind == "gru":
            # Packed, so that the backward direction starts at each sequence's last valid position, not at padding.
            lengths = mask.sum(dim=1).clamp(min=1).cpu()
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            x, _ = self.body(packed)
            x, _ = nn.utils.rnn.pad_packed_sequence(x, batch_first=True, total_length=mask.shape[1])
        else:
            x = self.body(x, src_key_padding_mask=~mask)
        return self.head(losses.masked_mean(x, mask.unsqueeze(-1), dim=1)).squeeze(-1)


def decoder_width(model) -> int:
    """Returns the width of the decoder's hidden states of an encoder-decoder model."""
    config = model.config.get_text_config(decoder=True)
    for name in ("d_model", "hidden_size", "n_embd"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise ValueError(f"Cannot tell the hidden size of {type(model).__name__}'s decoder from its config.")


class ProfessorForcingTrainer(SeqRLBaseTrainer):
    """Professor forcing (Lamb et al., 2016): cross-entropy + `adversarial_weight` × the loss that makes the
    decoder's free-running hidden states indistinguishable from its teacher-forced ones, for a discriminator trained
    alongside with its own optimizer (saved with every checkpoint). No reward, no baseline.

    Same constructor as `Seq2SeqTrainer`; `args` is a `ProfessorForcingConfig`. Logs `pf/d_loss`, `pf/d_accuracy`,
    `pf/adv_loss` and `pf/xe_loss`.
    """

    config_class = ProfessorForcingConfig
    algorithm_id = "professor_forcing"
    method = Method("Professor forcing", "professor-forcing", "cross-entropy plus an adversarial loss that makes the "
                    "decoder's free-running hidden states look teacher-forced to a discriminator", (LAMB_2016,))

    def __init__(self, model=None, args: ProfessorForcingConfig | None = None, **kwargs):
        forward = inspect.signature(getattr(model, "forward", lambda: None)).parameters
        takes_any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in forward.values())
        if model is not None and "output_hidden_states" not in forward and not takes_any_keyword:
            raise ValueError(
                f"model: {type(model).__name__}.forward takes no `output_hidden_states`, which professor forcing "
                "needs (the discriminator reads the decoder's hidden states).")
        super().__init__(model=model, args=args, **kwargs)
        unwrapped = self.accelerator.unwrap_model(self.model)
        # Seeded apart from the global RNG, so that every process (and a resumed run) builds the same discriminator.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.args.seed)
            self.discriminator = HiddenStateDiscriminator(decoder_width(unwrapped), self.args.discriminator_hidden_size,
                                                          self.args.discriminator).to(self.args.device)
        self.discriminator_optimizer = torch.optim.Adam(self.discriminator.parameters(),
                                                        lr=self.args.discriminator_learning_rate)
        self._own_output_config = None

    def own_output_config(self, model):
        """Returns the generation config of the model's own outputs (greedy or sampled, `args.sampling`)."""
        if self._own_output_config is None:
            config = self.family.generation_config(model, self.args.max_new_tokens,
                                                   max_length=self.args.generation_max_length)
            if self.args.sampling == "argmax":
                config.do_sample, config.top_k, config.top_p, config.temperature = False, None, None, None
            self._own_output_config = config
        return self._own_output_config

    def sequence_loss(self, model, inputs, text, num_items_in_batch):
        self.loss_is_scaled_for_ga = False  # a per-batch mean: the Trainer divides by the accumulation steps
        labels = self.family.target_labels(inputs)
        unwrapped = self.accelerator.unwrap_model(model)
        own = self.family.sample(unwrapped, inputs, self.own_output_config(unwrapped))
        # The mask, not the pad id, says where an output ends: an untrained model may well write pad tokens.
        own_labels = own.sample_ids.masked_fill(~own.sample_mask, -100)
        length = max(labels.shape[1], own_labels.shape[1])
        labels, own_labels = right_pad(labels, length, -100), right_pad(own_labels, length, -100)
        targets = torch.stack([labels, own_labels], dim=1).flatten(0, 1)  # (2B, T): gold and own rows of a source
        encoded = self.family.encode(unwrapped, inputs)  # once per source, with grad
        # The gold rows' cross-entropy is reduced inside the forward, from the output layer's inputs.
        outputs, xe_loss = self.teacher_forced_cross_entropy(
            model, lambda: self.family.target_forward(model, encoded, targets, group=2, output_hidden_states=True),
            labels, rows=slice(0, None, 2))
        if getattr(outputs, "hidden_states", None) is None:
            raise ValueError(f"model: {type(unwrapped).__name__} returned no decoder hidden states with "
                             "output_hidden_states=True; professor forcing needs them.")
        hidden = outputs.hidden_states
        gold_hidden, own_hidden = hidden[0::2], hidden[1::2]
        gold_mask, own_mask = labels != -100, own_labels != -100
        d_loss, d_accuracy = self.discriminator_step(gold_hidden.detach(), gold_mask, own_hidden.detach(), own_mask)
        self.discriminator.requires_grad_(False)
        try:
            with torch.autocast(device_type=hidden.device.type, enabled=False):
                adv_loss = adversarial_loss(self.discriminator(own_hidden, own_mask))
        finally:
            self.discriminator.requires_grad_(True)
        self._record("train", {"rl/phase": 1.0, "pf/xe_loss": xe_loss.item(), "pf/adv_loss": adv_loss.item(),
                               "pf/d_loss": d_loss, "pf/d_accuracy": d_accuracy})
        return xe_loss + self.args.adversarial_weight * adv_loss

    def discriminator_step(self, real, real_mask, fake, fake_mask) -> tuple[float, float]:
        """Returns `(loss, accuracy)` of the discriminator on a batch, before the optimizer step it then takes.

        Under DDP the gradients are averaged over processes first, so every process keeps the same discriminator.
        """
        with torch.enable_grad(), torch.autocast(device_type=real.device.type, enabled=False):
            real_logits, fake_logits = self.discriminator(real, real_mask), self.discriminator(fake, fake_mask)
            loss = discriminator_loss(real_logits, fake_logits)
            self.discriminator_optimizer.zero_grad(set_to_none=True)
            loss.backward()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            for parameter in self.discriminator.parameters():
                if parameter.grad is not None:
                    torch.distributed.all_reduce(parameter.grad)
                    parameter.grad /= world
        self.discriminator_optimizer.step()
        correct = torch.cat([real_logits > 0, fake_logits <= 0]).float().mean()
        return loss.item(), correct.item()

    def save_extra_files(self, folder: str) -> None:
        from safetensors.torch import save_file

        state = {k: v.contiguous() for k, v in self.discriminator.state_dict().items()}
        save_file(state, os.path.join(folder, DISCRIMINATOR_FILE))
        torch.save(self.discriminator_optimizer.state_dict(), os.path.join(folder, DISCRIMINATOR_OPTIMIZER_FILE))

    def load_extra_files(self, folder: str) -> None:
        from safetensors.torch import load_file

        path = os.path.join(folder, DISCRIMINATOR_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{folder} has no {DISCRIMINATOR_FILE}: it was not written by "
                                    "ProfessorForcingTrainer, so its discriminator cannot be restored.")
        self.discriminator.load_state_dict(load_file(path, device=str(self.args.device)))
        self.discriminator_optimizer.load_state_dict(
            torch.load(os.path.join(folder, DISCRIMINATOR_OPTIMIZER_FILE), map_location=self.args.device,
                       weights_only=True))
