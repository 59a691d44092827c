"""Twin Delayed DDPG (Fujimoto et al. 2018): twin critics with the smaller target (clipped double
Q), target policy smoothing, and delayed actor updates. DDPG (``shoal/algos/ddpg.py``) is this
learner with the three additions switched off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from shoal.algos import AlgoSpec, register
from shoal.config import _check, critic_sizes
from shoal.errors import ShoalError
from shoal.learner import load_optimizer
from shoal.offpolicy import (OffPolicyConfig, OffPolicyLearner, QCritics, ScaledActions, observations_normalized,
                             polyak, target_copy)
from shoal.policy import EncoderSpec, mlp
from shoal.replay import Transitions


@dataclass(frozen=True)
class TD3Config(OffPolicyConfig):
    """TD3 for continuous actions."""

    algo: ClassVar[str] = "td3"

    hidden_sizes: tuple[int, ...] = (400, 300)
    """Hidden layer widths of the actor and critics (the paper's 400-300; the critics' are
    critic_hidden_sizes where given)."""
    critic_hidden_sizes: tuple[int, ...] | None = None
    """Hidden layer widths of the critics, where they differ from the actor's (unset: hidden_sizes
    for both; SB3's net_arch=dict(pi=..., qf=...), RLlib's critic_hiddens)."""
    lr: float = 1e-3
    """Adam learning rate of actor and critics (each unless actor_lr or critic_lr gives its own)."""
    action_noise: float = 0.1
    """Std of the exploration noise, in units of half the action range (an Ornstein-Uhlenbeck
    process's sigma)."""
    noise_type: Literal["normal", "ornstein-uhlenbeck"] = "normal"
    """Exploration noise: a Gaussian draw each step, or an Ornstein-Uhlenbeck process per env
    (stable-baselines3's OrnsteinUhlenbeckActionNoise; DDPG's, Lillicrap et al. 2016 Sec. 7):
    correlated from step to step and from 0 at each episode's start, so it keeps pushing one way
    for a while, as MountainCarContinuous needs to reach its hilltop."""
    ou_theta: float = 0.15
    """Ornstein-Uhlenbeck: the pull of the noise back to 0, per unit of time."""
    ou_dt: float = 0.01
    """Ornstein-Uhlenbeck: the time one step takes (with theta 0.15 the noise forgets its past over
    ~1 / (theta dt) = 667 steps; SB3's defaults)."""
    twin_critics: bool = True
    """Learn two critics and bootstrap from the smaller (clipped double Q-learning)."""
    policy_delay: int = 2
    """Critic updates per actor (and target) update."""
    target_noise: float = 0.2
    """Std of the smoothing noise added to target actions (0: none)."""
    target_noise_clip: float = 0.5
    """Clip of the target smoothing noise."""
    actor_lr: float | None = None
    """The actor's Adam learning rate (RLlib's actor_lr, CleanRL's policy_lr; DDPG's paper 1e-4;
    default: lr)."""
    critic_lr: float | None = None
    """The critics' Adam learning rate (RLlib's critic_lr, CleanRL's q_lr; DDPG's paper 1e-3;
    default: lr)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.action_noise >= 0 and self.target_noise >= 0 and self.target_noise_clip >= 0,
               "noise settings must be 0 or more")
        _check(self.policy_delay >= 1, "policy_delay must be at least 1")
        _check(self.ou_theta > 0 and self.ou_dt > 0 and self.ou_theta * self.ou_dt < 1,
               "ou_theta and ou_dt must be positive, their product under 1")
        _check(self.noise_type == "normal" or self.inference == "local",
               "--noise-type ornstein-uhlenbeck keeps a noise process per env in each runner's policy: it cannot "
               "be combined with --inference central, whose servers act for every runner's envs")


class DeterministicActor(ScaledActions):
    """a = tanh(MLP(s)) in [-1, 1]; explores with noise of std ``noise_std`` (a buffer): a Gaussian
    draw per step, or with ``ou`` = (theta, dt) an Ornstein-Uhlenbeck process per env, held on the
    acting path as a recurrent policy's memory is (from 0 for each episode, not saved)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hidden_sizes: tuple[int, ...],
                 activation: str, noise_std: float, ou: tuple[float, float] | None = None,
                 encoder: EncoderSpec | None = None):
        super().__init__(obs_space, action_space, encoder)
        act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
        self.net = mlp([self.feature_dim, *hidden_sizes, self.action_dim], act, out_gain=1.0)
        self.register_buffer("noise_std", torch.tensor(float(noise_std)))
        self.ou = ou
        self.noise: Tensor | None = None  # the Ornstein-Uhlenbeck state [N, act_dim] of the envs acted in

    def reset_memory(self, n: int) -> None:
        if self.ou is not None:
            self.noise = torch.zeros(n, self.action_dim)

    def forget(self, done: np.ndarray) -> None:
        if self.noise is not None and done.any():
            self.noise[torch.as_tensor(done)] = 0.0

    def _noise(self, shape: torch.Size, generator: torch.Generator | None, held: bool = True) -> Tensor:
        """This step's exploration noise [N, act_dim]; ``held``: the runner's Ornstein-Uhlenbeck
        process steps (else independent draws of its sigma)."""
        draw = torch.randn(shape, generator=generator, device=self.noise_std.device)
        if self.ou is None or not held:
            return draw * self.noise_std
        theta, dt = self.ou
        if self.noise is None or self.noise.shape != shape:  # another number of envs: their processes start
            self.noise = torch.zeros(shape)
        # Euler-Maruyama step of dx = -theta x dt + sigma dW
        self.noise = self.noise - theta * dt * self.noise + self.noise_std * math.sqrt(dt) * draw
        return self.noise

    def forward(self, x: Tensor) -> Tensor:  # [N, act_dim]
        return torch.tanh(self.net(self.encoder(x)))

    def apply_ladder(self, index: int, count: int) -> None:
        """Ape-X: runner noise spread geometrically from half to twice the configured std."""
        base = float(self.noise_std)
        self.noise_std.fill_(base * 4 ** (index / max(1, count - 1) - 0.5))

    def explore(self, x: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        if self.random_actions:
            return self.uniform(x.shape[0], generator), x.new_zeros(x.shape[0])
        a = self(x)
        return (a + self._noise(a.shape, generator)).clamp(-1, 1), x.new_zeros(x.shape[0])

    def act(self, x: Tensor, deterministic: bool, generator: torch.Generator | None = None) -> Tensor:
        if deterministic:
            return self(x)
        if self.ou is None or self.random_actions:
            return self.explore(x, generator)[0]
        # Sampled actions of a deployed or served policy: it holds no noise process per caller (the
        # policy server batches many callers' rows), so independent draws of the process's sigma.
        a = self(x)
        return (a + self._noise(a.shape, generator, held=False)).clamp(-1, 1)


def make_policy(config: TD3Config, obs_space, action_space) -> DeterministicActor:
    """The deterministic actor TD3 and DDPG train."""
    if isinstance(action_space, gym.spaces.Discrete):
        raise ShoalError(f"{config.algo} needs continuous (Box) actions; use dqn, sac or ppo for discrete ones")
    ou = (config.ou_theta, config.ou_dt) if config.noise_type == "ornstein-uhlenbeck" else None
    return observations_normalized(config, DeterministicActor(
        obs_space, action_space, config.hidden_sizes, config.activation, config.action_noise, ou,
        EncoderSpec.of(config)))


class TD3Learner(OffPolicyLearner):
    """Critic regression to clipped double-Q targets every update; actor and targets every policy_delay."""

    def __init__(self, config: TD3Config, obs_space, action_space, store, policy_id: str = "default",
                 replay_shards: list[Any] | None = None):
        super().__init__(config, obs_space, action_space, store, policy_id, replay_shards)
        dims = (self.policy.obs_dim, self.policy.action_dim, critic_sizes(config), config.activation)
        self.critics = QCritics(2 if config.twin_critics else 1, *dims,
                                encoder=self.policy.fresh_encoder()).to(self.device)
        self.target_critics = target_copy(self.critics)
        self.target_actor = target_copy(self.policy)
        self.actor_optimizer = self.adam({"actor_lr": self.policy.parameters()})
        self.critic_optimizer = self.adam({"critic_lr": self.critics.parameters()})
        self.last_actor_loss = torch.tensor(0.0, device=self.device)  # reported between delayed actor updates

    def train_batch(self, b: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        c = self.config
        with torch.no_grad():
            next_a = self.target_actor(b.next_obs)
            if c.target_noise > 0:  # target policy smoothing (Sec. 5.3)
                noise = (torch.randn(next_a.shape, generator=self.generator, device=self.device) * c.target_noise).clamp(-c.target_noise_clip, c.target_noise_clip)
                next_a = (next_a + noise).clamp(-1, 1)
            next_q = self.target_critics(b.next_obs, next_a).min(0).values
            target = b.rewards + b.discounts * next_q  # [N]
        qs = self.critics(b.obs, b.actions)  # [K, N]
        td = qs[0] - target
        critic_loss = (b.weights * (qs - target).pow(2)).sum(0).mean()
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()
        metrics = {"loss/critic": critic_loss.detach(), "learner/q_mean": qs[0].detach().mean()}
        if (self.updates + 1) % c.policy_delay == 0:  # delayed actor and target updates (Sec. 5.2)
            # dQ/da only: the critics' weights are detached, so their gradients are not computed
            actor_loss = -self.critics(b.obs, self.policy(b.obs), members=slice(0, 1), detach_weights=True).mean()
            self.actor_optimizer.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_optimizer.step()
            polyak(self.target_critics, self.critics, c.tau)
            polyak(self.target_actor, self.policy, c.tau)
            self.last_actor_loss = actor_loss.detach()
        metrics["loss/actor"] = self.last_actor_loss
        return metrics, td.detach().abs() if c.prioritized else None

    def extra_state(self) -> dict[str, Any]:
        return {"critics": self.critics.state_dict(), "target_critics": self.target_critics.state_dict(),
                "target_actor": self.target_actor.state_dict(), "actor_opt": self.actor_optimizer.state_dict(),
                "critic_opt": self.critic_optimizer.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.load_extra_networks(state)
        load_optimizer(self.actor_optimizer, state["actor_opt"])
        load_optimizer(self.critic_optimizer, state["critic_opt"])

    def load_extra_networks(self, extra: dict[str, Any]) -> None:
        self.critics.load_state_dict(extra["critics"])
        self.target_critics.load_state_dict(extra["target_critics"])
        self.target_actor.load_state_dict(extra["target_actor"])


register(AlgoSpec("td3", TD3Config, TD3Learner, make_policy, "sync",
                  "Twin Delayed DDPG: clipped double Q, target smoothing, delayed actor (continuous actions)"))
