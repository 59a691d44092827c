"""What every off-policy algorithm shares: its config, a replay-fed learner, critics, action scaling.

The loop is the driver's usual one: runners sample a few steps with the newest weights, the
learner stores them in its ReplayBuffer and makes as many updates as the rate limiter allows
(``updates_per_step`` x ``batch_size`` samples per inserted transition), then publishes.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shoal.config import OWN_LRS, Config, _check
from shoal.errors import ShoalError
from shoal.backends import LocalHandle
from shoal.learner import Learner, UpdateResult, check_losses, read_metrics
from shoal.policy import EncoderSpec, PolicyModule, network_input
from shoal.replay import ReplayBuffer, ShardedReplay, Transitions
from shoal.runner import Rollout

if TYPE_CHECKING:
    from shoal.cudagraph import GraphedUpdate
    from shoal.hindsight import Hindsight


@dataclass(frozen=True)
class OffPolicyConfig(Config):
    """Settings shared by the replay-based algorithms."""

    num_envs_per_runner: int = 1
    """Environments stepped together in each runner."""
    torch_threads: int = 2
    """Torch threads per process: the 256-wide networks' updates are compute-bound, and gain ~30%
    from a second thread here (unlike PPO's small MLPs)."""
    hidden_sizes: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the networks (the critics' too, unless critic_hidden_sizes gives
    theirs; DQN on image observations: a convolutional encoder with linear heads instead)."""
    activation: Literal["tanh", "relu"] = "relu"
    """Hidden-layer activation."""
    rollout_steps: int = 0
    """Steps each env takes per rollout: between learner updates (SB3's train_freq), or under
    --apex per insert into replay. 0: 1, or 8 under --apex (each Ape-X rollout costs a few Ray
    calls; SAC's learner made 61 updates/s on Pendulum-v1 with 2 runners in rollouts of 8 steps,
    against 48 in rollouts of 1)."""
    log_interval: int = 500
    """Env steps between rows of progress.csv and TensorBoard (an iteration here is one env step;
    a row costs ~0.7 ms, 13% of a SAC step on Pendulum, and ~1.3 KB of CSV and TensorBoard)."""
    updates_per_step: float = 1.0
    """Gradient updates per environment step (SB3's gradient_steps / train_freq)."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions."""
    compress_observations: bool = False
    """Keep replay's observations LZ4-compressed (RLlib's compress_observations): Atari's stacked
    frames take 12-50x less memory (1M transitions in a few GB instead of 56), for a few
    microseconds per observation stored and sampled. On in DQN's Atari preset (ALE/*)."""
    learning_starts: int = 100
    """Environment steps of uniformly random actions before learning starts."""
    batch_size: int = 256
    """Transitions per gradient update."""
    lr: float = 3e-4
    """Adam learning rate."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """`linear` decays the learning rate to 0 at total_steps (rl-zoo's lin_ schedules)."""
    optimizer_eps: float = 1e-8
    """Adam's epsilon, added to the root of its squared-gradient average (torch's 1e-8; RLlib's adam_epsilon)."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """Steps of reward summed into each target (n-step returns)."""
    tau: float = 0.005
    """Polyak factor of the target networks (1.0: copy)."""
    prioritized: bool = False
    """Prioritised experience replay (Schaul et al. 2016)."""
    priority_alpha: float = 0.6
    """How much priorities shape sampling (0: uniform)."""
    priority_beta: float = 0.4
    """Initial importance-sampling exponent, annealed to 1 at total_steps."""
    save_replay: bool = False
    """Keep the replay buffer's contents in checkpoints, so a resume loses no experience."""
    init_replay: str | None = None
    """Start the replay buffer with the transitions a run saved with --save-replay: its newest
    checkpoint's (a run directory) or this checkpoint's (SB3's load_replay_buffer). Any replay
    algorithm's, on an env with these spaces, with these gamma, n_step and clip_rewards; the
    newest that fit buffer_size are kept, and they count towards learning_starts. With
    --init-from the same run, a new run goes on from its networks and its experience."""
    apex: bool = False
    """Ape-X (Horgan et al. 2018): runners with a ladder of exploration rates insert into replay
    shards and keep sampling while the learner trains. Asynchronous on the ray backend; the local
    backend runs the same roles synchronously."""
    num_replay_shards: int = 1
    """Replay shards (actors on the ray backend) in Ape-X mode; runner i inserts into shard i % shards."""
    updates_per_call: int = 50
    """Ape-X: gradient updates per learner call before it publishes new weights."""
    her_goals: int = 0
    """Hindsight Experience Replay (Andrychowicz et al. 2017) for goal envs (Gymnasium-Robotics'
    GoalEnv interface): each finished episode's transitions are stored again this many times,
    each with a goal the episode achieved as its goal, and the reward the env's compute_reward
    gives for it (the paper's k, 4 in its experiments; 0: off). buffer_size counts the copies."""
    her_strategy: Literal["future", "final", "episode"] = "future"
    """The goals --her-goals substitutes: one achieved at that step or later in the episode
    (future), at its last step (final), or at any of its steps (episode)."""
    normalize_obs: bool = False
    """Normalise vector observations by a running mean/std (kept in the policy and its
    checkpoints), as stable-baselines3's VecNormalize(norm_obs=True) with an off-policy algorithm
    (rl-zoo's `normalize` for HER's FetchReach): replay keeps observations as the env gave them,
    and each sampled batch is normalised with the statistics of its update."""
    normalize_rewards: bool = False
    """Divide the rewards the learner samples by a running std of each env's discounted return,
    clipped to +-10 (stable-baselines3's VecNormalize norm_reward, rl-zoo's `normalize` with an
    off-policy algorithm; kept in the learner's checkpoint state). Replay keeps the env's rewards,
    scaled as each batch is drawn; the returns shoal reports stay the env's own."""
    reward_scale: float = 1.0
    """Multiply the rewards the learner samples by this (the SAC paper's reward scale: 5 for most
    of its MuJoCo tasks, 20 for Humanoid, with a fixed temperature; on-policy algorithms have it
    too). Replay keeps the env's rewards; the returns shoal reports stay the env's own."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.rollout_steps >= 0, "rollout_steps must be 0 (1, or 8 under --apex) or more")
        _check(self.updates_per_step > 0, "updates_per_step must be positive")
        _check(self.batch_size >= 1, "batch_size must be at least 1")
        _check(0 < self.optimizer_eps < math.inf, "optimizer_eps must be positive and finite")
        _check(self.buffer_size >= self.batch_size, "buffer_size must hold at least one batch")
        _check(self.learning_starts >= 0, "learning_starts must be 0 or more")
        _check(0 < self.lr < math.inf, "lr must be positive and finite")
        _check(0 < self.reward_scale < math.inf, "reward_scale must be positive and finite")
        for key in OWN_LRS:
            value = getattr(self, key, None)
            _check(value is None or 0 < value < math.inf, f"{key} must be positive and finite (or unset: lr)")
        _check(0 < self.gamma <= 1, "gamma must be in (0, 1]")
        _check(self.n_step >= 1, "n_step must be at least 1")
        _check(0 < self.tau <= 1, "tau must be in (0, 1]")
        _check(0 <= self.priority_alpha <= 1 and 0 <= self.priority_beta <= 1,
               "priority_alpha and priority_beta must be in [0, 1]")
        _check(self.num_replay_shards >= 1 and self.updates_per_call >= 1,
               "num_replay_shards and updates_per_call must be at least 1")
        _check(self.num_replay_shards == 1 or self.apex, "--num-replay-shards needs --apex")
        _check(self.her_goals >= 0, "her_goals must be 0 (off) or more")
        if self.her_goals:
            _check(self.n_step == 1, "--her-goals relabels one-step transitions: use --n-step 1")
            _check(not self.apex, "--her-goals cannot be combined with --apex yet (Ape-X runners insert "
                   "transitions, not whole episodes)")
            _check(not self.env.startswith("remote://"), "--her-goals needs the env's compute_reward in the "
                   "learner, and an env server does not send it: train on the env in-process")
            _check((self.frame_stack or 1) == 1 and not self.info_action_mask, "--her-goals relabels each "
                   "observation's goal: it takes neither --frame-stack nor --info-action-mask")

    @property
    def steps_per_rollout(self) -> int:
        """rollout_steps, its 0 resolved (a property, not a value set at construction: the command
        line's flags come after the preset, and --apex may be among them)."""
        return self.rollout_steps or (8 if self.apex else 1)


def polyak(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- tau * source + (1 - tau) * target, in place."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


class QCritics(nn.Module):
    """K independent critics evaluated together: each layer is one batched matmul over the K
    critics' stacked weights rather than K small ones (TD3's and SAC's twin critics cost one
    pass, not two), and the one-output head of Q(s, a) a dot product per row. For continuous
    actions each critic is an MLP on the concatenated observation and action giving Q(s, a); with
    ``discrete`` it is an MLP on the observation giving Q(s, .) for every action, as DQN's network.

    With ``encoder`` (a module with the width of its features, ``out_dim``: a
    :class:`shoal.policy.ConvEncoder` for images, or the user's; the policy's
    :meth:`shoal.policy.PolicyModule.fresh_encoder`) the K critics read the features of that one
    encoder of their own (the actor has another), as stable-baselines3's SAC and TD3 policies: its
    gradients come from the critics' loss only.

    With ``norm`` (a maker of normalisation layers of a given width over [K, N, width] inputs,
    CrossQ's Batch Renormalization) a layer normalises each layer's input, the first's included.
    With ``outputs`` > 1 a continuous critic gives that many numbers per (s, a) (TQC's quantiles).
    """

    def __init__(self, k: int, obs_dim: int, action_dim: int, hidden_sizes: tuple[int, ...], activation: str,
                 discrete: bool = False, encoder: nn.Module | None = None,
                 norm: Callable[[int], nn.Module] | None = None, outputs: int = 1):
        super().__init__()
        self.k, self.discrete, self.outputs = k, discrete, outputs
        self.activation = {"tanh": torch.tanh, "relu": torch.relu}[activation]
        self.encoder = encoder
        if self.encoder is not None:
            obs_dim = self.encoder.out_dim
        sizes = [obs_dim, *hidden_sizes, action_dim] if discrete else [obs_dim + action_dim, *hidden_sizes, outputs]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            gain = 1.0 if i == len(sizes) - 2 else math.sqrt(2)  # as mlp(): orthogonal, zero bias
            w = torch.stack([nn.init.orthogonal_(torch.empty(n_out, n_in), gain).T for _ in range(k)])
            self.weights.append(nn.Parameter(w))  # [K, in, out]
            self.biases.append(nn.Parameter(torch.zeros(k, 1, n_out)))
        self.norms = None if norm is None else nn.ModuleList([norm(n) for n in sizes[:-1]])

    def encode(self, obs: Tensor) -> Tensor:
        """The critics' inputs for network inputs ``obs``: the encoder's features, or without one
        the vectors as they are. Given to :meth:`forward` with ``encoded``, one pass serves several calls."""
        return obs if self.encoder is None else self.encoder(obs)

    def forward(self, obs: Tensor, actions: Tensor | None = None, members: slice = slice(None),
                detach_weights: bool = False, encoded: bool = False) -> Tensor:
        """Q-values of the critics in ``members`` (all by default): [K', N] of (obs, actions) for
        continuous actions ([K', N, outputs] with ``outputs`` > 1); [K', N, actions] for discrete
        ones (no ``actions`` argument). With
        ``detach_weights`` gradients reach the actions (dQ/da for an actor) but no weight, the
        encoder's neither. ``encoded``: ``obs`` are :meth:`encode`'s features already."""
        if not encoded and self.encoder is not None:
            if detach_weights:
                with torch.no_grad():
                    obs = self.encoder(obs)
            else:
                obs = self.encoder(obs)
        layers = list(zip(self.weights, self.biases))
        norms = self.norms if self.norms is not None else [None] * len(layers)
        if members != slice(None):  # a view of all of them would cost a copy of each gradient in backward
            if self.norms is not None:
                raise ValueError("critics with normalisation layers are evaluated together (no members)")
            layers = [(w[members], b[members]) for w, b in layers]
        if detach_weights:
            layers = [(w.detach(), b.detach()) for w, b in layers]
        x = obs if self.discrete else torch.cat([obs, actions], dim=-1)
        h = x.expand(layers[0][0].shape[0], *x.shape)
        for i, ((w, b), norm) in enumerate(zip(layers[:-1], norms)):
            h = self.activation(h) if i else h
            h = torch.baddbmm(b, h if norm is None else norm(h, detach_weights), w)
        w, b = layers[-1]
        if len(layers) > 1:
            h = self.activation(h)
        if norms[-1] is not None:
            h = norms[-1](h, detach_weights)
        if self.discrete or self.outputs > 1:
            return torch.baddbmm(b, h, w)
        # Q(s, a) is one number per row: as a dot product per row the head costs a quarter of what
        # a bmm with one output column does, forward and backward (BENCHMARKS.md).
        return (h * w.transpose(1, 2)).sum(-1) + b.squeeze(-1)


def quantile_huber_loss(quantiles: Tensor, targets: Tensor) -> Tensor:
    """The quantile regression loss (Dabney et al. 2018, QR-DQN's eq. 10; TQC's eq. 8) of estimates
    ``quantiles`` [..., N, M] of the quantiles at the midpoints tau_i = (2i + 1) / 2M against
    samples ``targets`` [N, T] of the target distribution (no gradient): for each estimate, the
    mean over the samples of the Huber loss (kappa 1) of sample minus estimate, weighted by tau_i
    where the sample is the larger and by 1 - tau_i where it is the smaller; [..., N, M].

    Up to ``PAIRS_LIMIT`` (estimate, sample) pairs it goes pair by pair (:func:`quantile_huber_pairs`);
    above, in closed form from the sorted samples' prefix sums (:class:`QuantileHuber`), O(M log T)
    per row instead of M x T, at a fixed cost of ~50 small ops. Forward and backward, 2 threads:
    QR-DQN's CartPole [64, 10] 0.22 ms pair by pair against 0.46; TQC's 2 x 256 x 25 against 46 atoms
    (589k pairs) 1.9 ms in closed form against 2.6-4.9; QR-DQN's Atari [32, 200] 1.3 ms against 4.9
    and its LunarLander [128, 170] 4.0 against 19.6."""
    targets = targets.detach()
    if quantiles.numel() * targets.shape[-1] <= PAIRS_LIMIT:
        return quantile_huber_pairs(quantiles, targets)
    return QuantileHuber.apply(quantiles, targets)


PAIRS_LIMIT = 1 << 18
"""The most (estimate, sample) pairs :func:`quantile_huber_loss` takes one by one (the two ways
cost the same at ~300k-500k pairs here)."""


def quantile_huber_pairs(quantiles: Tensor, targets: Tensor) -> Tensor:
    """:func:`quantile_huber_loss` over every (estimate, sample) pair."""
    m = quantiles.shape[-1]
    tau = (torch.arange(m, device=quantiles.device, dtype=quantiles.dtype) + 0.5).div_(m).unsqueeze(-1)  # [M, 1]
    q, t = torch.broadcast_tensors(quantiles.unsqueeze(-1), targets.unsqueeze(-2))  # [..., N, M, T] views
    weight = torch.where(t < q, 1 - tau, tau)  # no gradient: the indicator's
    return (weight * F.huber_loss(q, t, reduction="none")).mean(-1)


class QuantileHuber(torch.autograd.Function):
    """:func:`quantile_huber_loss` in closed form (``apply(quantiles, targets)``; the targets
    without gradient). With the samples t sorted and x = t - q, the loss of an estimate q splits by where each
    sample lies: t < q - 1 (weight 1 - tau, Huber -x - 1/2), q - 1 <= t < q (1 - tau, x^2 / 2),
    q <= t < q + 1 (tau, x^2 / 2), t >= q + 1 (tau, x - 1/2). Each part is a count, a sum of t and
    a sum of t^2 over a run of the sorted samples: differences of prefix sums at the positions
    ``searchsorted`` finds for q - 1, q and q + 1. Its derivative in q is the same sums' (the
    Huber loss is continuous with its derivative at each border). In float64, so that the sums of
    squares lose nothing that matters to cancellation (returns of 1e5 leave errors below 1e-4)."""

    @staticmethod
    def forward(ctx: Any, quantiles: Tensor, targets: Tensor) -> Tensor:  # type: ignore[override]
        *lead, n, m = quantiles.shape
        t = targets.double().sort(-1).values
        zero = t.new_zeros(n, 1)
        s1, s2 = torch.cat([zero, t.cumsum(-1)], -1), torch.cat([zero, t.square().cumsum(-1)], -1)  # [N, T + 1]
        q = quantiles.detach().double().movedim(-2, 0).reshape(n, -1)  # [N, L x M]
        at = torch.searchsorted(t, torch.cat([q - 1, q, q + 1], -1))  # atoms below each border, [N, 3 x L x M]
        (ia, ib, ic), (s1a, s1b, s1c), (s2a, s2b, s2c) = (x.view(n, 3, -1).unbind(1)
                                                          for x in (at, s1.gather(-1, at), s2.gather(-1, at)))
        n_a, n_b, n_c, n_d = ia, ib - ia, ic - ib, t.shape[-1] - ic
        sum_b, sum_c = s1b - s1a, s1c - s1b
        below = n_a * (q - 0.5) - s1a + 0.5 * (s2b - s2a - 2 * q * sum_b + n_b * q.square())
        above = s1[:, -1:] - s1c - n_d * (q + 0.5) + 0.5 * (s2c - s2b - 2 * q * sum_c + n_c * q.square())
        tau = ((torch.arange(m, device=q.device, dtype=q.dtype) + 0.5) / m).repeat(q.shape[-1] // m)
        loss = ((1 - tau) * below + tau * above) / t.shape[-1]
        grad = ((1 - tau) * (n_a + n_b * q - sum_b) + tau * (n_c * q - sum_c - n_d)) / t.shape[-1]

        def back(x: Tensor) -> Tensor:  # [N, L x M] -> [..., N, M]
            return x.to(quantiles.dtype).view(n, *lead, m).movedim(0, -2)

        ctx.save_for_backward(back(grad))
        return back(loss)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (grad,) = ctx.saved_tensors
        return grad_out * grad, None


class ScaledActions(PolicyModule):
    """Continuous policies that act in [-1, 1]; ``to_env`` maps that to the action bounds. Image
    observations go through a convolutional encoder first (``encoder``; or the user's own)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, encoder: EncoderSpec | None = None):
        super().__init__(obs_space, action_space, normalize_obs=False, images=True, encoder=encoder)
        if self.discrete:
            raise ShoalError("this algorithm needs continuous (Box) actions; use dqn, sac or ppo for discrete ones")
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise ShoalError(f"action space {action_space} has infinite bounds: this algorithm's actor scales its "
                             "actions to the bounds, so give the env's action space the range it really takes "
                             "(or train ppo, a2c or trpo, whose Gaussian actions are not scaled)")
        self.register_buffer("low", torch.tensor(action_space.low.reshape(-1), dtype=torch.float32))
        self.register_buffer("high", torch.tensor(action_space.high.reshape(-1), dtype=torch.float32))
        self.register_buffer("random_actions", torch.tensor(True))  # until learning starts

    def env_actions(self, actions: Tensor) -> Tensor:
        scaled = self.low + (actions.clamp(-1, 1) + 1) * 0.5 * (self.high - self.low)
        return scaled.reshape(actions.shape[0], *self.action_space.shape)

    def uniform(self, n: int, generator: torch.Generator | None) -> Tensor:
        """Uniform random actions in [-1, 1]^d."""
        return torch.rand((n, self.action_dim), generator=generator, device=self.low.device) * 2 - 1


def observations_normalized(config: OffPolicyConfig, policy: PolicyModule) -> PolicyModule:
    """``policy``, normalising observations in the learner where the config says (``normalize_obs``)."""
    return policy.normalize_in_learner() if config.normalize_obs else policy


def min_size_to_sample(config: OffPolicyConfig, shards: int = 1) -> int:
    """Transitions a shard holds before the learner samples it: learning_starts split between the
    shards, and at least a batch."""
    return max(config.learning_starts // shards, config.batch_size)


def replay_fits(states: list[dict[str, Any]], config: OffPolicyConfig) -> bool:
    """Whether a saved replay (each shard's state, its capacity recorded) has the shards these
    settings make, so that it restores exactly; else its transitions are loaded into them."""
    shards = config.num_replay_shards
    return len(states) == shards and all(s.get("capacity") == config.buffer_size // shards for s in states)


def replay_args(config: OffPolicyConfig, obs_space: gym.Space, action_space: gym.Space,
                shards: int = 1) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments of one ReplayBuffer shard (capacity split between shards)."""
    discrete = isinstance(action_space, gym.spaces.Discrete)
    args = (config.buffer_size // shards, *network_input(obs_space),
            () if discrete else (int(np.prod(action_space.shape)),), np.int64 if discrete else np.float32)
    spi = config.updates_per_step * config.batch_size
    # Synchronously, one batch of slack gives exactly updates_per_step. Ape-X runners are held
    # back by the same limiter, and may run about two rollouts ahead of the learner each.
    slack = spi * config.steps_per_rollout * config.num_envs_per_runner * 2 if config.apex else config.batch_size
    kwargs = dict(gamma=config.gamma, n_step=config.n_step, prioritized=config.prioritized,
                  alpha=config.priority_alpha, samples_per_insert=spi,
                  min_size_to_sample=min_size_to_sample(config, shards),
                  error_buffer=slack, seed=config.seed, compress=config.compress_observations)
    return args, kwargs


def check_replay_fits(config: OffPolicyConfig, obs_space: gym.Space, action_space: gym.Space) -> None:
    """One line, before any memory is taken, for a replay that could never fit in this machine's
    memory: NumPy reserves the buffer lazily, so it would fail hours later, when it fills. Only
    where the replay lives on this machine (not with --address), and not when compressed."""
    if config.compress_observations or config.address is not None:
        return
    import os

    shape, dtype = network_input(obs_space)
    discrete = isinstance(action_space, gym.spaces.Discrete)
    per = 2 * int(np.prod(shape)) * dtype.itemsize + (8 if discrete else 4 * int(np.prod(action_space.shape))) + 8
    need = config.buffer_size * per
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says
        return
    if need > have:
        raise ShoalError(f"a replay of {config.buffer_size:,} transitions of {config.env} needs {need / 2**30:.1f} GiB "
                         f"({per:,} bytes each), more than this machine's {have / 2**30:.1f} GiB: lower --buffer-size, "
                         "or add --compress-observations (image observations compress 12-50x)")


def hindsight(config: OffPolicyConfig) -> Hindsight | None:
    """--her-goals: the relabeller of the config's env (made here, for its compute_reward)."""
    if not config.her_goals:
        return None
    from shoal.envs import make_env
    from shoal.hindsight import Hindsight

    return Hindsight.for_env(make_env(config.env, kwargs=config.env_kwargs), k=config.her_goals,
                             strategy=config.her_strategy, gamma=config.gamma, clip_rewards=config.clip_rewards,
                             seed=config.seed)


class OffPolicyLearner(Learner):
    """Learns from replay: its own buffer, or the Ape-X replay shards it is given."""

    def __init__(self, config: OffPolicyConfig, obs_space, action_space, store, policy_id: str = "default",
                 replay_shards: list[Any] | None = None):
        super().__init__(config, obs_space, action_space, store, policy_id)
        if replay_shards is None:
            args, kwargs = replay_args(config, obs_space, action_space)
            replay_shards = [LocalHandle(ReplayBuffer(*args, **kwargs, hindsight=hindsight(config)))]
        # Ape-X fetches 8 batches per call to a remote shard. Synchronous runs with prioritised
        # replay fetch one, so that every batch is drawn after the previous priority update, as
        # in the paper's PER; with uniform replay the batches an update phase takes are drawn
        # together (the buffer does not change within the phase).
        self.replay = ShardedReplay(replay_shards, prefetch=8 if config.apex else 1 if config.prioritized else 16)
        self.updates = 0
        self.replay_loaded = 0  # transitions --init-replay put in replay: they count towards learning_starts
        self.graphed: GraphedUpdate | None = None  # train_batch replayed from a CUDA graph (SAC's --cuda-graph)

    def train_batch(self, batch: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        """One gradient update; returns metrics and, for prioritised replay, new |TD errors| [N]."""
        raise NotImplementedError

    def update_batch(self, batch: Transitions) -> tuple[dict[str, Tensor], Tensor | None]:
        """:meth:`train_batch`, from its CUDA graph where the learner records one."""
        return self.train_batch(batch) if self.graphed is None else self.graphed(batch)

    def set_exploration(self, env_steps: int) -> None:
        """Set the policy's exploration buffers for the coming rollouts."""
        self.policy.random_actions.fill_(self.warming_up(env_steps))

    def warming_up(self, env_steps: int) -> bool:
        """Whether runners still act at random: replay holds fewer than learning_starts transitions
        of this run's steps and those --init-replay loaded."""
        return env_steps + self.replay_loaded < self.config.learning_starts

    def load_replay(self, states: list[dict[str, Any]]) -> tuple[int, int]:
        """Fill replay with a saved replay's transitions (``--init-replay``: another run's
        checkpoint, with --save-replay); they count towards learning_starts. Returns how many were
        loaded and the policy version: the next one, published, where the runners' exploration
        changes with them (no more random steps)."""
        loaded = self.replay.load(states, self.config.priority_alpha)
        self.replay_loaded += loaded
        exploration = [b.clone() for b in self.policy.buffers()]
        self.set_exploration(self.env_steps)
        if not all(map(torch.equal, exploration, self.policy.buffers())):
            self.version += 1
            self.publish()
        return loaded, self.version

    def _train(self, env_steps: int, max_updates: int | None) -> dict[str, float]:
        """Update while the replay's rate limiter allows (at most ``max_updates`` times)."""
        c = self.config
        beta = c.priority_beta + (1.0 - c.priority_beta) * min(1.0, env_steps / c.total_steps)
        lr = self.scheduled_lr(*self.optimizers(), env_steps=env_steps)
        factor = lr / c.lr  # the schedule's, for every rate
        stats: list[dict[str, Tensor]] = []
        while max_updates is None or len(stats) < max_updates:
            got = self.replay.sample(c.batch_size, beta)
            if got is None:
                break
            shard, batch = got[0], got[1].to(self.device)
            if self.policy.learner_normalizes:  # replay holds raw observations: normalise with today's statistics
                m = self.policy
                batch = batch._replace(obs=m.network_inputs(batch.obs), next_obs=m.network_inputs(batch.next_obs))
            if self.return_norm is not None or c.reward_scale != 1:  # replay holds raw rewards (n-step sums
                batch = batch._replace(rewards=self.normalized_rewards(batch.rewards * c.reward_scale))  # of them)
            metrics, td = self.update_batch(batch)
            if td is not None:
                self.replay.update_priorities(shard, batch.indices, td.cpu().numpy())
            self.updates += 1
            stats.append(metrics)
        self.set_exploration(env_steps)
        out = {"learner/updates": float(self.updates), "learner/updates_this_call": float(len(stats)),
               **{column: rate * factor for column, rate in self.lr_columns.items()}}
        if stats:
            out.update({k: torch.stack([s[k] for s in stats]).mean() for k in stats[0]})
        return read_metrics(out)

    @functools.cached_property
    def lr_columns(self) -> dict[str, float]:
        """progress.csv's learning-rate columns and their rates before the schedule: lr's where some
        network learns at it (not when each has a rate of its own), and each own rate given."""
        c = self.config
        at_lr = any(g.get("lr_setting", "lr") == "lr" or getattr(c, g["lr_setting"]) is None
                    for o in self.optimizers() for g in o.param_groups)
        return {**({"learner/lr": c.lr} if at_lr else {}),
                **{f"learner/{k}": getattr(c, k) for k in OWN_LRS if getattr(c, k, None) is not None}}

    def learn(self, rollouts: list[Rollout]) -> dict[str, float]:
        self.merge_obs_stats(rollouts)
        self.merge_return_stats(rollouts)
        for r in rollouts:
            self.replay.add_rollout(r)
        return self._train(self.env_steps + sum(r.env_steps for r in rollouts), None)

    def train_for(self, max_updates: int | None, env_steps: int, summaries: list[Any] = ()) -> UpdateResult:
        """Ape-X's learner step: up to ``max_updates`` updates (None: while the shards allow),
        then publish, unless nothing changed (no update, the same exploration buffers, the same
        normaliser): runners then keep the weights they hold instead of fetching the same ones as
        a new version. ``summaries``: the runners' rollouts since the last call
        (:class:`shoal.runner.RolloutSummary`), whose statistics the normalisers merge."""
        self.env_steps = env_steps
        exploration = [b.clone() for b in self.policy.buffers()]
        self.merge_obs_stats(summaries)
        self.merge_return_stats(summaries)
        metrics = self._train(env_steps, max_updates)
        check_losses(metrics, self.version + 1, env_steps, self.config)
        self.report_cpu_wait(metrics)
        if metrics["learner/updates_this_call"] == 0 and max_updates is not None:
            time.sleep(0.01)  # the shards cannot give a batch yet: let the runners fill them
        if metrics["learner/updates_this_call"] or not all(map(torch.equal, exploration, self.policy.buffers())):
            self.version += 1
            self.publish()
        return UpdateResult(metrics, self.version, 0, [], [])

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state["updates"], state["replay_loaded"] = self.updates, self.replay_loaded
        state["replay"] = self.replay.get_state() if self.config.save_replay else None
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        self.updates, self.replay_loaded = state["updates"], state.get("replay_loaded", 0)
        saved = state.get("replay")
        if saved is not None and replay_fits(saved, self.config):
            self.replay.set_state(saved)
        else:  # learning waits for the buffer to refill: with the transitions saved, if any
            self.replay.forget_counts()
            if saved is not None:  # from a replay of another size (--buffer-size, --num-replay-shards)
                self.replay.load(saved, self.config.priority_alpha)
        super().set_state(state)  # the exploration buffers come back with the policy weights
        if self.graphed is not None:  # Adam's state tensors were replaced: the graph is recorded again
            self.graphed.reset()


def target_copy(module: nn.Module) -> nn.Module:
    """A frozen copy of ``module`` for bootstrapped targets."""
    target = copy.deepcopy(module)
    target.requires_grad_(False)
    return target
