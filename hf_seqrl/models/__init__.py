"""The model-family layer: every trainer, diagnostic and benchmark reaches a model through it.

`base` holds the `ModelFamily` protocol and the decode settings; `scoring` the one scoring pass both families share;
`tokens` the EOS / pad / mask helpers; `decoding` the one rollout decode loop, which a family drives through its `DecodeSteps`;
`seq2seq` and `causal` implement the protocol for encoder-decoder and decoder-only models; `bans` turns a generation
config's bans into one logit mask; `beam` runs beam search through `generate`; `auto.family_for(model)` picks a
family; `tiny` builds small models from configs for tests, the demo and benchmarks. The `Rollout` / `ScoredRollout`
types re-exported here live in `hf_seqrl.types`.
"""

from ..types import Rollout, ScoredRollout
from .auto import FAMILIES, SUPPORTED, family_for, family_for_config, load_pretrained
from .base import ModelFamily
from .causal import CausalFamily
from .seq2seq import Seq2SeqFamily

__all__ = ["FAMILIES", "SUPPORTED", "CausalFamily", "ModelFamily", "Rollout", "ScoredRollout", "Seq2SeqFamily",
           "family_for", "family_for_config", "load_pretrained"]
