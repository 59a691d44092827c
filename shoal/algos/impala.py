"""IMPALA (Espeholt et al. 2018): actor-critic learning from the trajectories of slightly stale
policies, corrected with V-trace, on the asynchronous loop.

On the ray backend runners never wait for the learner: each finished rollout, tagged with the
policy version that produced it, joins the learner's bounded queue, and runners pick up newer
weights between rollouts. The local backend runs the same roles synchronously (lag 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from shoal.algos import AlgoSpec, register
from shoal.onpolicy import AsyncConfig, VTraceLearner, make_actor_critic


@dataclass(frozen=True)
class IMPALAConfig(AsyncConfig):
    """IMPALA: V-trace policy gradient, one step per batch of queued rollouts."""

    algo: ClassVar[str] = "impala"

    rollout_steps: int = 50
    """Steps each env takes per rollout (the unroll length)."""
    lr: float = 5e-4
    """Adam learning rate."""
    max_grad_norm: float = 40.0
    """Clip the global gradient norm to this (the paper's 40)."""
    normalize_advantages: bool = False
    """Standardise advantages over each batch."""


class IMPALALearner(VTraceLearner):
    """Policy gradient with V-trace advantages: -E[rho_t A_t log pi(a_t|x_t)]."""

    def policy_loss(self, logp: Tensor, old_logp: Tensor, adv: Tensor) -> Tensor:
        return -(adv * logp).mean()


register(AlgoSpec("impala", IMPALAConfig, IMPALALearner, make_actor_critic, "async",
                  "IMPALA: asynchronous actor-critic with V-trace, discrete, continuous and multi-discrete actions"))
