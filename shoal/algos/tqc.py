"""Truncated Quantile Critics (Kuznetsov et al. 2020, "Controlling Overestimation Bias with
Truncated Mixture of Continuous Distributional Quantile Critics"; sb3-contrib's TQC): SAC whose
critics each predict M quantiles of the return distribution of (s, a) instead of its mean.

The target distribution pools the K target critics' quantiles at (s', a' ~ pi), sorts them and
drops the d x K largest (Sec. 3, eq. 7): how many are dropped, not a minimum over critics, is
what controls the overestimation. Each critic learns its quantiles by the quantile Huber loss
against the kept atoms (eq. 8), and the actor maximises the mean of all K x M quantiles minus
alpha log pi (eq. 10). The temperature is tuned as SAC's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import torch
from torch import Tensor

from shoal.algos import AlgoSpec, register
from shoal.algos.sac import SACConfig, SACLearner
from shoal.algos.sac import make_policy as sac_policy
from shoal.config import _check, critic_sizes
from shoal.errors import ShoalError
from shoal.offpolicy import QCritics, quantile_huber_loss
from shoal.policy import PolicyModule
from shoal.replay import Transitions


@dataclass(frozen=True)
class TQCConfig(SACConfig):
    """TQC: SAC with distributional critics whose largest target quantiles are dropped."""

    algo: ClassVar[str] = "tqc"

    n_quantiles: int = 25
    """Quantiles each critic predicts (M)."""
    n_critics: int = 2
    """Critics (K), each with its own target."""
    top_quantiles_to_drop_per_net: int = 2
    """Largest target quantiles dropped per critic (d): the target keeps the K x (M - d) smallest
    of the K x M pooled. More drops, less overestimation (the paper tunes d per env, 0-5 of 25)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.n_quantiles >= 1, "n_quantiles must be at least 1")
        _check(0 <= self.top_quantiles_to_drop_per_net < self.n_quantiles,
               f"top_quantiles_to_drop_per_net must be in [0, n_quantiles) = [0, {self.n_quantiles}): "
               "the target keeps at least one quantile per critic")


def make_policy(config: TQCConfig, obs_space, action_space) -> PolicyModule:
    """SAC's squashed Gaussian actor (images, --encoder and --use-sde as SAC's)."""
    if isinstance(action_space, gym.spaces.Discrete):
        raise ShoalError("tqc needs continuous (Box) actions (as sb3-contrib's); use sac, dqn or ppo for discrete ones")
    return sac_policy(config, obs_space, action_space)


class TQCLearner(SACLearner):
    """SAC's learner with K quantile critics, the truncated pooled target and the quantile Huber loss."""

    config: TQCConfig

    def make_critics(self, config: TQCConfig) -> QCritics:
        """K critics of M quantiles each (an encoder of their own for images or --encoder)."""
        return QCritics(config.n_critics, self.policy.obs_dim, self.policy.action_dim, critic_sizes(config),
                        config.activation, encoder=self.policy.fresh_encoder(), outputs=config.n_quantiles)

    def train_batch(self, b: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        c, n = self.config, len(b.rewards)
        alpha = self.log_alpha.exp().detach()
        kept = c.n_critics * (c.n_quantiles - c.top_quantiles_to_drop_per_net)
        with torch.no_grad():  # the K x (M - d) smallest of the target critics' pooled quantiles (eq. 7)
            next_a, next_logp = self.policy.sample(b.next_obs, self.generator)
            pooled = self.target_critics(b.next_obs, next_a).transpose(0, 1).reshape(n, -1)  # [N, K x M]
            atoms = pooled.sort(-1).values[:, :kept]
            target = b.rewards[:, None] + b.discounts[:, None] * (atoms - alpha * next_logp[:, None])  # [N, kept]
        features = self.critics.encode(b.obs)
        z = self.critics(features, b.actions, encoded=True)  # [K, N, M]
        critic_loss = (b.weights * quantile_huber_loss(z, target).mean((0, 2))).mean()
        a, logp = self.policy.sample(b.obs, self.generator)
        # the mean of every critic's quantiles at (s, a ~ pi): dQ/da, no critic gradients (eq. 10)
        q_pi = self.critics(features.detach(), a, detach_weights=True, encoded=True).mean((0, 2))
        actor_loss = (alpha * logp - q_pi).mean()
        return self._step(critic_loss, actor_loss, -logp.detach(), alpha, z[0].mean(-1) - target.mean(-1))


register(AlgoSpec("tqc", TQCConfig, TQCLearner, make_policy, "sync",
                  "Truncated Quantile Critics: SAC with quantile critics and truncated targets (continuous actions)"))
