"""What logs and cards say of a training method: `Paper` (a cited paper) and `Method` (the algorithm's name, tag,
description, baseline and papers). The lowest layer besides `types`: the standard library only, so that an objective
or a trainer names its papers without importing the card renderer (`hub`)."""

from __future__ import annotations

from dataclasses import dataclass

# What a card says of a method: its name, tag, one-line description, the baseline that ran (policy gradients) and
# the papers it cites. Each objective names its own (`Objective.method`), each other trainer class too
# (`SeqRLBaseTrainer.method`, as TRL's `_name` / `_paper`).


@dataclass(frozen=True)
class Paper:
    """A paper a card cites: `key` (its BibTeX key), `cite` (the in-text form), `title`, `url` (a stable address:
    DOI, arXiv, ACL Anthology, OpenReview) and `citation` (the BibTeX entry shown under "Citation")."""

    key: str
    cite: str
    title: str
    url: str
    citation: str


@dataclass(frozen=True)
class Method:
    """The algorithm a card names: `name`, `tag` (a Hub tag), `description` (loss and baseline), `papers`, and
    `baseline` (the baseline that ran; None without a policy gradient)."""

    name: str
    tag: str
    description: str = ""
    papers: tuple[Paper, ...] = ()
    baseline: str | None = None
