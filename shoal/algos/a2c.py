"""Advantage Actor-Critic (Mnih et al. 2016, synchronous form), discrete, continuous and multi-discrete actions.

Every iteration: runners take a few steps with version v, the learner makes one gradient step on
the whole batch (policy gradient with GAE advantages, value regression, entropy bonus) with
RMSprop as in the paper and stable-baselines3, then publishes v+1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from shoal.algos import AlgoSpec, register
from shoal.config import _check
from shoal.learner import clip_grad_norm, read_metrics
from shoal.onpolicy import OnPolicyConfig, OnPolicyLearner, explained_variance, make_actor_critic
from shoal.runner import Rollout


@dataclass(frozen=True)
class A2CConfig(OnPolicyConfig):
    """A2C: one policy-gradient step per batch of short rollouts."""

    algo: ClassVar[str] = "a2c"

    rollout_steps: int = 5
    """Steps each env takes per update (n_steps)."""
    lr: float = 7e-4
    """Learning rate."""
    gae_lambda: float = 1.0
    """GAE lambda (1.0: the n-step returns of the original A2C)."""
    normalize_advantages: bool = False
    """Standardise advantages over each batch."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """RMSprop (alpha 0.99, eps optimizer_eps 1e-5, as the paper and SB3) or Adam."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.batch_size >= 2 or not self.normalize_advantages,
               "normalize_advantages needs at least 2 samples per batch")


class A2CLearner(OnPolicyLearner):
    """One gradient step on the policy-gradient + value + entropy loss per batch."""

    def __init__(self, config: A2CConfig, obs_space, action_space, store, policy_id: str = "default"):
        super().__init__(config, obs_space, action_space, store, policy_id)
        params = self.policy.parameters()
        if config.optimizer == "rmsprop":
            self.optimizer: torch.optim.Optimizer = torch.optim.RMSprop(params, lr=config.lr, alpha=0.99,
                                                                         eps=config.optimizer_eps)
        else:
            self.optimizer = torch.optim.Adam(params, lr=config.lr, eps=config.optimizer_eps)

    def learn(self, rollouts: list[Rollout]) -> dict[str, float]:
        c, m = self.config, self.policy
        lr = self.scheduled_lr(self.optimizer)
        b = self.gae_batch(rollouts)
        adv = b["adv"]
        if c.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        logp, entropy, value = self.evaluate(b)
        pg = -(adv * logp).mean()
        vl = 0.5 * (value - b["ret"]).pow(2).mean()
        entropy = entropy.mean()
        loss = pg + c.vf_coef * vl - c.ent_coef * entropy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = clip_grad_norm(m.parameters(), c.max_grad_norm)
        self.optimizer.step()
        self.merge_obs_stats(rollouts)
        return read_metrics({"loss/policy": pg, "loss/value": vl, "loss/entropy": entropy, "learner/grad_norm": grad_norm,
                             "learner/lr": lr, "learner/explained_variance": explained_variance(b["values"], b["ret"])})


register(AlgoSpec("a2c", A2CConfig, A2CLearner, make_actor_critic, "sync",
                  "Advantage Actor-Critic (synchronous), discrete, continuous and multi-discrete actions"))
