"""Professor forcing's two binary cross-entropies over a discriminator's logits (Lamb et al., 2016): the
discriminator's, teacher-forced rows against free-running ones, and the generator's, which asks the free-running rows
to pass for teacher-forced. Torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def discriminator_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    """Returns the discriminator's binary cross-entropy: real (teacher-forced) rows labelled 1, fake (free-running)
    rows labelled 0, averaged over all rows.

    Args:
        real_logits (`torch.Tensor` of shape `(B,)`), fake_logits (`torch.Tensor` of shape `(B',)`): one logit per
            hidden-state sequence.
    """
    logits = torch.cat([real_logits, fake_logits]).float()
    targets = torch.cat([torch.ones_like(real_logits), torch.zeros_like(fake_logits)]).float()
    return F.binary_cross_entropy_with_logits(logits, targets)


def adversarial_loss(fake_logits: torch.Tensor) -> torch.Tensor:
    """Returns the generator's loss of professor forcing: the binary cross-entropy of the free-running rows labelled
    as teacher-forced, `mean(softplus(-logit))`, which is low when the discriminator takes them for real.

    Args:
        fake_logits (`torch.Tensor` of shape `(B,)`): the discriminator's logit of each free-running sequence.
    """
    return F.softplus(-fake_logits.float()).mean()
