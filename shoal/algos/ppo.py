"""Proximal Policy Optimization (Schulman et al. 2017), discrete and continuous actions.

Synchronous on-policy loop: runners sample with version v, the learner computes GAE advantages
and optimises the clipped surrogate for a few epochs of minibatches, then publishes v+1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import Tensor

from shoal.algos import AlgoSpec, register
from shoal.config import Config, _check
from shoal.learner import Learner
from shoal.policy import ActorCritic
from shoal.returns import gae, next_values
from shoal.runner import Rollout


@dataclass(frozen=True)
class PPOConfig(Config):
    """PPO: clipped surrogate objective with GAE advantages."""

    algo: ClassVar[str] = "ppo"

    rollout_steps: int = 128
    """Steps each env takes per iteration (n_steps)."""
    num_epochs: int = 10
    """Passes over each batch."""
    minibatch_size: int = 256
    """Samples per gradient step."""
    lr: float = 3e-4
    """Adam learning rate."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """`linear` decays the learning rate to 0 at total_steps."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda: bias/variance trade-off of the advantage."""
    clip: float = 0.2
    """Surrogate clip range epsilon."""
    clip_schedule: Literal["constant", "linear"] = "constant"
    """`linear` decays the clip range to 0 at total_steps."""
    vf_clip: float | None = None
    """Clip value updates to this range around the old values (None: no value clipping)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this."""
    normalize_advantages: bool = True
    """Standardise advantages per minibatch."""
    normalize_obs: bool = False
    """Normalise observations by a running mean/std (kept in the policy and its checkpoints)."""
    reward_scale: float = 1.0
    """Multiply rewards by this before computing returns (keeps value targets near unit scale)."""
    log_std_init: float = 0.0
    """Initial log standard deviation of continuous actions."""
    target_kl: float | None = None
    """Stop an iteration's epochs early when the approximate KL exceeds this."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.rollout_steps >= 1, "rollout_steps must be at least 1")
        _check(self.num_epochs >= 1, "num_epochs must be at least 1")
        _check(1 <= self.minibatch_size <= self.batch_size,
               f"minibatch_size must be between 1 and the batch size "
               f"(rollout_steps x envs = {self.batch_size}), got {self.minibatch_size}")
        _check(self.lr > 0, "lr must be positive")
        _check(0 < self.gamma <= 1, "gamma must be in (0, 1]")
        _check(0 <= self.gae_lambda <= 1, "gae_lambda must be in [0, 1]")
        _check(self.clip > 0, "clip must be positive")
        _check(self.vf_clip is None or self.vf_clip > 0, "vf_clip must be positive or None")
        _check(self.max_grad_norm > 0, "max_grad_norm must be positive")

    @property
    def batch_size(self) -> int:
        """Samples per iteration, across runners."""
        return self.rollout_steps * self.num_envs


def clipped_surrogate(logp: Tensor, old_logp: Tensor, adv: Tensor, clip: float) -> Tensor:
    """PPO's policy loss (eq. 7), to minimise. All inputs [N]."""
    ratio = (logp - old_logp).exp()
    return -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()


def value_loss(value: Tensor, old_value: Tensor, returns: Tensor, clip: float | None) -> Tensor:
    """Squared error to the returns [N], optionally clipped around the old values (as in baselines)."""
    if clip is None:
        return 0.5 * (value - returns).pow(2).mean()
    clipped = old_value + (value - old_value).clamp(-clip, clip)
    return 0.5 * torch.max((value - returns).pow(2), (clipped - returns).pow(2)).mean()


def make_policy(config: PPOConfig, obs_space, action_space) -> ActorCritic:
    """The actor-critic network PPO trains."""
    return ActorCritic(obs_space, action_space, config.hidden_sizes, config.activation,
                       config.normalize_obs, config.log_std_init)


class PPOLearner(Learner):
    """Computes advantages and optimises the clipped surrogate."""

    def __init__(self, config: PPOConfig, obs_space, action_space, store, policy_id: str = "default"):
        super().__init__(config, obs_space, action_space, store, policy_id)
        # fused Adam: ~25% faster per step than the default for small MLPs on CPU.
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr, eps=1e-5, fused=True)

    def extra_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def _batch(self, rollouts: list[Rollout]) -> dict[str, Tensor]:
        """Rollouts side by side [T, sum B], with advantages and returns, flattened to [N]."""
        c, m = self.config, self.policy
        cat = lambda name: torch.as_tensor(np.concatenate([getattr(r, name) for r in rollouts], axis=1))
        obs, actions, old_logp = cat("obs"), cat("actions"), cat("logp")
        rewards = cat("rewards") * c.reward_scale
        terminated, truncated = cat("terminated"), cat("truncated")
        T, B = rewards.shape
        offsets = np.cumsum([0] + [r.rewards.shape[1] for r in rollouts[:-1]])
        final_idx = torch.as_tensor(np.concatenate(
            [r.final_idx + [0, off] for r, off in zip(rollouts, offsets)]).reshape(-1, 2))
        last_obs = torch.as_tensor(np.concatenate([r.last_obs for r in rollouts]))
        final_obs = torch.as_tensor(np.concatenate([r.final_obs for r in rollouts]))
        with torch.no_grad():  # one forward for every value the estimator needs
            v = m.value(torch.cat([obs.reshape(T * B, -1), last_obs, final_obs]))
        values, last_value, final_value = v[: T * B].reshape(T, B), v[T * B: T * B + B], v[T * B + B:]
        nxt = next_values(values, last_value, final_value, final_idx, terminated, truncated)
        adv, ret = gae(rewards, values, nxt, terminated | truncated, c.gamma, c.gae_lambda)
        flat = lambda x: x.reshape(T * B, *x.shape[2:])
        return {"obs": flat(obs), "actions": flat(actions), "logp": flat(old_logp),
                "adv": flat(adv), "ret": flat(ret), "values": flat(values)}

    def learn(self, rollouts: list[Rollout]) -> dict[str, float]:
        c, m = self.config, self.policy
        remaining = max(0.0, 1.0 - self.env_steps / c.total_steps)
        lr = c.lr * (remaining if c.lr_schedule == "linear" else 1.0)
        clip = c.clip * (remaining if c.clip_schedule == "linear" else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = self._batch(rollouts)
        n = len(batch["adv"])
        stats = []  # per minibatch: policy loss, value loss, entropy, approx KL, clip fraction
        for _ in range(c.num_epochs):
            perm = torch.as_tensor(self.rng.permutation(n))
            for start in range(0, n, c.minibatch_size):
                idx = perm[start: start + c.minibatch_size]
                adv = batch["adv"][idx]
                if c.normalize_advantages and len(idx) > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                obs = batch["obs"][idx]
                logp, entropy = m.evaluate_actions(obs, batch["actions"][idx])
                entropy = entropy.mean()
                pg = clipped_surrogate(logp, batch["logp"][idx], adv, clip)
                vl = value_loss(m.value(obs), batch["values"][idx], batch["ret"][idx], c.vf_clip)
                loss = pg + c.vf_coef * vl - c.ent_coef * entropy
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(m.parameters(), c.max_grad_norm)
                self.optimizer.step()
                with torch.no_grad():
                    log_ratio = logp - batch["logp"][idx]
                    ratio = log_ratio.exp()
                    # Low-variance KL estimator (Schulman 2020, "Approximating KL divergence").
                    kl = ((ratio - 1) - log_ratio).mean()
                    stats.append(torch.stack([pg, vl, entropy, kl, ((ratio - 1).abs() > clip).float().mean()]))
            if c.target_kl is not None and float(stats[-1][3]) > c.target_kl:
                break
        pg_mean, vl_mean, ent_mean, kl_mean, clipfrac = torch.stack(stats).mean(0).tolist()
        if m.obs_norm is not None:  # runners' raw-observation statistics, merged in runner order
            for r in rollouts:
                m.obs_norm.update(r.obs_moments)
        var_ret = float(batch["ret"].var())
        explained = 1.0 - float((batch["ret"] - batch["values"]).var()) / var_ret if var_ret > 0 else 0.0
        return {"loss/policy": pg_mean, "loss/value": vl_mean, "loss/entropy": ent_mean,
                "learner/approx_kl": kl_mean, "learner/clip_fraction": clipfrac, "learner/lr": lr,
                "learner/clip": clip, "learner/explained_variance": explained}


register(AlgoSpec("ppo", PPOConfig, PPOLearner, make_policy, "sync",
                  "Proximal Policy Optimization, discrete and continuous actions"))
