"""Sentence-level rewards, and how the trainers call them.

The layers, each importing only those before it: `guards` (`length_ratio`, `repetition`, `source_copy`,
`target_language`), `spans` (token-level values, `TokenScore`) and `token_match` < `builtin` (BLEU, chrF, ROUGE,
`get_reward`) < `convention` (the calling convention, `call_reward`, async rewards and the checks) < `modules`
(`evaluate` modules, `EvaluateReward`) < `combine` (`build_reward`, `WeightedReward`, `GuardedReward`) < `pool`
(`PooledReward`, worker processes). `neural` (model rewards: embeddings, BERTScore, reward models, COMET) sits beside
`modules`, below `combine`, and `metricx` (`MetricXReward`) and `teacher` (`TeacherLikelihoodReward`) on `neural`;
`comet` (the native COMET model that `CometReward` runs: `CometModel`, `load_comet`) imports no other module of the
package and is loaded when first used (it imports torch).

A reward is a callable called with keywords, one value per prediction:

    f(predictions: list[str], references: list[list[str]], sources: list[str] | None, **columns) -> list[float]
"""

from .builtin import (BUILTIN_REWARDS, GUARD_REWARDS, REWARD_NAMES, SACREBLEU_INTERNALS, RewardFn, bleu_reward,
                      chrf_reward, get_reward, rouge_reward)
from .combine import (GuardedReward, WeightedReward, as_reward, build_reward, guard, model_rewards, place_on,
                      reference_rewards, unique_names)
from .convention import (CombinedReward, RewardError, call_reward, call_reward_parts, call_rewards, check_finite,
                         check_reward_spec, combine_parts, is_async_reward, is_evaluation_module, is_number,
                         part_weights, reward_loop, reward_name)
from .guards import (length_ratio, length_ratio_reward, repetition_rate, repetition_reward, source_copy_reward,
                     target_language_reward)
from .metricx import MetricXReward
from .modules import EvaluateReward, accepts_reference_lists, load_evaluate_module
from .neural import (BERTScoreReward, CometReward, EmbeddingSimilarityReward, ModelReward, RewardModelReward,
                     model_reward)
from .pool import PooledReward
from .spans import TokenScore, token_char_spans, span_token_values
from .token_match import aligned_words, token_match_reward
from .teacher import TeacherLikelihoodReward

__all__ = ["BUILTIN_REWARDS", "CombinedReward", "RewardError", "SACREBLEU_INTERNALS", "BERTScoreReward", "CometReward",
           "EmbeddingSimilarityReward",
           "EvaluateReward", "ModelReward", "PooledReward", "RewardFn", "RewardModelReward", "WeightedReward",
           "accepts_reference_lists", "as_reward", "bleu_reward", "build_reward", "call_reward", "call_reward_parts",
           "check_finite", "check_reward_spec", "chrf_reward", "combine_parts", "get_reward", "is_evaluation_module",
           "is_number", "model_reward", "model_rewards", "place_on", "reward_name", "rouge_reward", "unique_names",
           "GUARD_REWARDS", "REWARD_NAMES", "MetricXReward", "call_rewards", "is_async_reward", "length_ratio",
           "length_ratio_reward", "load_evaluate_module", "part_weights", "reward_loop", "CometModel", "load_comet",
           "TeacherLikelihoodReward", "GuardedReward", "guard", "repetition_rate", "repetition_reward",
           "source_copy_reward", "target_language_reward", "TokenScore", "token_char_spans", "span_token_values",
           "aligned_words", "token_match_reward", "reference_rewards"]


def __getattr__(name):
    # The native COMET model imports torch, which `import hf_seqrl.rewards` does not.
    if name in ("CometModel", "load_comet"):
        from . import comet

        return getattr(comet, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
