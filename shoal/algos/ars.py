"""Augmented Random Search (Mania, Guy and Recht 2018, ARS V2-t), as sb3-contrib's ARS.

No gradients: every iteration the learner draws ``n_delta`` random directions d_k in weight
space, and the runners play whole episodes with the weights w + delta_std * d_k and w -
delta_std * d_k (2 * n_delta candidates, ``n_eval_episodes`` episodes each). The learner keeps
the ``n_top`` directions whose better candidate scored highest and steps

    w += lr / (n_top * std(their returns)) * sum_k (r_k+ - r_k-) d_k

Observations are normalised by the running statistics of every state the candidates visited
(V2), fixed within an iteration. The policy is linear (sb3-contrib's LinearPolicy: no bias, its
output clipped to the action bounds) or an MLP (MlpPolicy: tanh-squashed to the bounds).

The directions never travel: the learner publishes the weights and a seed (a buffer of the
policy), and each runner draws the same directions from it and plays its share of the
candidates (candidate c on runner c % num_env_runners), handing candidates to its envs as they
finish episodes. On the ray backend the runners evaluate in parallel, as ARS's paper did.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from shoal.algos import AlgoSpec, register
from shoal.config import Config, _check
from shoal.errors import ShoalError
from shoal.learner import Learner
from shoal.policy import Moments, PolicyModule
from shoal.runner import EnvRunner, final_info_value


@dataclass(frozen=True)
class ARSConfig(Config):
    """ARS: random search in weight space, with sb3-contrib's settings and names."""

    algo: ClassVar[str] = "ars"

    n_delta: int = 8
    """Random directions per iteration (each gives two candidates, + and -)."""
    n_top: int | None = None
    """The best directions the update uses (None: all n_delta)."""
    lr: float = 0.02
    """Step size (sb3-contrib's learning_rate)."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """`linear` decays the step size to 0 at total_steps (sb3-contrib's learning_rate as a
    schedule; rl-zoo's lin_), as every other algorithm's lr_schedule."""
    delta_std: float = 0.05
    """Standard deviation of the exploration noise added to the weights."""
    delta_std_schedule: Literal["constant", "linear"] = "constant"
    """`linear` decays the exploration noise to 0 at total_steps (sb3-contrib's delta_std as a
    schedule): the search narrows as the run ends. The learner sets each iteration's noise and
    publishes it with the weights, so every runner explores with the same."""
    zero_policy: bool = True
    """Start from all-zero weights (the paper's linear policies do)."""
    alive_bonus_offset: float = 0.0
    """Added to every step's reward when scoring candidates, to cancel an alive bonus (-1 on
    Hopper, Walker2d and Ant in the paper); the episode returns logged are the env's own."""
    n_eval_episodes: int = 1
    """Episodes each candidate plays per iteration; its score is their mean."""
    policy: Literal["linear", "mlp"] = "linear"
    """linear: actions = W s, clipped to the bounds (argmax for discrete actions); mlp: an MLP of
    hidden_sizes and activation, tanh-squashed to the bounds (sb3-contrib's MlpPolicy)."""
    activation: Literal["tanh", "relu"] = "relu"
    """The mlp policy's hidden activation (ReLU, as sb3-contrib's)."""
    normalize_obs: bool = True
    """Normalise observations by the running mean and std of the states visited (ARS V2)."""
    max_episode_steps: int = 10_000
    """An iteration's episodes end here if the env has not ended them (scored as they stand)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.n_delta >= 1, "n_delta must be at least 1")
        _check(self.n_top is None or 1 <= self.n_top <= self.n_delta,
               f"n_top must be from 1 to n_delta ({self.n_delta}), or None for all of them")
        _check(self.lr > 0 and self.delta_std > 0, "lr and delta_std must be positive")
        _check(self.n_eval_episodes >= 1, "n_eval_episodes must be at least 1")
        _check(self.max_episode_steps >= 1, "max_episode_steps must be at least 1")
        _check(self.num_env_runners <= 2 * self.n_delta, f"num_env_runners {self.num_env_runners} is more than the "
               f"{2 * self.n_delta} candidates of n_delta {self.n_delta} directions: some runners would play none")
        _check(not self.clip_rewards, "ars scores each candidate by its episodes' returns: clip_rewards (the "
               "rewards' signs, for learners that fit values to them) does not apply")
        _check(self.encoder is None, f"--encoder {self.encoder}: ars searches the weights of its own linear or mlp "
               "policy (--policy); your own encoder trains with ppo, a2c, trpo, impala, appo, dqn, qrdqn, sac, tqc, "
               "td3 or ddpg")
        _check(self.inference == "local", "ars runners play each candidate with its own weights: --inference central "
               "(one policy for every runner) does not apply")

    @property
    def top(self) -> int:
        return self.n_top or self.n_delta

    @property
    def steps_per_rollout(self) -> int:
        """The most steps a runner's iteration takes (its candidates' episodes end sooner)."""
        return self.max_episode_steps


class ARSPolicy(PolicyModule):
    """A deterministic policy whose weights are searched; it also acts with a different weight
    vector per row (:meth:`population_act`), which is how a runner plays many candidates at once."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hidden_sizes: tuple[int, ...],
                 activation: str, normalize_obs: bool, delta_std: float = 0.05):
        super().__init__(obs_space, action_space, normalize_obs=normalize_obs)
        sizes = [self.feature_dim, *hidden_sizes, self.action_dim]
        bias = bool(hidden_sizes)  # sb3-contrib's LinearPolicy has none, its MlpPolicy has
        self.layers = nn.ModuleList(nn.Linear(i, o, bias=bias) for i, o in zip(sizes[:-1], sizes[1:]))
        self.activation = {"tanh": torch.tanh, "relu": torch.relu}[activation]
        self.squash = bool(hidden_sizes) and not self.discrete
        if self.squash and not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise ShoalError(f"action space {action_space} has infinite bounds: the mlp policy scales its actions "
                             "to the bounds; train the linear policy (--policy linear), whose actions are clipped")
        self.num_params = sum(p.numel() for p in self.layers.parameters())
        # the seed of this iteration's directions and their scale (delta_std, as scheduled): the
        # learner sets both, runners draw the directions from them
        self.register_buffer("noise_seed", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("noise_std", torch.tensor(delta_std, dtype=torch.float64))
        self.register_load_state_dict_pre_hook(_noise_std_as_configured)

    def flat(self) -> Tensor:
        """The searched weights as one vector [num_params]."""
        return nn.utils.parameters_to_vector(self.layers.parameters()).detach()

    def load_flat(self, weights: Tensor) -> None:
        nn.utils.vector_to_parameters(weights.to(self.noise_seed.device), self.layers.parameters())

    def directions(self, n: int) -> Tensor:
        """This iteration's ``n`` directions [n, num_params], standard normal, drawn on the CPU
        from ``noise_seed`` (the same on the learner and every runner)."""
        g = torch.Generator().manual_seed(int(self.noise_seed))
        return torch.randn(n, self.num_params, generator=g).to(self.noise_seed.device)

    def forward(self, x: Tensor) -> Tensor:
        h = self.encoder(x)
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = self.activation(h)
        return h

    def population_act(self, x: Tensor, weights: Tensor) -> Tensor:
        """Actions for inputs ``x`` [E, ...], row e acting with the weight vector ``weights[e]``
        [E, num_params] (laid out as :meth:`flat`): one batched matrix product per layer."""
        h, at = self.encoder(x).unsqueeze(1), 0
        for i, layer in enumerate(self.layers):
            n_out, n_in = layer.out_features, layer.in_features
            w = weights[:, at:at + n_out * n_in].view(-1, n_out, n_in)
            at += n_out * n_in
            h = torch.bmm(h, w.transpose(1, 2))
            if layer.bias is not None:
                h = h + weights[:, at:at + n_out].unsqueeze(1)
                at += n_out
            if i < len(self.layers) - 1:
                h = self.activation(h)
        return self._actions(h.squeeze(1))

    def _actions(self, out: Tensor) -> Tensor:
        if self.discrete:
            return out.argmax(-1)
        return torch.tanh(out) if self.squash else out

    def act(self, x: Tensor, deterministic: bool, generator: torch.Generator | None = None) -> Tensor:
        return self._actions(self(x))  # deterministic either way: ARS's exploration is in the weights

    def explore(self, x: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        return self.act(x, True), x.new_zeros(x.shape[0])

    def env_actions(self, actions: Tensor) -> Tensor:
        if self.squash:  # [-1, 1] -> the bounds
            low, high = self.action_low.reshape(-1), self.action_high.reshape(-1)
            actions = low + (actions + 1) * 0.5 * (high - low)
        return super().env_actions(actions)


def _noise_std_as_configured(module: ARSPolicy, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """A checkpoint written before delta_std could be scheduled holds no ``noise_std``: its
    runs explored with the configured delta_std, which the module already holds."""
    state_dict.setdefault(prefix + "noise_std", module.noise_std.clone())


def make_policy(config: ARSConfig, obs_space, action_space) -> ARSPolicy:
    hidden = tuple(config.hidden_sizes) if config.policy == "mlp" else ()
    return ARSPolicy(obs_space, action_space, hidden, config.activation, config.normalize_obs, config.delta_std)


@dataclass
class CandidateEpisodes:
    """What a runner's iteration gives the learner: the episodes its candidates played."""

    candidates: np.ndarray  # [K] candidate of each episode: direction k is + as k, - as n_delta + k
    returns: np.ndarray  # [K] the env's returns
    lengths: np.ndarray  # [K]
    env_steps: int  # every env step the runner took (its idle envs' too)
    policy_version: int
    runner_id: int
    obs_moments: Moments | None
    episode_infos: dict[str, list[float]]

    @property
    def episode_returns(self) -> list[float]:
        return self.returns.tolist()

    @property
    def episode_lengths(self) -> list[int]:
        return self.lengths.tolist()


class ARSRunner(EnvRunner):
    """Plays this runner's share of the candidates, one whole episode each per evaluation; an env
    whose episode ends takes the next candidate still to play (same-step autoreset: the next
    episode starts there). Each iteration starts every env on a fresh episode, each from its own
    random stream (seeded once, when the runner is made; saved in checkpoints with the envs, so a
    resumed run plays the same episodes). Reseeding the envs every iteration instead (seed s for
    env 0, s + 1 for env 1, ...) learned Swimmer-v5 worse: 0 of 9 seeds past 150 in 40
    iterations, against 3 of 9 this way (BENCHMARKS.md)."""

    def __init__(self, config: ARSConfig, runner_id: int, *args: Any, **kwargs: Any):
        jobs = len(range(runner_id, 2 * config.n_delta, config.num_env_runners)) * config.n_eval_episodes
        if config.num_envs_per_runner > jobs:  # envs beyond its candidates would only wait
            config = dataclasses.replace(config, num_envs_per_runner=jobs)
        super().__init__(config, runner_id, *args, **kwargs)

    def sample(self, num_steps: int) -> CandidateEpisodes:
        self.sync_weights()
        c, m, env, B = self.config, self.policy, self.env, self.env.num_envs
        n = c.n_delta
        mine = [k for k in range(2 * n) if k % c.num_env_runners == self.runner_id]
        queue = [k for _ in range(c.n_eval_episodes) for k in mine]
        base = m.flat()
        d = m.directions(n) * float(m.noise_std)
        candidates = torch.cat([base + d, base - d])  # [2n, P]
        self.obs, _ = env.reset()
        playing = np.full(B, -1)  # each env's candidate; -1: idle
        weights = base.repeat(B, 1)  # idle envs act with the base weights (their steps are not scored)
        nxt = 0
        for b in range(min(B, len(queue))):
            playing[b], weights[b] = queue[nxt], candidates[queue[nxt]]
            nxt += 1
        ep_return, ep_length = np.zeros(B), np.zeros(B, np.int64)
        done_k, done_r, done_l = [], [], []
        infos: dict[str, list[float]] = {key: [] for key in c.episode_info}
        raw = []
        steps = 0
        while (playing >= 0).any() and steps < num_steps:
            active = playing >= 0
            if m.obs_norm is not None:
                raw.append(self.obs.reshape(B, -1)[active])
            a = m.population_act(m.normalize(self._upload(self.obs)), weights)
            self.obs, r, term, trunc, info = env.step(m.to_env(a))
            steps += 1
            if not np.isfinite(r).all() or not np.isfinite(self.obs).all():
                self._non_finite(r, self.obs)
            ep_return += r
            ep_length += 1
            done = term | trunc
            errors = info.get("_env_error")
            for b in np.flatnonzero(done & active):
                if errors is not None and errors[b]:  # the env failed: play its candidate again
                    self.dropped_episodes += 1
                    queue.append(int(playing[b]))
                else:
                    done_k.append(int(playing[b]))
                    done_r.append(float(ep_return[b]))
                    done_l.append(int(ep_length[b]))
                    for key, values in infos.items():
                        if (value := final_info_value(info, key, b)) is not None:
                            values.append(value)
                if nxt < len(queue):
                    playing[b], weights[b] = queue[nxt], candidates[queue[nxt]]
                    nxt += 1
                else:
                    playing[b], weights[b] = -1, base
            if errors is not None:
                self._check_env_restarts()
            ep_return[done], ep_length[done] = 0.0, 0
        for b in np.flatnonzero(playing >= 0):  # cut at max_episode_steps: scored as they stand
            done_k.append(int(playing[b]))
            done_r.append(float(ep_return[b]))
            done_l.append(int(ep_length[b]))
        moments = Moments.of(np.concatenate(raw)) if raw else None
        return CandidateEpisodes(np.asarray(done_k, np.int64), np.asarray(done_r), np.asarray(done_l, np.int64),
                                 steps * B, self.version, self.runner_id, moments, infos)


class ARSLearner(Learner):
    """Scores each direction by its candidates' mean returns and steps the weights along the best."""

    EXTRA_NETWORKS = False

    def __init__(self, config: ARSConfig, obs_space, action_space, store, policy_id: str = "default"):
        super().__init__(config, obs_space, action_space, store, policy_id)
        if config.zero_policy:
            self.policy.load_flat(torch.zeros(self.policy.num_params))
        self.draw_directions()

    def draw_directions(self, env_steps: int = 0) -> None:
        """The next iteration's directions: a new seed, and delta_std as scheduled after
        ``env_steps`` env steps."""
        c = self.config
        self.policy.noise_seed.fill_(int(self.rng.integers(2**62)))
        self.policy.noise_std.fill_(c.delta_std * (self.remaining(env_steps) if c.delta_std_schedule == "linear"
                                                   else 1.0))

    def learn(self, rollouts: list[CandidateEpisodes]) -> dict[str, float]:
        c, m, n = self.config, self.policy, self.config.n_delta
        total, count = np.zeros(2 * n), np.zeros(2 * n)
        for r in rollouts:
            np.add.at(total, r.candidates, r.returns + c.alive_bonus_offset * r.lengths)
            np.add.at(count, r.candidates, 1)
        scored = (count[:n] > 0) & (count[n:] > 0)  # a failed runner's directions are left out
        score = total / np.maximum(count, 1)
        plus, minus = score[:n], score[n:]
        best = np.maximum(plus, minus)
        top = [k for k in np.argsort(-best, kind="stable") if scored[k]][:c.top]
        lr = c.lr * (self.remaining() if c.lr_schedule == "linear" else 1.0)
        metrics = {"ars/directions_scored": float(scored.sum()), "learner/lr": lr,
                   "ars/delta_std": float(m.noise_std)}
        if top:
            std = float(np.concatenate([plus[top], minus[top]]).std(ddof=1))
            step = lr / (len(top) * std + 1e-6)
            d = m.directions(n)[top]
            diff = torch.as_tensor(plus[top] - minus[top], dtype=d.dtype, device=d.device)
            m.load_flat(m.flat() + step * (diff @ d))
            metrics.update({"ars/return_std": std, "ars/step_size": step, "ars/top_return": float(best[top[0]])})
        self.merge_obs_stats(rollouts)
        self.draw_directions(self.env_steps + sum(r.env_steps for r in rollouts))
        return metrics

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """None: the weights, the normaliser and the directions' seed are all the policy's."""

    def load_extra_networks(self, extra: dict[str, Any]) -> None:
        """None (see EXTRA_NETWORKS)."""


register(AlgoSpec("ars", ARSConfig, ARSLearner, make_policy, "sync",
                  "Augmented Random Search: random search over linear or MLP policies, discrete and continuous actions",
                  runner_cls=ARSRunner))
