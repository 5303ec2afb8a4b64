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

from .builtin import BUILTIN_REWARDS, REWARD_NAMES, bleu_reward, chrf_reward, get_reward, rouge_reward
from .combine import GuardedReward, WeightedReward, build_reward, guard, reference_rewards
from .convention import (RewardError, call_reward, call_reward_parts, call_rewards, combine_parts, is_async_reward,
                         reward_loop, reward_name)
from .guards import length_ratio, length_ratio_reward, repetition_reward, source_copy_reward, target_language_reward
from .metricx import MetricXReward
from .modules import EvaluateReward, load_evaluate_module
from .neural import BERTScoreReward, CometReward, EmbeddingSimilarityReward, ModelReward, RewardModelReward
from .pool import PooledReward
from .token_match import token_match_reward
from .teacher import TeacherLikelihoodReward

# What users call: the rewards to pass as `reward_funcs`, their builders and combinators, and the calling convention's
# entry points that the docs name. The helpers stay in their modules (`hf_seqrl.rewards.convention`, `.spans`, ...).
__all__ = ["BERTScoreReward", "BUILTIN_REWARDS", "CometModel", "CometReward", "EmbeddingSimilarityReward",
           "EvaluateReward", "GuardedReward", "MetricXReward", "ModelReward", "PooledReward", "REWARD_NAMES",
           "RewardError", "RewardModelReward", "TeacherLikelihoodReward", "WeightedReward", "bleu_reward",
           "build_reward", "call_reward", "call_reward_parts", "call_rewards", "chrf_reward", "combine_parts",
           "get_reward", "guard", "is_async_reward", "length_ratio", "length_ratio_reward", "load_comet",
           "load_evaluate_module", "reference_rewards", "repetition_reward", "reward_loop", "reward_name",
           "rouge_reward", "source_copy_reward", "target_language_reward", "token_match_reward"]


def __getattr__(name):
    # The native COMET model imports torch, which `import hf_seqrl.rewards` does not.
    if name in ("CometModel", "load_comet"):
        from . import comet

        return getattr(comet, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
