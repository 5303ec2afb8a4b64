"""The MBR / QE decoding flags that `hf-seqrl evaluate` and `hf-seqrl distill-data` share (docs/mbr.md)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class SelectionArguments:
    """`--decode beam|mbr|qe` and the candidates, utility or QE reward of MBR / QE decoding."""

    decode: str | None = field(default=None, metadata={
        "help": "beam: greedy or beam search (--num_beams); mbr: minimum Bayes risk over each source's --candidates "
                "with --utility; qe: the candidate --qe_reward scores highest (docs/mbr.md). Default: beam "
                "(evaluate: the run's generation_selection when it set one and --num_beams is not given)."})
    candidates: str = field(default="samples", metadata={
        "help": "mbr / qe: the candidates of each source: samples, beam (the beam's n-best, --num_candidates wide) or "
                "samples+beam (the samples, then the n-best)."})
    num_candidates: int = field(default=16, metadata={
        "help": "mbr / qe: candidates per source of each kind --candidates names (samples+beam: twice as many)."})
    utility: str = field(default="chrf", metadata={
        "help": "mbr: the reward each candidate is scored with against the others (a built-in name, a COMET "
                "checkpoint folder or module:function; chrf goes through fastchrf when installed)."})
    qe_reward: str | None = field(default=None, metadata={
        "help": "qe: a reference-free reward (a CometKiwi checkpoint folder or module:function reading predictions "
                "and sources)."})
    epsilon_cutoff: float = field(default=0.02, metadata={
        "help": "mbr / qe: the samples' epsilon sampling, tokens below this probability are never drawn (0: plain "
                "sampling)."})
    seed: int = field(default=0, metadata={"help": "mbr / qe: the seed of the samples' draws."})

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        from ..candidates import CANDIDATE_KINDS, DECODE_MODES

        if self.decode is not None and self.decode not in DECODE_MODES:
            raise ValueError(f"--decode {self.decode}: choose beam, mbr or qe.")
        if self.candidates not in CANDIDATE_KINDS:
            raise ValueError(f"--candidates {self.candidates}: choose samples, beam or samples+beam.")
        if self.decode == "qe" and not self.qe_reward:
            raise ValueError("--decode qe needs --qe_reward: a reference-free reward (a CometKiwi checkpoint folder, "
                             "or module:function reading predictions and sources).")

    def selection(self) -> dict:
        """Returns the MBR / QE keywords of `generate_texts` / `write_teacher_outputs` (none for beam search)."""
        if self.decode in (None, "beam"):
            return {}
        reward = {"utility": self.utility} if self.decode == "mbr" else {"qe_reward": self.qe_reward}
        return {"decode": self.decode, "candidates": self.candidates, "num_candidates": self.num_candidates,
                "epsilon_cutoff": self.epsilon_cutoff, "seed": self.seed, **reward}
