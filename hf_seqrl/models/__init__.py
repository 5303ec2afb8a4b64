"""The model-family layer: every trainer, diagnostic and benchmark reaches a model through it.

`base` holds the `ModelFamily` protocol, the `Rollout` / `ScoredRollout` types and the EOS / pad / mask helpers;
`seq2seq` and `causal` implement the protocol (rollout decode, scoring pass) for encoder-decoder and decoder-only
models; `auto.family_for(model)` picks one; `tiny` builds small models from configs for tests, the demo and
benchmarks.
"""

from .auto import FAMILIES, SUPPORTED, family_for, family_for_config, load_pretrained
from .base import ModelFamily, Rollout, ScoredRollout
from .causal import CausalFamily
from .seq2seq import Seq2SeqFamily, sample_rollout, score_rollout

__all__ = ["FAMILIES", "SUPPORTED", "CausalFamily", "ModelFamily", "Rollout", "ScoredRollout", "Seq2SeqFamily",
           "family_for", "family_for_config", "load_pretrained", "sample_rollout", "score_rollout"]
