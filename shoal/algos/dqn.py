"""Deep Q-Networks (Mnih et al. 2015) with Rainbow's options (Hessel et al. 2018): double
Q-learning (van Hasselt et al. 2016), a dueling head (Wang et al. 2016), n-step returns,
prioritised replay (Schaul et al. 2016), noisy nets (Fortunato et al. 2018) and a categorical
distribution of returns (C51, Bellemare et al. 2017). All on: Rainbow.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shoal.algos import AlgoSpec, register
from shoal.config import _check
from shoal.errors import ShoalError
from shoal.learner import clip_grad_norm
from shoal.offpolicy import OffPolicyConfig, OffPolicyLearner, observations_normalized, polyak, target_copy
from shoal.policy import EncoderSpec, PolicyModule, mlp
from shoal.replay import Transitions


@dataclass(frozen=True)
class DQNConfig(OffPolicyConfig):
    """DQN for discrete actions: double, dueling, n-step and prioritised replay as flags."""

    algo: ClassVar[str] = "dqn"

    double: bool = True
    """Double Q-learning: the online network picks the next action, the target network values it."""
    dueling: bool = False
    """Dueling head: Q = V + A - mean(A)."""
    tau: float = 1.0
    """Target update: 1.0 copies every target_update_interval updates; < 1 is Polyak averaging each update."""
    target_update_interval: int = 1000
    """Gradient updates between target-network copies (when tau is 1.0)."""
    exploration_fraction: float = 0.1
    """Fraction of total_steps over which epsilon decays linearly."""
    exploration_initial_eps: float = 1.0
    """Epsilon at the start."""
    exploration_final_eps: float = 0.05
    """Epsilon after the decay."""
    max_grad_norm: float = 10.0
    """Clip the global gradient norm to this."""
    noisy: bool = False
    """Noisy nets: the heads' layers learn the scale of noise on their weights, which explores in
    place of epsilon-greedy (epsilon is 0 once learning starts; Fortunato et al. 2018)."""
    noisy_sigma0: float = 0.5
    """Noisy nets' initial noise scale: sigma = sigma0 / sqrt(inputs) on every weight and bias."""
    num_atoms: int = 1
    """Atoms of a categorical distribution of each action's return, evenly spaced from v_min to
    v_max (C51, Bellemare et al. 2017: 51), learned by cross-entropy against the projected target
    distribution; 1: expected values only (RLlib's num_atoms)."""
    v_min: float = -10.0
    """With num_atoms > 1: the smallest return the distribution holds (targets below it are clipped to it)."""
    v_max: float = 10.0
    """With num_atoms > 1: the largest return the distribution holds (targets above it are clipped to it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.noisy_sigma0 > 0, "noisy_sigma0 must be positive")
        _check(self.num_atoms == 1 or self.num_atoms >= 2, "num_atoms must be 1 (expected values) or at least 2")
        _check(self.num_atoms == 1 or self.v_min < self.v_max, "v_min must be below v_max")
        _check(self.target_update_interval >= 1, "target_update_interval must be at least 1")
        # torch scales the gradients by max_grad_norm / norm: a negative one would ascend the loss
        _check(self.max_grad_norm > 0, "max_grad_norm must be positive")
        _check(0 <= self.exploration_fraction <= 1, "exploration_fraction must be in [0, 1]")
        _check(0 <= self.exploration_final_eps <= self.exploration_initial_eps <= 1,
               "need 0 <= exploration_final_eps <= exploration_initial_eps <= 1")

    def epsilon(self, env_steps: int) -> float:
        """Linearly decayed exploration rate after ``env_steps`` steps."""
        decay_steps = max(1.0, self.exploration_fraction * self.total_steps)
        frac = min(1.0, env_steps / decay_steps)
        return self.exploration_initial_eps + frac * (self.exploration_final_eps - self.exploration_initial_eps)


def scaled_noise(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    """Factorised noise's f(e) = sign(e) sqrt(|e|) of standard normal draws e."""
    e = torch.randn(shape, generator=generator, device=device)
    return e.sign() * e.abs().sqrt()


class NoisyLinear(nn.Linear):
    """A linear layer with learned noise on its weights (Fortunato et al. 2018, factorised noise):
    y = (mu_W + sigma_W * (f(e_out) f(e_in)^T)) x + mu_b + sigma_b * f(e_out).

    ``weight`` and ``bias`` are the means mu (they start as the plain layer's), ``weight_sigma``
    and ``bias_sigma`` the learned scales (sigma0 / sqrt(inputs) at the start). Noise is drawn
    only while :attr:`draws` is set (by :meth:`QNetwork.noise`); otherwise the layer is its means.
    A draw is one per call (the batch shares it, as the paper's updates), or one per input row:
    factorised, that is y = mu_W x + mu_b + f(e_out) * (sigma_W (f(e_in) * x) + sigma_b), two
    matrix products whatever the batch (a runner's envs each explore by their own).
    """

    def __init__(self, linear: nn.Linear, sigma0: float):
        super().__init__(linear.in_features, linear.out_features, device=linear.weight.device)
        with torch.no_grad():
            self.weight.copy_(linear.weight)
            self.bias.copy_(linear.bias)
        scale = sigma0 / math.sqrt(self.in_features)
        self.weight_sigma = nn.Parameter(torch.full_like(self.weight, scale))
        self.bias_sigma = nn.Parameter(torch.full_like(self.bias, scale))
        self.draws: tuple[torch.Generator | None, bool] | None = None  # (generator, per row) while noisy

    def forward(self, x: Tensor) -> Tensor:
        if self.draws is None:
            return super().forward(x)
        g, per_row = self.draws
        rows = x.shape[:-1] if per_row else ()
        e_in = scaled_noise((*rows, self.in_features), g, x.device)
        e_out = scaled_noise((*rows, self.out_features), g, x.device)
        if per_row:
            return super().forward(x) + e_out * nn.functional.linear(x * e_in, self.weight_sigma, self.bias_sigma)
        return nn.functional.linear(x, torch.addcmul(self.weight, self.weight_sigma, torch.outer(e_out, e_in)),
                                    torch.addcmul(self.bias, self.bias_sigma, e_out))


def make_noisy(module: nn.Module, sigma0: float) -> nn.Module:
    """``module`` with each of its nn.Linear layers a :class:`NoisyLinear` from it."""
    if isinstance(module, nn.Linear):
        return NoisyLinear(module, sigma0)
    for name, child in module.named_children():
        setattr(module, name, make_noisy(child, sigma0))
    return module


class QNetwork(PolicyModule):
    """Q-values for every discrete action; acts epsilon-greedily (epsilon is a published buffer).

    Image observations go through a convolutional encoder, and the heads are linear on its
    features: with the Nature encoder, the network of Mnih et al. 2015. The user's ``encoder``
    (any observations) is followed by ``hidden_sizes`` MLP heads.

    With an action mask, it acts among the legal actions only (greedy and random ones), and the
    targets are the best legal action's value at the next state.

    With ``quantiles`` M > 1 (QR-DQN) the heads give M quantiles of each action's return
    (:meth:`quantiles`, [N, actions, M]; the dueling head's value M of them too), and Q-values,
    which it acts on, are their means. With ``atoms`` K > 1 (C51) they give the logits of a
    categorical distribution over K returns evenly spaced from ``v_min`` to ``v_max``
    (:meth:`atom_logits`; dueling on the logits, as Rainbow's), and Q-values are its expectations.

    With ``noisy_sigma0`` the heads' layers are :class:`NoisyLinear`, and so is the image
    encoder's fully connected layer (its convolutions stay plain, as Rainbow's; a user's
    ``--encoder`` stays as it is). Exploring and stochastic acting draw noise, each row
    its own; deterministic acting (evaluation, export, the policy server) uses the means.
    """

    masks = True
    layers_after_cnn = False

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hidden_sizes: tuple[int, ...],
                 activation: str, dueling: bool, encoder: EncoderSpec | None = None, quantiles: int = 1,
                 noisy_sigma0: float | None = None, atoms: tuple[int, float, float] = (1, 0.0, 0.0)):
        super().__init__(obs_space, action_space, normalize_obs=False, images=True, encoder=encoder)
        if not self.discrete:
            raise ShoalError("dqn needs discrete actions; use sac, td3 or ddpg for continuous ones")
        act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
        self.dueling, self.n_quantiles, self.n_atoms = dueling, quantiles, atoms[0]
        outputs = quantiles * self.n_atoms  # per action (one of the two is 1)
        if self.n_atoms > 1:  # the returns the atoms stand for (not a weight: rebuilt from the settings)
            self.register_buffer("support", torch.linspace(atoms[1], atoms[2], self.n_atoms), persistent=False)
        if self.cnn:
            hidden_sizes = ()
        if dueling:
            self.trunk = (nn.Sequential(mlp([self.feature_dim, *hidden_sizes], act, out_gain=1.0), act())
                          if hidden_sizes else nn.Identity())
            width = hidden_sizes[-1] if hidden_sizes else self.feature_dim
            self.value_head = mlp([width, outputs], act, out_gain=1.0)
            self.advantage_head = mlp([width, self.action_dim * outputs], act, out_gain=1.0)
        else:
            self.q = mlp([self.feature_dim, *hidden_sizes, self.action_dim * outputs], act, out_gain=1.0)
        if noisy_sigma0 is not None:  # the heads and the Nature network's 512 units: Rainbow's fully connected layers
            for head in ("trunk", "value_head", "advantage_head", "q"):
                if hasattr(self, head):
                    make_noisy(getattr(self, head), noisy_sigma0)
            if self.cnn:
                self.encoder.linear = NoisyLinear(self.encoder.linear, noisy_sigma0)
        # found once: acting enters noise() at every step (a copy's, deepcopied, are its own)
        self.noisy_layers = tuple(m for m in self.modules() if isinstance(m, NoisyLinear))
        self.register_buffer("epsilon", torch.tensor(1.0))
        self.register_buffer("random_actions", torch.tensor(True))  # until learning starts

    def forward(self, x: Tensor) -> Tensor:  # [N, actions]
        if self.n_quantiles > 1:
            return self.quantiles(x).mean(-1)
        if self.n_atoms > 1:
            return self.atom_logits(x).softmax(-1) @ self.support
        if not self.dueling:
            return self.q(self.encoder(x))
        h = self.trunk(self.encoder(x))
        adv = self.advantage_head(h)
        return self.value_head(h) + adv - adv.mean(dim=-1, keepdim=True)  # Wang et al. eq. 9

    def quantiles(self, x: Tensor) -> Tensor:
        """[N, actions, M]: M quantiles of each action's return (the network's outputs, with M > 1)."""
        return self._per_action(x, self.n_quantiles)

    def atom_logits(self, x: Tensor) -> Tensor:
        """[N, actions, K]: logits of each action's return being each of the K atoms (with K > 1)."""
        return self._per_action(x, self.n_atoms)

    def _per_action(self, x: Tensor, m: int) -> Tensor:
        """The heads' ``m`` outputs per action [N, actions, m] (dueling: per output)."""
        n = x.shape[0]
        if not self.dueling:
            return self.q(self.encoder(x)).view(n, self.action_dim, m)
        h = self.trunk(self.encoder(x))
        adv = self.advantage_head(h).view(n, self.action_dim, m)
        return self.value_head(h)[:, None] + adv - adv.mean(dim=1, keepdim=True)

    @contextlib.contextmanager
    def noise(self, generator: torch.Generator | None, per_row: bool = True) -> Iterator[None]:
        """Within the block, the noisy layers draw noise from ``generator``, for each input row or
        once a call (nothing without noisy layers)."""
        for layer in self.noisy_layers:
            layer.draws = (generator, per_row)
        try:
            yield
        finally:
            for layer in self.noisy_layers:
                layer.draws = None

    def apply_ladder(self, index: int, count: int) -> None:
        """Ape-X's fixed per-actor rates: eps_i = 0.4 ** (1 + 7 i / (N - 1)) (Horgan et al. 2018, Sec. 4.1).
        A noisy network explores by its noise instead, each actor's its own draws."""
        if not bool(self.random_actions) and not self.noisy_layers:
            self.epsilon.fill_(0.4 ** (1 + 7 * index / max(1, count - 1)))

    @torch.no_grad()
    def initial_priorities(self, obs: Tensor, actions: Tensor, rewards: Tensor, next_obs: Tensor,
                           discounts: Tensor) -> Tensor:
        """Ape-X actors' priorities: |r + discount * max Q(s') - Q(s, a)| with this copy's network."""
        q = self(obs).gather(-1, actions.long()[:, None]).squeeze(-1)
        return (rewards + discounts * self.legal_q(next_obs).max(-1).values - q).abs()

    def legal_q(self, x: Tensor, q: Tensor | None = None, legal: Tensor | None = None) -> Tensor:
        """Q-values [N, actions] of network inputs ``x`` (or ``q``, computed for them), the
        illegal actions' (``legal``, or :meth:`legal` of ``x``) set to the smallest float (never
        the max): as they are without a mask."""
        q = self(x) if q is None else q
        legal = self.legal(x) if legal is None else legal
        return q if legal is None else q.masked_fill(~legal, torch.finfo(q.dtype).min)

    def _epsilon_greedy(self, x: Tensor, generator: torch.Generator | None) -> Tensor:
        n, legal = x.shape[0], self.legal(x)
        greedy = self.legal_q(x, legal=legal).argmax(-1)
        random = (torch.randint(0, self.action_dim, (n,), generator=generator, device=x.device) if legal is None
                  else torch.multinomial(legal.float(), 1, generator=generator).squeeze(-1))
        explore = torch.rand(n, generator=generator, device=x.device) < self.epsilon  # (a tensor: no wait on a GPU)
        return torch.where(explore, random, greedy)

    def explore(self, x: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        with self.noise(generator):
            return self._epsilon_greedy(x, generator), x.new_zeros(x.shape[0])

    def act(self, x: Tensor, deterministic: bool, generator: torch.Generator | None = None) -> Tensor:
        if deterministic:
            return self.legal_q(x).argmax(-1)
        with self.noise(generator):
            return self._epsilon_greedy(x, generator)


def td_targets(rewards: Tensor, discounts: Tensor, next_q_target: Tensor, next_q_online: Tensor | None) -> Tensor:
    """r + discount * Q_target(s', a*) [N]; a* from the online net when double, else the target's max."""
    if next_q_online is None:
        best = next_q_target.max(-1).values
    else:
        best = next_q_target.gather(-1, next_q_online.argmax(-1, keepdim=True)).squeeze(-1)
    return rewards + discounts * best


def categorical_targets(probs: Tensor, rewards: Tensor, discounts: Tensor, support: Tensor) -> Tensor:
    """C51's target distribution [N, K] (Bellemare et al. 2017, Algorithm 1): each atom z_j of the
    next state's distribution ``probs`` [N, K] moves to r + discount * z_j, clipped to the support,
    and its probability is split between the two atoms around it in proportion to nearness (all of
    it to one it lands on). A terminal row's (discount 0) is all at r."""
    k = len(support)
    v_min, v_max = support[0], support[-1]
    moved = (rewards[:, None] + discounts[:, None] * support).clamp(v_min, v_max)
    b = (moved - v_min) / ((v_max - v_min) / (k - 1))  # fractional atom index, in [0, K - 1]
    lower, upper = b.floor().long().clamp(0, k - 1), b.ceil().long().clamp(0, k - 1)
    out = torch.zeros_like(probs)
    out.scatter_add_(1, lower, probs * (upper - b + (lower == upper)))
    out.scatter_add_(1, upper, probs * (b - lower))
    return out


def make_policy(config: DQNConfig, obs_space, action_space, quantiles: int = 1) -> QNetwork:
    """The Q-network DQN trains and runners act with (QR-DQN's, with its ``quantiles``)."""
    return observations_normalized(config, QNetwork(
        obs_space, action_space, config.hidden_sizes, config.activation, config.dueling, EncoderSpec.of(config),
        quantiles=quantiles, noisy_sigma0=config.noisy_sigma0 if config.noisy else None,
        atoms=(config.num_atoms, config.v_min, config.v_max)))


class DQNLearner(OffPolicyLearner):
    """Huber TD loss on (prioritised) replay, with a hard or Polyak target network."""

    def __init__(self, config: DQNConfig, obs_space, action_space, store, policy_id: str = "default",
                 replay_shards: list[Any] | None = None):
        super().__init__(config, obs_space, action_space, store, policy_id, replay_shards)
        self.target = target_copy(self.policy)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr, eps=config.optimizer_eps,
                                          fused=True)
        self.set_exploration(0)

    def set_exploration(self, env_steps: int) -> None:
        super().set_exploration(env_steps)
        c = self.config
        self.policy.epsilon.fill_(1.0 if self.warming_up(env_steps) else 0.0 if c.noisy else c.epsilon(env_steps))

    def noise(self) -> contextlib.ExitStack:
        """Noise in the online and the target network for the update in the block: a draw for each
        network call, which the batch shares (as the paper's updates, and half the cost of a draw
        per row at a batch of 64 and 256 units)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.policy.noise(self.generator, per_row=False))
        stack.enter_context(self.target.noise(self.generator, per_row=False))
        return stack

    def train_batch(self, b: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        with self.noise():
            return self.td_update(b)

    def td_update(self, b: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        """One update on batch ``b`` (its loss, the optimizer's step and the target's)."""
        c = self.config
        if c.num_atoms > 1:
            return self.categorical_update(b)
        q = self.policy(b.obs).gather(-1, b.actions[:, None]).squeeze(-1)
        with torch.no_grad():
            m = self.policy
            legal = m.legal(b.next_obs)
            target = td_targets(b.rewards, b.discounts, m.legal_q(b.next_obs, self.target(b.next_obs), legal),
                                m.legal_q(b.next_obs, legal=legal) if c.double else None)
        loss = (b.weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.clip_and_step()
        self.update_target()
        td = (q - target).detach()
        return {"loss/q": loss.detach(), "learner/q_mean": q.detach().mean(),
                "learner/epsilon": self.policy.epsilon.clone()}, td.abs() if c.prioritized else None

    def categorical_update(self, b: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        """C51's update: cross-entropy of the taken action's distribution against the target
        network's at the best next action (by the online network's expectations with double),
        projected onto the support. Prioritised replay's priority is its KL divergence (Rainbow's)."""
        c, m = self.config, self.policy
        n = len(b.rewards)
        logits = m.atom_logits(b.obs)[torch.arange(n), b.actions]  # [N, K]
        with torch.no_grad():
            legal = m.legal(b.next_obs)
            next_p = self.target.atom_logits(b.next_obs).softmax(-1)  # [N, actions, K]
            expected = None if c.double else next_p @ m.support  # the online network's Q with double
            picker = m.legal_q(b.next_obs, expected, legal)
            target = categorical_targets(next_p[torch.arange(n), picker.argmax(-1)], b.rewards, b.discounts, m.support)
        log_p = F.log_softmax(logits, -1)
        cross_entropy = -(target * log_p).sum(-1)
        loss = (b.weights * cross_entropy).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.clip_and_step()
        self.update_target()
        kl = (torch.xlogy(target, target) - target * log_p.detach()).sum(-1)
        return {"loss/q": loss.detach(), "learner/q_mean": (log_p.detach().exp() @ m.support).mean(),
                "learner/epsilon": m.epsilon.clone()}, kl if c.prioritized else None

    def clip_and_step(self) -> None:
        """The optimizer's step, on gradients clipped to max_grad_norm."""
        clip_grad_norm(self.policy.parameters(), self.config.max_grad_norm)
        self.optimizer.step()

    def update_target(self) -> None:
        """Polyak-average the target network (tau < 1), or copy it every target_update_interval updates."""
        c = self.config
        if c.tau < 1.0:
            polyak(self.target, self.policy, c.tau)
        elif (self.updates + 1) % c.target_update_interval == 0:
            self.target.load_state_dict(self.policy.state_dict())

    def extra_state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "target": self.target.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_extra_networks(state)

    def load_extra_networks(self, extra: dict[str, Any]) -> None:
        self.target.load_state_dict(extra["target"])


register(AlgoSpec("dqn", DQNConfig, DQNLearner, make_policy, "sync",
                  "DQN with double, dueling, n-step, prioritised replay, noisy nets and C51 options: all on is "
                  "Rainbow (discrete actions)"))
