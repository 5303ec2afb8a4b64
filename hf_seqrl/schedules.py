"""Schedules: pure functions of the training step (or epoch) → float. No imports beyond `math`."""

from __future__ import annotations

import math

SCHEDULES = ("linear", "exponential", "inverse_sigmoid", "constant")


def teacher_forcing_ratio(step: float, schedule: str, k: float, min_ratio: float = 0.0) -> float:
    """Returns ε, the probability of feeding the gold token at `step` (Bengio et al., 2015).

    - `"constant"`: ε = min_ratio
    - `"linear"`: ε = max(min_ratio, 1 − step/k)
    - `"exponential"`: ε = min_ratio + (1 − min_ratio)·e^(−step/k)
    - `"inverse_sigmoid"`: ε = max(min_ratio, k / (k + e^(step/k)))   (k ≥ 1)
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}.")
    if schedule == "constant":
        return float(min_ratio)
    if k <= 0:
        raise ValueError(f"schedule_k must be > 0, got {k}.")
    if schedule == "linear":
        return max(min_ratio, 1.0 - step / k)
    if schedule == "exponential":
        return min_ratio + (1.0 - min_ratio) * math.exp(-step / k)
    if schedule == "inverse_sigmoid":
        exponent = step / k
        # e^700 overflows a float: by then the ratio is 0 anyway.
        value = 0.0 if exponent > 700 else k / (k + math.exp(exponent))
        return max(min_ratio, value)
    raise ValueError(f"Unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}.")


def mixer_delta(step: int, delta: int, increment_steps: int) -> int:
    """Returns Δ, the number of final target tokens MIXER samples instead of teacher-forcing, at `step`.

    Δ starts at `delta` and grows by `delta` every `increment_steps` steps (Ranzato et al., 2016):
    Δ = delta · (1 + ⌊step / increment_steps⌋).
    """
    if step < 0 or delta < 1 or increment_steps < 1:
        raise ValueError(f"mixer_delta needs step >= 0, delta >= 1 and increment_steps >= 1, got {step}, {delta}, "
                         f"{increment_steps}.")
    return delta * (1 + step // increment_steps)


def corruption_rate(step: float, max_rate: float, schedule: str, k: float) -> float:
    """Returns σ, the probability of corrupting a decoder input at `step`: `max_rate · (1 − ε(step))`.

    ε is `teacher_forcing_ratio(step, schedule, k, min_ratio=0)`, so σ ramps up from (about) 0 to `max_rate`
    as ε decays from 1 to 0: `"constant"`: σ = max_rate; `"linear"`: σ = max_rate · min(1, step/k);
    `"exponential"`: σ = max_rate · (1 − e^(−step/k));
    `"inverse_sigmoid"`: σ = max_rate · e^(step/k) / (k + e^(step/k)).
    """
    return float(max_rate) * (1.0 - teacher_forcing_ratio(step, schedule, k, 0.0))
