"""The objectives `RolloutTrainer` runs, one module per family: `policy_gradient` (SCST, REINFORCE, leave-one-out,
clipped reuse, GSPO), `minimum_risk`, `mixer`, `distillation`, `best_of_n`; `base` holds what they share (the
`Objective` stages, the `Defaults` record, the `StepContext` and the `Runner` services a stage may call).
docs/architecture.md, "Adding an objective", is the recipe for a new one."""

from .base import Defaults, Objective, RolloutPlan, Runner, StepContext, StepLoss
from .best_of_n import BestOfN, BestOfNConfig
from .distillation import Distillation
from .minimum_risk import MinimumRisk
from .mixer import Mixer
from .policy_gradient import PolicyGradient

# Every objective, by the `algorithm_id` of its defaults.
OBJECTIVES = {objective.defaults.algorithm_id: objective
              for objective in (PolicyGradient, MinimumRisk, Mixer, Distillation, BestOfN)}

__all__ = ["OBJECTIVES", "BestOfN", "BestOfNConfig", "Defaults", "Distillation", "MinimumRisk", "Mixer", "Objective",
           "PolicyGradient", "RolloutPlan", "Runner", "StepContext", "StepLoss"]
