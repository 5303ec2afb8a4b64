"""The tokens a model's generation config bans (`bad_words_ids` of one token, `suppress_tokens`,
`begin_suppress_tokens`), as the logit mask that both decode loops and the scoring pass apply alike: rollouts sample
from, and score under, the same distribution, the one `generate` samples from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig


# The generation settings that ban tokens and that rollouts honour as a logit mask (`TokenBans`).
BAN_SETTINGS = ("bad_words_ids", "suppress_tokens", "begin_suppress_tokens")


@dataclass(frozen=True)
class TokenBans:
    """The tokens a generation config bans, as a logit mask that the decode and the scoring pass apply alike.

    `ids`: banned at every position (the single-token `bad_words_ids`, EOS excepted as `generate` does, and
    `suppress_tokens`); `begin_ids`: banned at target position `begin` only (`begin_suppress_tokens`; `begin` is 1
    when a forced BOS token takes position 0, as in `generate`). Ids outside the vocabulary are ignored.
    """

    ids: tuple[int, ...] = ()
    begin_ids: tuple[int, ...] = ()
    begin: int = 0

    @classmethod
    def from_generation_config(cls, config: GenerationConfig) -> "TokenBans":
        """Returns the bans of `config`; raises on a `bad_words_ids` entry of several tokens (a ban that depends on
        the tokens before it is no fixed mask)."""
        eos = config.eos_token_id
        eos = set() if eos is None else set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}
        ids = []
        for entry in config.bad_words_ids or ():
            entry = list(entry)
            if len(entry) != 1:
                raise ValueError(
                    f"generation_config.bad_words_ids holds the entry {entry!r}: rollouts honour bans as a logit mask "
                    "that the scoring pass applies too, which only single-token entries can be. Set "
                    "model.generation_config.bad_words_ids to single-token lists (e.g. [[id] for id in entry] to ban "
                    "each of its tokens everywhere), or drop the entry.")
            if int(entry[0]) not in eos:
                ids.append(int(entry[0]))
        ids += [int(i) for i in config.suppress_tokens or ()]
        begin = 1 if getattr(config, "forced_bos_token_id", None) is not None else 0
        return cls(tuple(sorted(set(ids))), tuple(sorted({int(i) for i in config.begin_suppress_tokens or ()})),
                   begin)

    def after_prefix(self, length: int) -> "TokenBans":
        """Returns the bans counted from the end of a forced prefix of `length` target tokens (the begin bans fall
        inside a prefix that covers their position)."""
        return TokenBans(self.ids, self.begin_ids, self.begin - length)

    def ids_at(self, position: int | None, vocab: int) -> list[int]:
        """Returns the ids banned at target `position` (None: those banned at every position) within `vocab`."""
        ids = self.ids + (self.begin_ids if position == self.begin else ())
        return sorted({i for i in ids if 0 <= i < vocab})

    def mask(self, length: int, vocab: int, device) -> torch.Tensor | None:
        """Returns the banned entries of target positions `0 .. length-1`: a bool `(V,)` when they do not depend on
        the position, `(length, V)` when a begin ban falls among them, None when nothing is banned."""
        with_begin = bool(self.begin_ids) and 0 <= self.begin < length
        everywhere = self.ids_at(None, vocab)
        if not everywhere and not with_begin:
            return None
        mask = torch.zeros(vocab, dtype=torch.bool, device=device)
        mask[everywhere] = True
        if not with_begin:
            return mask
        mask = mask.repeat(length, 1)
        mask[self.begin, self.ids_at(self.begin, vocab)] = True
        return mask


def token_ban_settings(config: GenerationConfig) -> dict:
    """Returns the `BAN_SETTINGS` of a model's generation config that rollout configs keep; raises on what cannot be
    a logit mask (see `TokenBans.from_generation_config`)."""
    TokenBans.from_generation_config(config)
    return {name: getattr(config, name, None) for name in BAN_SETTINGS}
