"""Quantile Regression DQN (Dabney et al. 2018, "Distributional Reinforcement Learning with
Quantile Regression"; sb3-contrib's QRDQN): DQN whose network gives M quantiles of each action's
return at the midpoints tau_i = (2i + 1) / 2M instead of its mean.

The target is the distribution r + discount x Z'(s', a*) of the target network's quantiles at the
best next action a* (by the quantiles' means; with --double, the online network picks it), and the
quantiles learn by the quantile Huber loss against all M of its atoms, summed over the quantiles
(eq. 10; :func:`shoal.offpolicy.quantile_huber_loss`). The agent acts on the means, epsilon-greedily,
as DQN's; every DQN option (double, dueling, n-step, prioritised replay, noisy nets, Ape-X, action
masks, images, --encoder) works the same. With --dueling --n-step 3 --prioritized --noisy it is
Rainbow (Hessel et al. 2018) with quantiles in place of C51's categories.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from shoal.algos import AlgoSpec, register
from shoal.algos import dqn
from shoal.algos.dqn import DQNConfig, DQNLearner, QNetwork
from shoal.config import _check
from shoal.offpolicy import quantile_huber_loss
from shoal.replay import Transitions


@dataclass(frozen=True)
class QRDQNConfig(DQNConfig):
    """QR-DQN: DQN with a quantile distribution of returns per action."""

    algo: ClassVar[str] = "qrdqn"

    n_quantiles: int = 200
    """Quantiles of each action's return (M; sb3-contrib's and the paper's 200)."""
    double: bool = False
    """Double Q-learning on the quantiles' means (off, as the paper and sb3-contrib's QRDQN)."""
    optimizer_eps: float = 0.01 / 32
    """Adam's epsilon: the paper's 0.01 / 32, for its batches of 32 (sb3-contrib's QRDQN takes
    0.01 / batch_size, which the presets give)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.n_quantiles >= 2, "n_quantiles must be at least 2 (1 is dqn)")
        _check(self.num_atoms == 1, "qrdqn learns quantiles: --num-atoms is dqn's categorical distribution (C51)")


def make_policy(config: QRDQNConfig, obs_space, action_space) -> QNetwork:
    """DQN's network with M quantiles per action."""
    return dqn.make_policy(config, obs_space, action_space, quantiles=config.n_quantiles)


class QRDQNLearner(DQNLearner):
    """DQN's learner with the quantile Huber loss against the target network's quantiles."""

    def td_update(self, b: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        c, m = self.config, self.policy
        n = len(b.rewards)
        z = m.quantiles(b.obs)[torch.arange(n), b.actions]  # [N, M]
        with torch.no_grad():
            legal = m.legal(b.next_obs)
            next_z = self.target.quantiles(b.next_obs)  # [N, actions, M]
            picker = m.legal_q(b.next_obs, legal=legal) if c.double else m.legal_q(b.next_obs, next_z.mean(-1), legal)
            best = next_z[torch.arange(n), picker.argmax(-1)]  # [N, M]
            target = b.rewards[:, None] + b.discounts[:, None] * best
        loss = (b.weights * quantile_huber_loss(z, target).sum(-1)).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.clip_and_step()
        self.update_target()
        q = z.detach().mean(-1)
        return {"loss/q": loss.detach(), "learner/q_mean": q.mean(), "learner/epsilon": m.epsilon.clone()}, (
            (q - target.mean(-1)).abs() if c.prioritized else None)


register(AlgoSpec("qrdqn", QRDQNConfig, QRDQNLearner, make_policy, "sync",
                  "Quantile Regression DQN: a distribution of returns per action (discrete actions)"))
