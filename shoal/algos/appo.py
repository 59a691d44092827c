"""APPO: PPO's clipped surrogate on the asynchronous loop, with V-trace targets.

V-trace corrects the queued trajectories from their behaviour policies to the learner's policy
at the start of the update (pi_old); the clipped surrogate then bounds how far each update's
epochs move from pi_old, as PPO does. Runners and queue as in IMPALA (``shoal.algos.impala``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from shoal.algos import AlgoSpec, register
from shoal.algos.ppo import clipped_surrogate
from shoal.config import _check
from shoal.onpolicy import AsyncConfig, VTraceLearner, make_actor_critic


@dataclass(frozen=True)
class APPOConfig(AsyncConfig):
    """APPO: clipped surrogate with V-trace advantages, a few epochs per batch."""

    algo: ClassVar[str] = "appo"

    rollout_steps: int = 64
    """Steps each env takes per rollout."""
    num_epochs: int = 4
    """Passes over each batch."""
    minibatch_size: int = 256
    """Samples per gradient step (0: the whole batch)."""
    clip: float = 0.2
    """Surrogate clip range epsilon."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.clip > 0, "clip must be positive")


class APPOLearner(VTraceLearner):
    """min(r A, clip(r, 1 - eps, 1 + eps) A) with r = pi / pi_old and V-trace advantages A."""

    def policy_loss(self, logp: Tensor, old_logp: Tensor, adv: Tensor) -> Tensor:
        return clipped_surrogate(logp, old_logp, adv, self.config.clip)


register(AlgoSpec("appo", APPOConfig, APPOLearner, make_actor_critic, "async",
                  "APPO: asynchronous PPO with V-trace targets, discrete, continuous and multi-discrete actions"))
