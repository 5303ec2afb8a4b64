"""MBR and QE decoding: each source's candidates decoded by the model (`source_candidates`: samples, the beam's n-best
or both), then one picked per source by `hf_seqrl.selection` (`selected_texts`).
`hf_seqrl.evaluation.generate_texts(..., decode="mbr" | "qe")` and `hf-seqrl evaluate --decode mbr|qe` run it.

`candidates` says which (`CANDIDATE_KINDS`):
- `"samples"`: `num_candidates` samples per source from `generate` (`do_sample=True`, `num_return_sequences`):
  temperature 1 with no top-k or top-p cut, and epsilon sampling when `epsilon_cutoff` is set (transformers'
  `epsilon_cutoff`: tokens below that probability are never drawn; 0.02 by default, as Freitag et al., 2023 found
  best for MBR). The draws are seeded (`seed`), so a call gives the same candidates each time on the same machine.
- `"beam"`: the beam's n-best, `generate(num_beams=num_candidates, num_return_sequences=num_candidates)` with the
  model's own generation config otherwise (length penalty, ...): deterministic, no seed or epsilon.
- `"samples+beam"`: the `num_candidates` samples followed by the beam's `num_candidates`-best (`2 * num_candidates`
  candidates per source).

The candidates are a multiset: a text decoded twice (two samples alike, or a sample the beam also found) is two
candidates, so under MBR it counts twice as support for what agrees with it, as in sampling-based MBR's Monte Carlo
estimate of the expected utility.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from .data import tokenize_sources
from .models import family_for
from .models.base import eval_mode
from .models.languages import decode_texts
from .rewards import build_reward, reward_name
from .rewards.combine import place_on
from .selection import mbr_select, qe_select

DECODE_MODES = ("beam", "mbr", "qe")
CANDIDATE_KINDS = ("samples", "beam", "samples+beam")


@dataclass(frozen=True)
class SelectionDecoding:
    """How `selected_texts` decodes: `decode` (`"mbr"` or `"qe"`), `num_candidates` per source of each kind that
    `candidates` names (`"samples"`, the `"beam"`'s n-best, or `"samples+beam"`: both), the samples' `epsilon_cutoff`
    (None or 0: plain ancestral sampling) and `seed`; MBR's `utility` (a reference-based reward, default chrF) or QE's
    `qe_reward` (a reference-free reward, required for QE)."""

    decode: str = "mbr"
    num_candidates: int = 16
    utility: Any = "chrf"
    qe_reward: Any = None
    epsilon_cutoff: float | None = 0.02
    seed: int = 0
    candidates: str = "samples"

    def __post_init__(self):
        if self.candidates not in CANDIDATE_KINDS:
            raise ValueError(f"candidates={self.candidates!r}: choose 'samples', 'beam' (the beam's n-best) or "
                             "'samples+beam'.")
        if self.decode not in ("mbr", "qe"):
            raise ValueError(f"decode={self.decode!r}: candidates are selected by 'mbr' or 'qe' (or decode='beam' "
                             "for greedy / beam search).")
        if self.num_candidates < 1 or (self.decode == "mbr" and self.num_candidates < 2):
            raise ValueError(f"num_candidates must be >= 2 for MBR (>= 1 for QE), got {self.num_candidates}.")
        if self.epsilon_cutoff is not None and not 0 <= self.epsilon_cutoff < 1:
            raise ValueError(f"epsilon_cutoff must be in [0, 1) (or None), got {self.epsilon_cutoff}.")
        if self.decode == "qe" and self.qe_reward is None:
            raise ValueError("decode='qe' needs qe_reward: a reference-free reward (a CometKiwi or MetricX-QE "
                             "checkpoint name, a TeacherLikelihoodReward, or a callable reading predictions and "
                             "sources).")

    def record(self) -> dict[str, Any]:
        """Returns the settings as JSON data (a reward by its name; the samples' epsilon and seed None when the
        candidates are the beam's alone), as evaluation outputs record them."""
        settings = asdict(self)
        settings["utility"] = reward_name(self.utility) if self.decode == "mbr" else None
        settings["qe_reward"] = reward_name(self.qe_reward) if self.decode == "qe" else None
        if self.candidates == "beam":
            settings["epsilon_cutoff"] = settings["seed"] = None
        return settings

    def describe(self) -> str:
        """Returns the decoding in words, e.g. `"mbr, 16 candidates, chrf"` or `"mbr, 8 samples + 8-best beam, chrf"`."""
        n = self.num_candidates
        kinds = {"samples": f"{n} candidates", "beam": f"{n}-best beam", "samples+beam": f"{n} samples + {n}-best beam"}
        reward = self.utility if self.decode == "mbr" else self.qe_reward
        return f"{self.decode}, {kinds[self.candidates]}, {reward_name(reward)}"


def sample_candidates(model, tokenizer, sources: Sequence, num_candidates: int, *, epsilon_cutoff: float | None = 0.02,
                      seed: int = 0, batch_size: int = 32, max_new_tokens: int | None = None,
                      max_length: int | None = None, max_source_length: int | None = None, progress: bool = True,
                      desc: str = "candidates") -> list[list[str]]:
    """Returns `num_candidates` sampled outputs per source, in the order of `sources` (decoded text, stripped).

    `batch_size` sources per `generate` call, in the order given, each with `num_candidates` rows; `max_new_tokens`,
    `max_length` and `max_source_length` as in `generate_texts`. The random state is seeded with `seed` inside and
    restored after. The model is left in its original train/eval mode."""
    with seeded(model, seed):
        return _decoded_groups(model, tokenizer, sources, num_candidates, sample_kwargs(num_candidates, epsilon_cutoff),
                               batch_size, max_new_tokens, max_length, max_source_length, progress, desc)


def sample_kwargs(num_candidates: int, epsilon_cutoff: float | None) -> dict[str, Any]:
    """Returns the `generate` arguments of `num_candidates` samples per source: temperature 1, no top-k or top-p cut,
    epsilon sampling when `epsilon_cutoff` is set."""
    kwargs = {"do_sample": True, "num_return_sequences": num_candidates, "num_beams": 1, "temperature": 1.0,
              "top_k": 0, "top_p": 1.0}
    if epsilon_cutoff:
        kwargs["epsilon_cutoff"] = epsilon_cutoff
    return kwargs


def beam_kwargs(nbest: int) -> dict[str, Any]:
    """Returns the `generate` arguments of the beam's `nbest` best outputs per source."""
    return {"do_sample": False, "num_beams": nbest, "num_return_sequences": nbest}


@contextmanager
def seeded(model, seed: int):
    """Within the context, the random state (the model's CUDA device's too) is seeded with `seed`; it is restored
    after."""
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def beam_candidates(model, tokenizer, sources: Sequence, nbest: int, *, batch_size: int = 32,
                    max_new_tokens: int | None = None, max_length: int | None = None,
                    max_source_length: int | None = None, progress: bool = True,
                    desc: str = "candidates") -> list[list[str]]:
    """Returns the beam's `nbest` best outputs per source, best first, in the order of `sources` (decoded text,
    stripped): `generate(num_beams=nbest, num_return_sequences=nbest)`, the model's generation config otherwise.
    Arguments as in `sample_candidates`."""
    return _decoded_groups(model, tokenizer, sources, nbest, beam_kwargs(nbest), batch_size, max_new_tokens, max_length,
                           max_source_length, progress, desc)


def _decoded_groups(model, tokenizer, sources, group, kwargs, batch_size, max_new_tokens, max_length,
                    max_source_length, progress, desc) -> list[list[str]]:
    """Returns `generate(**kwargs)`'s `group` outputs per source, `batch_size` sources per call, in eval mode."""
    from tqdm.auto import tqdm

    family = family_for(model)
    kwargs = {**kwargs, "use_cache": True}
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    elif max_length is not None:
        kwargs["max_length"] = max_length
    candidates: list[list[str]] = []
    with eval_mode(model), torch.no_grad():
        for start in tqdm(range(0, len(sources), batch_size), desc=desc, leave=False, disable=not progress):
            batch = tokenize_sources(family, tokenizer, list(sources[start:start + batch_size]), max_source_length)
            ids = family.generate(model, {k: v.to(model.device) for k, v in batch.items()}, **kwargs)
            texts = [text.strip() for text in decode_texts(tokenizer, ids)]
            candidates.extend(texts[i:i + group] for i in range(0, len(texts), group))
    return candidates


def source_candidates(model, tokenizer, sources: Sequence, decoding: SelectionDecoding, **kwargs) -> list[list[str]]:
    """Returns each source's candidates as `decoding.candidates` says: its samples (`sample_candidates`), the beam's
    n-best (`beam_candidates`), or the samples followed by the n-best. `kwargs` as in `beam_candidates`."""
    n = decoding.num_candidates
    samples = beam = [[] for _ in sources]
    if decoding.candidates != "beam":
        samples = sample_candidates(model, tokenizer, sources, n, epsilon_cutoff=decoding.epsilon_cutoff,
                                    seed=decoding.seed, **kwargs)
    if decoding.candidates != "samples":
        beam = beam_candidates(model, tokenizer, sources, n, **kwargs)
    return [s + b for s, b in zip(samples, beam)]


def source_text(source) -> str:
    """Returns a source as the selection's rewards read it: the text, or a chat prompt's last message."""
    return source if isinstance(source, str) else str(source[-1]["content"])


def select(candidates: Sequence[Sequence[str]], sources: Sequence, decoding: SelectionDecoding) -> list[str]:
    """Returns the candidate `decoding` picks for each source (`mbr_select` or `qe_select`); a source whose
    candidates the QE reward scores none of is refused, naming it."""
    return [group[i] for group, i in zip(candidates, select_indices(candidates, sources, decoding))]


def select_indices(candidates: Sequence[Sequence[str]], sources: Sequence | None,
                   decoding: SelectionDecoding) -> list[int]:
    """Returns the index of the candidate `decoding` picks for each source (`select`); `sources` may be None for an
    MBR utility that does not read them."""
    texts = None if sources is None else [source_text(s) for s in sources]
    if decoding.decode == "mbr":
        return [pick.index for pick in mbr_select(candidates, decoding.utility, texts)]
    picks = qe_select(candidates, texts, decoding.qe_reward)
    unscored = [i for i, pick in enumerate(picks) if pick.index is None]
    if unscored:
        first = texts[unscored[0]] if texts else unscored[0]
        raise ValueError(f"qe_reward {reward_name(decoding.qe_reward)!r} scored none of the candidates of "
                         f"{len(unscored)} sources (first: {first!r}): use a reward that scores them.")
    return [pick.index for pick in picks]


def selected_ids(model, tokenizer, batch: dict, sources: Sequence | None, decoding: SelectionDecoding,
                 **generate_kwargs) -> torch.Tensor:
    """Returns the ids `(B, T)` of each source's pick among its candidates, from a tokenized batch of `B` sources
    (the model family's `generate` inputs; a trainer's evaluation batch): the candidates `decoding` names, drawn from
    the random state as it is (seed it with `seeded`), decoded to text and picked by `select_indices`. The rows are
    what the family's `generate` returns (padded with the tokenizer's pad id to the longest candidate).
    `generate_kwargs`: `max_length`, `max_new_tokens`, `synced_gpus`."""
    family, n = family_for(model), decoding.num_candidates
    kwargs = {**{k: v for k, v in generate_kwargs.items() if v is not None}, "use_cache": True}
    groups = []
    with eval_mode(model), torch.no_grad():
        if decoding.candidates != "beam":
            groups.append(family.generate(model, batch, **sample_kwargs(n, decoding.epsilon_cutoff), **kwargs))
        if decoding.candidates != "samples":
            groups.append(family.generate(model, batch, **beam_kwargs(n), **kwargs))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(ids.shape[1] for ids in groups)
    sources_count = groups[0].shape[0] // n
    rows = torch.cat([torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=pad).view(sources_count, n, width)
                      for ids in groups], dim=1)  # (B, N, T): each source's samples, then its n-best
    texts = [text.strip() for text in decode_texts(tokenizer, rows.flatten(0, 1))]
    per_source = rows.shape[1]
    candidates = [texts[i:i + per_source] for i in range(0, len(texts), per_source)]
    picks = torch.tensor(select_indices(candidates, sources, decoding), device=rows.device)
    return rows[torch.arange(sources_count, device=rows.device), picks]


def with_reward_built(decoding: SelectionDecoding, device) -> SelectionDecoding:
    """Returns `decoding` with its utility (MBR) or QE reward built (`build_reward`: a name or a checkpoint loaded;
    a reward already built stays as it is) and a model reward on the CPU moved to `device` (`place_on`). chrF stays a
    name: `mbr_select` takes fastchrf for it when installed."""
    name = "utility" if decoding.decode == "mbr" else "qe_reward"
    spec = getattr(decoding, name)
    if decoding.decode == "mbr" and spec == "chrf":
        return decoding
    reward = build_reward(spec)
    place_on(reward, device)
    return replace(decoding, **{name: reward})


def selected_texts(model, tokenizer, sources: Sequence, decoding: SelectionDecoding, *, batch_size: int = 32,
                   progress: bool = True, desc: str = "generate", **generate_kwargs) -> list[str]:
    """Returns one output per source: each source's candidates (`source_candidates`, all sources, the samples
    seeded once), then the pick of `decoding` over each source's candidates, `batch_size` sources per
    selection call. A reward given by name is loaded once per call, and a model reward on the CPU moved to the model's
    device (`with_reward_built`). `generate_kwargs`: `max_new_tokens`, `max_length`, `max_source_length`."""
    from tqdm.auto import tqdm

    decoding = with_reward_built(decoding, model.device)
    candidates = source_candidates(model, tokenizer, sources, decoding, batch_size=batch_size, progress=progress,
                                   desc=f"{desc} ({decoding.decode} candidates)", **generate_kwargs)
    outputs: list[str] = []
    for start in tqdm(range(0, len(sources), batch_size), desc=f"{desc} ({decoding.decode} selection)", leave=False,
                      disable=not progress):
        stop = start + batch_size
        outputs.extend(select(candidates[start:stop], sources[start:stop], decoding))
    return outputs
