"""The model-family layer: every trainer, diagnostic and benchmark reaches a model through it.

`base` holds the `ModelFamily` protocol and the EOS / pad / mask helpers (the `Rollout` / `ScoredRollout` types it
re-exports live in `hf_seqrl.types`);
`seq2seq` and `causal` implement the protocol (rollout decode, scoring pass) for encoder-decoder and decoder-only
models; `auto.family_for(model)` picks one; `tiny` builds small models from configs for tests, the demo and
benchmarks.
"""

from ..types import Rollout, ScoredRollout
from .auto import FAMILIES, SUPPORTED, family_for, family_for_config, load_pretrained
from .base import ModelFamily
from .causal import CausalFamily
from .seq2seq import Seq2SeqFamily, sample_rollout, score_rollout

__all__ = ["FAMILIES", "SUPPORTED", "CausalFamily", "ModelFamily", "Rollout", "ScoredRollout", "Seq2SeqFamily",
           "family_for", "family_for_config", "load_pretrained", "sample_rollout", "score_rollout"]
