"""CrossQ (Bhatt et al. 2024, "CrossQ: Batch Normalization in Deep Reinforcement Learning for
Greater Sample Efficiency and Simplicity"; sb3-contrib's CrossQ): SAC without target networks.
The critics carry Batch Renormalization (Ioffe 2017) before each layer and evaluate (s, a) and
(s', a' ~ pi) in one joint batch, so the normalisation's statistics cover both distributions and
the bootstrapped target comes from the live critics (Sec. 3); the actor, with Batch
Renormalization too, is updated every ``policy_delay`` critic updates.

Batch Renormalization's layers normalise with the batch's statistics only where the learner
turns them on (:func:`batch_statistics`): in the critics' joint pass and the actor's update. Everywhere
else (runners, evaluation, deployment, the actor's loss through the critics) they use their
running statistics, which travel with the weights as buffers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import gymnasium as gym
import torch
from torch import Tensor, nn

from shoal.algos import AlgoSpec, register
from shoal.algos.sac import SACConfig, SACLearner, SquashedGaussianActor
from shoal.config import _check, critic_sizes
from shoal.errors import ShoalError
from shoal.offpolicy import OffPolicyLearner, QCritics, observations_normalized
from shoal.policy import EncoderSpec, is_image
from shoal.replay import Transitions


class BatchRenorm(nn.Module):
    """Batch Renormalization (Ioffe 2017, Algorithm 1) over the rows of [N, F] inputs, or with
    ``groups`` K of [K, N, F] inputs, each group its own statistics and affine parameters (the K
    stacked critics of :class:`shoal.offpolicy.QCritics`).

    In training mode: x_hat = (x - mu_B) / sigma_B * r + d, with r = sigma_B / sigma clipped to
    [1/r_max, r_max] and d = (mu_B - mu) / sigma clipped to [-d_max, d_max], both without gradients
    (mu, sigma: the running statistics); for the first ``warmup`` training passes r = 1 and d = 0,
    which is batch normalisation. The running mean and variance move ``momentum`` of the way to
    the batch's each training pass. Otherwise x_hat = (x - mu) / sigma. Then gamma x_hat + beta.
    Layers are made in evaluation mode: the learner turns them on where it wants batch statistics.
    """

    def __init__(self, features: int, groups: int | None = None, momentum: float = 0.01, eps: float = 1e-3,
                 warmup: int = 100_000, r_max: float = 3.0, d_max: float = 5.0):
        super().__init__()
        shape = (features,) if groups is None else (groups, 1, features)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))
        self.register_buffer("steps", torch.tensor(0, dtype=torch.long))
        self.momentum, self.eps, self.warmup, self.r_max, self.d_max = momentum, eps, warmup, r_max, d_max
        self.train(False)

    def forward(self, x: Tensor, detach: bool = False) -> Tensor:
        """Normalised ``x``; ``detach``: the affine parameters without gradients (dQ/da for an actor)."""
        weight, bias = (self.weight.detach(), self.bias.detach()) if detach else (self.weight, self.bias)
        if not self.training:
            scale = weight * torch.rsqrt(self.running_var + self.eps)
            return torch.addcmul(bias - self.running_mean * scale, x, scale)
        # torch's batch norm kernel (and its backward), a few times as fast as var_mean's reduction
        # over rows; [K, N, F] goes as [N, K x F]
        n = x.shape[-2]
        flat = x.transpose(0, 1).reshape(n, -1) if x.dim() == 3 else x
        out, mean, invstd = torch.native_batch_norm(flat, None, None, None, None, True, 0.0, self.eps)
        if x.dim() == 3:
            out = out.view(n, *x.shape[::2]).transpose(0, 1)
        with torch.no_grad():
            mean, invstd = mean.view(self.running_mean.shape), invstd.view(self.running_mean.shape)
            renorm = int(self.steps) >= self.warmup
            if renorm:  # r and d, without gradients
                running_std = (self.running_var + self.eps).sqrt()
                r = (running_std * invstd).reciprocal_().clamp_(1 / self.r_max, self.r_max)
                d = ((mean - self.running_mean) / running_std).clamp_(-self.d_max, self.d_max)
            var = (invstd.pow(-2) - self.eps).clamp_min_(0)  # the batch's (biased) variance
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * (n / max(n - 1, 1)), self.momentum)
            self.steps += 1
        if renorm:  # gamma (x_hat r + d) + beta
            return torch.addcmul(torch.addcmul(bias, d, weight), out, weight * r)
        return torch.addcmul(bias, out, weight)


@contextlib.contextmanager
def batch_statistics(layers: list[BatchRenorm]) -> Iterator[None]:
    """Within the block, ``layers`` normalise with their batches' statistics (and update their
    running ones); after it, with the running statistics again."""
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False


def renorm_layers(module: nn.Module) -> list[BatchRenorm]:
    """The Batch Renormalization layers in ``module``, for :func:`batch_statistics`."""
    return [m for m in module.modules() if isinstance(m, BatchRenorm)]


@dataclass(frozen=True)
class CrossQConfig(SACConfig):
    """CrossQ: SAC with Batch Renormalization in its networks, no target networks and a delayed actor."""

    algo: ClassVar[str] = "crossq"

    lr: float = 1e-3
    """Adam learning rate (sb3-contrib's CrossQ default)."""
    tau: float = 1.0
    """Fixed at 1 (another value is refused): CrossQ has no target networks (as sb3-contrib's, whose
    tau is fixed at 1)."""
    policy_delay: int = 3
    """Critic updates per actor (and temperature) update."""
    critic_hidden_sizes: tuple[int, ...] | None = (1024, 1024)
    """The critics' hidden widths (hidden_sizes: the actor's; None: the actor's for both). The
    authors found wide critics learn markedly faster (2048 in the paper; sb3-contrib's default
    1024), at a CPU cost: a 1024-wide critic update is several times a 256-wide one's."""
    n_critics: int = 2
    """Critics, each with its own Batch Renormalization statistics (no targets); the soft targets
    and the actor's loss take their smallest value (sb3-contrib's n_critics)."""
    adam_beta1: float = 0.5
    """Adam's first-moment decay for every network (the paper's 0.5; 0.9 is Adam's usual)."""
    batch_norm_momentum: float = 0.01
    """How far the running statistics move to each training batch's."""
    batch_norm_eps: float = 1e-3
    """Added to variances before their square roots."""
    renorm_warmup_steps: int = 100_000
    """Training passes of each layer as plain batch normalisation before its running statistics
    correct the batch's (Batch Renormalization's r and d)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.policy_delay >= 1, "policy_delay must be at least 1")
        _check(self.tau == 1.0, f"tau {self.tau}: crossq has no target networks to move towards the critics (as "
               "sb3-contrib's); the critics' Batch Renormalization takes their place")
        _check(0 <= self.adam_beta1 < 1, "adam_beta1 must be in [0, 1)")
        _check(not self.cuda_graph, "--cuda-graph records the updates of sac and tqc, not crossq's: its actor "
               "learns every policy_delay updates and Batch Renormalization counts its warm-up, which one graph "
               "cannot replay")
        _check(0 < self.batch_norm_momentum <= 1, "batch_norm_momentum must be in (0, 1]")
        _check(self.batch_norm_eps > 0, "batch_norm_eps must be positive")
        _check(self.renorm_warmup_steps >= 0, "renorm_warmup_steps must be 0 or more")

    def renorm(self, groups: int | None = None) -> Any:
        """A maker of this config's Batch Renormalization layers of a given width."""
        return lambda features: BatchRenorm(features, groups, self.batch_norm_momentum, self.batch_norm_eps,
                                            self.renorm_warmup_steps)


class RenormActor(SquashedGaussianActor):
    """SAC's squashed Gaussian actor with Batch Renormalization before each hidden layer and after
    the last (sb3-contrib's CrossQ actor); with --use-sde, gSDE's noise from those last features."""

    def __init__(self, config: CrossQConfig, obs_space: gym.Space, action_space: gym.Space):
        sde = (config.log_std_init, config.sde_sample_freq) if config.use_sde else None
        super().__init__(obs_space, action_space, config.hidden_sizes, config.activation, sde)
        norm, layers = config.renorm(), []
        for m in self.trunk.modules():
            if isinstance(m, nn.Linear):
                layers.append(norm(m.in_features))
            if not isinstance(m, nn.Sequential):
                layers.append(m)
        self.trunk = nn.Sequential(*layers, norm(config.hidden_sizes[-1]))


def make_policy(config: CrossQConfig, obs_space, action_space) -> RenormActor:
    """CrossQ's actor: continuous actions from vector observations."""
    if isinstance(action_space, gym.spaces.Discrete):
        raise ShoalError("crossq needs continuous (Box) actions (as sb3-contrib's); use sac or dqn for discrete ones")
    if is_image(obs_space) or getattr(obs_space, "images", ()) or EncoderSpec.of(config) is not None:
        raise ShoalError(f"crossq takes vector observations through its own networks ({obs_space}"
                         f"{', --encoder' if EncoderSpec.of(config) else ''}): images and --encoder train with sac")
    return observations_normalized(config, RenormActor(config, obs_space, action_space))


class CrossQLearner(SACLearner):
    """SAC's three losses, with the critics' joint pass over (s, a) and (s', a') in place of
    target critics, and the actor's and temperature's losses every ``policy_delay`` updates."""

    def __init__(self, config: CrossQConfig, obs_space, action_space, store, policy_id: str = "default",
                 replay_shards: list[Any] | None = None):
        OffPolicyLearner.__init__(self, config, obs_space, action_space, store, policy_id, replay_shards)
        self.discrete = False
        self.critics = QCritics(config.n_critics, self.policy.obs_dim, self.policy.action_dim, critic_sizes(config),
                                config.activation, norm=config.renorm(groups=config.n_critics)).to(self.device)
        self.init_temperature(config)
        self.actor_layers, self.critic_layers = renorm_layers(self.policy), renorm_layers(self.critics)
        self.optimizer = self.adam({"actor_lr": self.policy.parameters(), "critic_lr": self.critics.parameters(),
                                    "alpha_lr": [self.log_alpha] if config.alpha is None else []},
                                   betas=(config.adam_beta1, 0.999))
        self.last_actor = (torch.tensor(0.0, device=self.device), torch.tensor(0.0, device=self.device))

    def train_batch(self, b: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        c, n = self.config, len(b.rewards)
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_a, next_logp = self.policy.sample(b.next_obs, self.generator)
        with batch_statistics(self.critic_layers):  # one pass: the statistics of (s, a) and (s', a') together
            q_all = self.critics(torch.cat([b.obs, b.next_obs]), torch.cat([b.actions, next_a]))  # [2, 2N]
        qs = q_all[:, :n]
        target = b.rewards + b.discounts * (q_all[:, n:].detach().min(0).values - alpha * next_logp)
        loss = critic_loss = (b.weights * (qs - target).pow(2)).sum(0).mean() * 0.5
        if (self.updates + 1) % c.policy_delay == 0:
            with batch_statistics(self.actor_layers):
                a, logp = self.policy.sample(b.obs, self.generator)
            # dQ/da through the critics' running statistics, no critic gradients
            q_pi = self.critics(b.obs, a, detach_weights=True).min(0).values
            actor_loss = (alpha * logp - q_pi).mean()
            loss = loss + actor_loss
            if c.alpha is None:
                loss = loss + (self.log_alpha * (-logp.detach() - self.target_entropy)).mean()
            self.last_actor = (actor_loss.detach(), -logp.detach().mean())
        self.optimizer.zero_grad(set_to_none=True)  # the actor's and alpha's gradients stay None between
        loss.backward()                             # their updates: Adam leaves those parameters be
        self.optimizer.step()
        metrics = {"loss/critic": critic_loss.detach(), "loss/actor": self.last_actor[0], "learner/alpha": alpha,
                   "learner/entropy": self.last_actor[1], "learner/q_mean": qs[0].detach().mean()}
        return metrics, (qs[0] - target).detach().abs() if c.prioritized else None

    def extra_state(self) -> dict[str, Any]:
        return {"critics": self.critics.state_dict(), "log_alpha": self.log_alpha.detach().clone(),
                "optimizer": self.optimizer.state_dict()}

    def load_extra_networks(self, extra: dict[str, Any]) -> None:
        """The critics (their running statistics too) and the temperature learned with them."""
        self.critics.load_state_dict(extra["critics"])
        with torch.no_grad():
            self.log_alpha.copy_(extra["log_alpha"])


register(AlgoSpec("crossq", CrossQConfig, CrossQLearner, make_policy, "sync",
                  "CrossQ: SAC with Batch Renormalization, no target networks, a delayed actor (continuous actions)"))
