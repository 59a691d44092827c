"""Soft Actor-Critic (Haarnoja et al. 2018, "SAC: Algorithms and Applications"): a tanh-squashed
Gaussian actor maximising Q - alpha * log pi, twin critics with the smaller soft target, and the
temperature alpha tuned to a target entropy (Sec. 5).

For discrete actions, SAC-Discrete (Christodoulou 2019): a categorical actor, critics that give
Q(s, .) for every action, and expectations over the actor's probabilities in place of sampled
actions in the soft target, the actor's loss and the temperature's loss (Sec. 4, eqs. 9-12).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shoal.algos import AlgoSpec, register
from shoal.config import _check, check_sde, critic_sizes
from shoal.cudagraph import GraphedUpdate
from shoal.errors import ShoalError
from shoal.learner import load_optimizer
from shoal.offpolicy import (OffPolicyConfig, OffPolicyLearner, QCritics, ScaledActions, observations_normalized,
                             polyak, target_copy)
from shoal.policy import EncoderSpec, PolicyModule, StateDependentNoise, mlp
from shoal.replay import Transitions

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


@dataclass(frozen=True)
class SACConfig(OffPolicyConfig):
    """SAC for continuous actions (and SAC-Discrete for discrete ones), with automatic entropy tuning."""

    algo: ClassVar[str] = "sac"

    critic_hidden_sizes: tuple[int, ...] | None = None
    """Hidden layer widths of the critics, where they differ from the actor's (unset: hidden_sizes
    for both; SB3's net_arch=dict(pi=..., qf=...), RLlib's critic_hiddens)."""
    n_critics: int = 2
    """Critics, each with its own target; the targets and the actor's loss take their smallest value
    (2: SAC's twin critics; 1: one critic, RLlib's twin_q=False; SB3's n_critics)."""
    alpha: float | None = None
    """Fixed entropy temperature; None tunes it to target_entropy."""
    alpha_init: float = 1.0
    """Initial temperature when tuned."""
    target_entropy: float | None = None
    """Entropy the temperature aims for (default: -action dimensions for continuous actions,
    target_entropy_scale x log(actions) for discrete ones; with an action mask, x log(legal actions)
    state by state)."""
    target_entropy_scale: float = 0.1
    """Discrete actions: the default target entropy as a fraction of the uniform policy's (0.1: CartPole-v1
    plateaus near 250 with 0.5 here; Christodoulou used 0.98 on Atari)."""
    use_sde: bool = False
    """Generalized State-Dependent Exploration (gSDE, Raffin et al. 2021; SB3's use_sde), continuous
    actions: the exploration noise is the last hidden layer's features times a random matrix, held
    for a rollout (or sde_sample_freq steps), so consecutive actions explore smoothly; its scale
    (log_std_init, then learned) is one per feature and action instead of a head's output."""
    sde_sample_freq: int = -1
    """With use_sde: steps between fresh noise matrices in the runners (-1: one per rollout)."""
    log_std_init: float = -3.0
    """With use_sde: the initial log of the noise matrix's scale."""
    actor_lr: float | None = None
    """The actor's Adam learning rate (RLlib's actor_lr, CleanRL's policy_lr; default: lr)."""
    critic_lr: float | None = None
    """The critics' Adam learning rate (RLlib's critic_lr, CleanRL's q_lr; default: lr)."""
    alpha_lr: float | None = None
    """The tuned temperature's Adam learning rate (RLlib's alpha_lr; default: lr)."""
    cuda_graph: bool = False
    """With the learner on a GPU (--device cuda): record the gradient update once as a CUDA graph
    and replay it, one launch for all its kernels, whose launches bound small networks' updates
    there (LeanRL's approach; shoal/cudagraph.py). On an H200: 10x the updates/s of SAC without it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.alpha is None or self.alpha >= 0, "alpha must be 0 or more (or None to tune it)")
        _check(self.alpha_init > 0, "alpha_init must be positive")
        _check(self.n_critics >= 1, "n_critics must be at least 1")
        _check(0 < self.target_entropy_scale < 1, "target_entropy_scale must be in (0, 1)")
        check_sde(self)


class SquashedGaussianActor(ScaledActions):
    """a = tanh(u), u ~ N(mu(s), sigma(s)): bounded actions with a tractable log-probability.

    With ``sde`` (log_std_init, sample_freq), gSDE (Raffin et al. 2021, as SB3's SAC): u = mu(s)
    + h(s) theta with :class:`StateDependentNoise` on the last hidden layer's features (trained
    through the noise too, as SB3's SAC's learn_features); so u ~ N(mu, sqrt(h^2 sigma^2)).
    Runners hold one theta per env for a rollout (or ``sample_freq`` steps); the learner draws
    one per batch. The mean is clipped to [-2, 2] before the squash, as SB3's clip_mean.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hidden_sizes: tuple[int, ...], activation: str,
                 sde: tuple[float, int] | None = None, encoder: EncoderSpec | None = None):
        super().__init__(obs_space, action_space, encoder)
        act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
        self.trunk = nn.Sequential(mlp([self.feature_dim, *hidden_sizes], act, out_gain=math.sqrt(2)), act())
        self.sde = None
        if sde is None:
            self.mu = nn.Linear(hidden_sizes[-1], self.action_dim)
            self.log_std = nn.Linear(hidden_sizes[-1], self.action_dim)
        else:
            self.mu = nn.Sequential(nn.Linear(hidden_sizes[-1], self.action_dim), nn.Hardtanh(-2.0, 2.0))
            self.sde = StateDependentNoise(hidden_sizes[-1], self.action_dim, *sde, learn_features=True)

    def _gaussian(self, x: Tensor, generator: torch.Generator | None,
                  held: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(u, the standard normal noise that drew it, log sigma), each [N, act_dim]; ``held``:
        gSDE's noise from the matrices the rows' envs hold (else one drawn for the batch)."""
        h = self.trunk(self.encoder(x))
        mu = self.mu(h)
        if self.sde is None:
            log_std = self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)
            noise = torch.randn(mu.shape, generator=generator, device=mu.device)
            return mu + log_std.exp() * noise, noise, log_std
        eps, std = self.sde.noise(h, generator, held)  # std: of u given the features [N, act_dim]
        return mu + eps, eps / std, std.log()

    def start_rollout(self) -> None:
        if self.sde is not None:
            self.sde.start_rollout()

    def sample(self, x: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Reparameterised actions [N, act_dim] and their log-probabilities [N] (Appendix C)."""
        u, noise, log_std = self._gaussian(x, generator)
        a = torch.tanh(u)
        # log N(u) - sum log(1 - tanh(u)^2), the latter written stably as 2(log 2 - u - softplus(-2u)).
        logp = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        logp = logp - (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)
        return a, logp

    def _draw(self, x: Tensor, generator: torch.Generator | None, held: bool = False) -> Tensor:
        """Actions as :meth:`sample` draws them, without their log-probabilities."""
        return torch.tanh(self._gaussian(x, generator, held)[0])

    def explore(self, x: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        # Replay keeps no behaviour log-probabilities (as DQN's runners, these report zeros).
        a = (self.uniform(x.shape[0], generator) if self.random_actions
             else self._draw(x, generator, held=self.sde is not None))
        return a, x.new_zeros(x.shape[0])

    def act(self, x: Tensor, deterministic: bool, generator: torch.Generator | None = None) -> Tensor:
        return torch.tanh(self.mu(self.trunk(self.encoder(x)))) if deterministic else self._draw(x, generator)


class CategoricalActor(PolicyModule):
    """pi(.|s) over discrete actions (SAC-Discrete); uniform actions until learning starts. With
    an action mask, the illegal actions have probability 0 (and are never the uniform ones)."""

    masks = True

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hidden_sizes: tuple[int, ...], activation: str,
                 encoder: EncoderSpec | None = None):
        super().__init__(obs_space, action_space, normalize_obs=False, images=True, encoder=encoder)
        act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
        self.logits = mlp([self.feature_dim, *hidden_sizes, self.action_dim], act, out_gain=0.01)
        self.register_buffer("random_actions", torch.tensor(True))  # until learning starts

    def _logits(self, x: Tensor, legal: Tensor | None) -> Tensor:
        """Logits [N, actions], the illegal actions' (``legal``: :meth:`legal` of ``x``) the
        smallest float (probability 0)."""
        out = self.logits(self.encoder(x))
        return out if legal is None else out.masked_fill(~legal, torch.finfo(out.dtype).min)

    def log_probs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """log pi(a|s) and pi(a|s) [N, actions] for every action. With an action mask an illegal
        action's probability is 0 and its log-probability is given as 0, so that p log p and
        p Q are 0 there (not 0 times a number past the float range, or its gradient)."""
        legal = self.legal(x)
        logp = F.log_softmax(self._logits(x, legal), dim=-1)
        return (logp if legal is None else logp.masked_fill(~legal, 0.0)), logp.exp()

    def _sample(self, x: Tensor, generator: torch.Generator | None) -> Tensor:
        probs = F.softmax(self._logits(x, self.legal(x)), dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    def explore(self, x: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        if self.random_actions:
            legal = self.legal(x)
            if legal is not None:
                return torch.multinomial(legal.float(), 1, generator=generator).squeeze(-1), x.new_zeros(x.shape[0])
            return (torch.randint(0, self.action_dim, (x.shape[0],), generator=generator, device=x.device),
                    x.new_zeros(x.shape[0]))
        return self._sample(x, generator), x.new_zeros(x.shape[0])

    def act(self, x: Tensor, deterministic: bool, generator: torch.Generator | None = None) -> Tensor:
        return self._logits(x, self.legal(x)).argmax(-1) if deterministic else self._sample(x, generator)


def make_policy(config: SACConfig, obs_space, action_space) -> PolicyModule:
    """The actor SAC trains: a squashed Gaussian for Box actions, a categorical for Discrete."""
    if isinstance(action_space, gym.spaces.Discrete):
        if config.use_sde:
            raise ShoalError("--use-sde explores continuous actions: it takes Box actions, not Discrete ones")
        return observations_normalized(config, CategoricalActor(obs_space, action_space, config.hidden_sizes,
                                                                config.activation, EncoderSpec.of(config)))
    sde = (config.log_std_init, config.sde_sample_freq) if config.use_sde else None
    return observations_normalized(config, SquashedGaussianActor(obs_space, action_space, config.hidden_sizes,
                                                                 config.activation, sde, EncoderSpec.of(config)))


class SACLearner(OffPolicyLearner):
    """Soft Q-targets with twin critics (n_critics), reparameterised actor loss, temperature tuning.

    The three losses are taken on the same parameters and minimised by one Adam step, as in the
    authors' implementation (softlearning runs the Q, policy and temperature updates as one
    group): the actor's loss reaches the critics only through dQ/da, the temperature's loss
    only through log alpha, so the step equals three separate ones on those parameters.
    """

    def __init__(self, config: SACConfig, obs_space, action_space, store, policy_id: str = "default",
                 replay_shards: list[Any] | None = None):
        super().__init__(config, obs_space, action_space, store, policy_id, replay_shards)
        self.discrete = self.policy.discrete
        self.critics = self.make_critics(config).to(self.device)
        self.target_critics = target_copy(self.critics)
        self.init_temperature(config)
        self.optimizer = self.adam({"actor_lr": self.policy.parameters(), "critic_lr": self.critics.parameters(),
                                    "alpha_lr": [self.log_alpha] if config.alpha is None else []})
        if config.cuda_graph:
            if self.device.type != "cuda":
                raise ShoalError(f"--cuda-graph records the learner's updates on a GPU: it takes --device cuda "
                                 f"(this learner is on {self.device.type}; --no-cuda-graph trains without it)")
            self.graphed = GraphedUpdate(self.train_batch, self.optimizers, self.generator)

    def make_critics(self, config: SACConfig) -> QCritics:
        """The n_critics critics, twin by default (with an encoder of their own for images or --encoder)."""
        return QCritics(config.n_critics, self.policy.obs_dim, self.policy.action_dim, critic_sizes(config),
                        config.activation, discrete=self.discrete, encoder=self.policy.fresh_encoder())

    def init_temperature(self, config: SACConfig) -> None:
        """log alpha (learned unless config.alpha fixes it) and the entropy it aims for."""
        self.log_alpha = torch.tensor(math.log(config.alpha or config.alpha_init), device=self.device,
                                      requires_grad=config.alpha is None)
        if config.target_entropy is not None:
            self.target_entropy = config.target_entropy
        elif self.discrete:
            self.target_entropy = config.target_entropy_scale * math.log(self.policy.action_dim)
        else:
            self.target_entropy = -float(self.policy.action_dim)

    def train_batch(self, b: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        if self.discrete:
            return self._train_discrete(b)
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():  # soft target: min of the target critics minus alpha * log pi (eq. 3)
            next_a, next_logp = self.policy.sample(b.next_obs, self.generator)
            next_q = self.target_critics(b.next_obs, next_a).min(0).values
            target = b.rewards + b.discounts * (next_q - alpha * next_logp)
        features = self.critics.encode(b.obs)  # one encoder pass (images) for both losses
        qs = self.critics(features, b.actions, encoded=True)  # [K, N]
        critic_loss = (b.weights * (qs - target).pow(2)).sum(0).mean() * 0.5
        a, logp = self.policy.sample(b.obs, self.generator)  # reparameterised (eq. 7)
        # dQ/da, no critic gradients (the encoder's features detached too)
        q_pi = self.critics(features.detach(), a, detach_weights=True, encoded=True).min(0).values
        actor_loss = (alpha * logp - q_pi).mean()
        return self._step(critic_loss, actor_loss, -logp.detach(), alpha, qs[0] - target)

    def _train_discrete(self, b: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        """SAC-Discrete: the same three losses with exact expectations over pi(.|s)."""
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():  # V(s') = sum_a pi(a|s') (min_k Q_k'(s', a) - alpha log pi(a|s'))  (eq. 10)
            next_logp, next_p = self.policy.log_probs(b.next_obs)
            next_q = self.target_critics(b.next_obs).min(0).values
            target = b.rewards + b.discounts * (next_p * (next_q - alpha * next_logp)).sum(-1)
        q_all = self.critics(b.obs)  # [K, N, actions]
        qs = q_all.gather(-1, b.actions.expand(len(q_all), -1)[..., None]).squeeze(-1)  # [K, N]
        critic_loss = (b.weights * (qs - target).pow(2)).sum(0).mean() * 0.5
        logp, p = self.policy.log_probs(b.obs)
        # The actor's loss uses the critics' values, not their gradients (eq. 12).
        actor_loss = (p * (alpha * logp - q_all.detach().min(0).values)).sum(-1).mean()
        # With an action mask the entropy a state can have is log(its legal actions): the target
        # is target_entropy_scale of that, state by state (a fixed one above it would grow the
        # temperature without bound).
        legal = self.policy.legal(b.obs)
        target_entropy = (None if legal is None or self.config.target_entropy is not None
                          else self.config.target_entropy_scale * legal.sum(-1).float().log())
        return self._step(critic_loss, actor_loss, -(p * logp).sum(-1).detach(), alpha, qs[0] - target,
                          target_entropy)

    def _step(self, critic_loss: Tensor, actor_loss: Tensor, entropy: Tensor, alpha: Tensor,
              td: Tensor, target_entropy: Tensor | float | None = None) -> tuple[dict[str, Tensor], Tensor | None]:
        """One Adam step on the three losses (the temperature's towards the target entropy, eq. 18;
        ``target_entropy`` [N] per state, or the learner's one)."""
        c = self.config
        loss = critic_loss + actor_loss
        if c.alpha is None:
            target = self.target_entropy if target_entropy is None else target_entropy
            loss = loss + (self.log_alpha * (entropy - target)).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        polyak(self.target_critics, self.critics, c.tau)
        metrics = {"loss/critic": critic_loss.detach(), "loss/actor": actor_loss.detach(),
                   "learner/alpha": alpha, "learner/entropy": entropy.mean()}
        return metrics, td.detach().abs() if c.prioritized else None

    def extra_state(self) -> dict[str, Any]:
        return {"critics": self.critics.state_dict(), "target_critics": self.target_critics.state_dict(),
                "log_alpha": self.log_alpha.detach().clone(), "optimizer": self.optimizer.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.load_extra_networks(state)
        load_optimizer(self.optimizer, state["optimizer"])

    def load_extra_networks(self, extra: dict[str, Any]) -> None:
        """The critics, their targets and the entropy temperature learned with them."""
        self.critics.load_state_dict(extra["critics"])
        self.target_critics.load_state_dict(extra["target_critics"])
        with torch.no_grad():
            self.log_alpha.copy_(extra["log_alpha"])


register(AlgoSpec("sac", SACConfig, SACLearner, make_policy, "sync",
                  "Soft Actor-Critic with twin critics and automatic entropy tuning (continuous and discrete actions)"))
