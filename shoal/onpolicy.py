"""What the on-policy algorithms share: settings, batch assembly and value bootstrapping.

PPO, A2C and TRPO estimate advantages with GAE on synchronous batches; IMPALA and APPO correct
for stale behaviour policies with V-trace and run on the asynchronous loop (``loop="async"``):
on the ray backend, runners sample without waiting for the learner, and trajectories reach it
through a bounded queue tagged with the policy version that produced them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from shoal import devices
from shoal.config import Config, _check, check_sde
from shoal.learner import Learner, clip_grad_norm, read_metrics
from shoal.policy import ActorCritic, EncoderSpec, eval_mode
from shoal.returns import gae, next_values, vtrace
from shoal.runner import Rollout


@dataclass(frozen=True)
class OnPolicyConfig(Config):
    """Settings of every actor-critic algorithm that learns from its own recent rollouts."""

    rollout_steps: int = 128
    """Steps each env takes per rollout (n_steps)."""
    lr: float = 3e-4
    """Learning rate."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """`linear` decays the learning rate to 0 at total_steps."""
    optimizer_eps: float = 1e-5
    """The optimizer's epsilon, added to the root of its squared-gradient average (Adam's; A2C's
    RMSprop's too): 1e-5, as stable-baselines3's."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (V-trace's lambda for IMPALA/APPO): bias/variance trade-off of the advantage."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this."""
    normalize_advantages: bool = True
    """Standardise advantages (per minibatch, or per batch where there are no minibatches)."""
    normalize_obs: bool = False
    """Normalise observations by a running mean/std (kept in the policy and its checkpoints)."""
    reward_scale: float = 1.0
    """Multiply rewards by this before computing returns (keeps value targets near unit scale); the
    returns shoal reports stay the env's own."""
    normalize_rewards: bool = False
    """Divide the rewards the learner sees by a running std of the discounted return, clipped to
    +-10 (stable-baselines3's VecNormalize norm_reward; kept in checkpoints). The returns shoal
    reports stay the env's own."""
    critic_hidden_sizes: tuple[int, ...] | None = None
    """Hidden layer widths of the value network (the critic), where they differ from the policy's
    (unset: hidden_sizes for both; SB3's net_arch=dict(pi=..., vf=...)). With shoal's convolutional
    encoder both networks are linear heads on its features, and neither setting applies."""
    log_std_init: float = 0.0
    """Initial log standard deviation of continuous actions (with use_sde, of the noise matrix's entries)."""
    use_sde: bool = False
    """Generalized State-Dependent Exploration (gSDE, Raffin et al. 2021; SB3's use_sde), continuous
    actions: the exploration noise is the actor's last hidden features times a random matrix each
    env holds for a rollout (or sde_sample_freq steps), so consecutive actions explore smoothly."""
    sde_sample_freq: int = -1
    """With use_sde: steps between fresh noise matrices in the runners (-1: one per rollout)."""
    ortho_init: bool = True
    """Orthogonal initialisation of the layers (hidden gain sqrt(2), actor 0.01, critic 1), as PPO's
    baselines; off: torch's default (SB3's ortho_init=False, which rl-zoo's gSDE settings use)."""
    share_encoder: bool = True
    """The actor and the critic share the encoder of images (or of --encoder), which the value
    loss trains too (TRPO's: the policy step alone); off: the critic has one of its own, which the
    value loss trains (SB3's share_features_extractor=False), at a second encoder pass per learner
    sample. For images or --encoder only."""
    lstm_size: int = 0
    """Units of an LSTM between the encoder and the actor and critic MLPs, which then remember
    across an episode's steps (0: a feed-forward policy). ppo, a2c, impala and appo; each env's
    rollout trains as one sequence, so a minibatch is minibatch_size // rollout_steps envs' rollouts."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.rollout_steps >= 1, "rollout_steps must be at least 1")
        _check(self.lstm_size >= 0, "lstm_size must be 0 (no LSTM) or a number of units")
        _check(0 < self.lr < math.inf, "lr must be positive and finite")
        _check(0 < self.optimizer_eps < math.inf, "optimizer_eps must be positive and finite")
        _check(0 < self.reward_scale < math.inf, "reward_scale must be positive and finite")
        _check(0 < self.gamma <= 1, "gamma must be in (0, 1]")
        _check(0 <= self.gae_lambda <= 1, "gae_lambda must be in [0, 1]")
        _check(self.max_grad_norm > 0, "max_grad_norm must be positive")
        _check(self.vf_coef >= 0, "vf_coef must be 0 or more (a negative weight would grow the value error)")
        check_sde(self)

    @property
    def batch_size(self) -> int:
        """Samples per synchronous iteration, across runners."""
        return self.rollout_steps * self.num_envs

    @property
    def steps_per_rollout(self) -> int:
        """What runners are asked for (the off-policy configs resolve a 0 here)."""
        return self.rollout_steps


def make_actor_critic(config: OnPolicyConfig, obs_space, action_space) -> ActorCritic:
    """The actor-critic network every on-policy algorithm trains."""
    return ActorCritic(obs_space, action_space, config.hidden_sizes, config.activation,
                       config.normalize_obs, config.log_std_init, images=True, lstm_size=config.lstm_size,
                       sde=config.sde_sample_freq if config.use_sde else None, ortho_init=config.ortho_init,
                       encoder=EncoderSpec.of(config), share_encoder=config.share_encoder,
                       critic_hidden_sizes=config.critic_hidden_sizes)


def episode_segments(done: np.ndarray, final_rows: np.ndarray | None = None,
                     last_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Lay B envs' T-step sequences (step (t, b) is row t * B + b; ``done`` [T, B] where an
    episode ended) out as the episode segments a recurrent network steps through: [L, S] rows,
    -1 past a segment's end, and for each segment the env whose memory at step 0 it starts from
    (-1: a new episode's zero memory). ``final_rows`` [T, B] (-1 where none) puts the row of an
    episode's final observation right after its last step, and ``last_rows`` [B] the row of each
    env's observation after the last step at the end of its sequence (alone, after a done)."""
    T, B = done.shape
    segments, first = [], []
    for b in range(B):
        start = 0
        for t in np.flatnonzero(done[:, b]):
            rows = np.arange(start, t + 1) * B + b
            segments.append(rows if final_rows is None else np.append(rows, final_rows[t, b]))
            first.append(b if start == 0 else -1)
            start = t + 1
        rows = np.arange(start, T) * B + b
        if last_rows is not None:
            rows = np.append(rows, last_rows[b])
        if len(rows):
            segments.append(rows)
            first.append(b if start == 0 else -1)
    out = np.full((max(map(len, segments)), len(segments)), -1)
    for s, rows in enumerate(segments):
        out[: len(rows), s] = rows
    return out, np.asarray(first)


def segment_memory(memory: tuple[Tensor, Tensor], first: np.ndarray) -> tuple[Tensor, Tensor]:
    """Each segment's starting memory [S, width]: its env's (``first``), or zeros (-1)."""
    keep = devices.upload(first >= 0, memory[0].device).to(memory[0].dtype)[:, None]
    rows = devices.upload(np.maximum(first, 0), memory[0].device)
    return memory[0][rows] * keep, memory[1][rows] * keep


def feed_forward_only(config: OnPolicyConfig) -> None:
    """Refuse ``lstm_size`` for an algorithm that trains feed-forward policies only."""
    _check(config.lstm_size == 0, f"{config.algo} trains feed-forward policies only: recurrent ones "
           "(lstm_size) train with ppo, a2c, impala or appo")


class OnPolicyLearner(Learner):
    """Batch assembly for rollouts laid side by side: [T, sum of runners' envs]."""

    config: OnPolicyConfig
    policy: ActorCritic
    optimizer: torch.optim.Optimizer  # each algorithm's (TRPO's: the value function's)

    def learner_rewards(self, rollouts: list[Rollout]) -> Tensor:
        """The rewards [T, B] the losses use: scaled, and with normalize_rewards divided by the
        running std of the discounted return (its statistics first updated with these rollouts')."""
        rewards = self.tensor(np.concatenate([r.rewards for r in rollouts], axis=1)) * self.config.reward_scale
        self.merge_return_stats(rollouts)
        return self.normalized_rewards(rewards)

    def extra_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    EXTRA_NETWORKS = False  # the policy holds the value function too

    def load_extra_networks(self, extra: dict[str, Any]) -> None:
        """None (see EXTRA_NETWORKS)."""

    def stack(self, rollouts: list[Rollout]) -> dict[str, Tensor]:
        """The rollouts side by side, with V(s_t) [T, B] and V(s_{t+1}) [T, B] from the current
        critic (0 after termination; the true final observation's value after truncation), in eval
        mode as the runners act (SB3 computes them in its rollouts)."""
        m = self.policy
        host = lambda name: np.concatenate([getattr(r, name) for r in rollouts], axis=1)  # noqa: E731
        obs, actions, logp = self.tensor(host("obs")), self.tensor(host("actions")), self.tensor(host("logp"))
        rewards = self.learner_rewards(rollouts)
        ended = host("terminated"), host("truncated")
        terminated, truncated = map(self.tensor, ended)
        T, B = rewards.shape
        offsets = np.cumsum([0] + [r.rewards.shape[1] for r in rollouts[:-1]])
        final_idx = np.concatenate([r.final_idx + [0, off] for r, off in zip(rollouts, offsets)]).reshape(-1, 2)
        last_obs = self.tensor(np.concatenate([r.last_obs for r in rollouts]))
        final_obs = self.tensor(np.concatenate([r.final_obs for r in rollouts]))
        done = terminated | truncated
        seq = {}
        if m.recurrent:
            ends = ended[0] | ended[1]  # on the host: the sequences are laid out by it
            with eval_mode(m):
                values, last_value, final_value, seq = self.recurrent_values(rollouts, obs, ends, last_obs,
                                                                             final_obs, final_idx)
        else:
            with torch.no_grad(), eval_mode(m):  # one forward for every value the estimators need
                v = m.value(torch.cat([obs.reshape(T * B, *obs.shape[2:]), last_obs, final_obs]))
            values, last_value, final_value = v[: T * B].reshape(T, B), v[T * B: T * B + B], v[T * B + B:]
        return {"obs": obs, "actions": actions, "logp": logp, "rewards": rewards, "values": values,
                "next_values": next_values(values, last_value, final_value, self.tensor(final_idx), terminated,
                                           truncated),
                "done": done, **seq}

    @torch.no_grad()
    def recurrent_values(self, rollouts: list[Rollout], obs: Tensor, ends: np.ndarray, last_obs: Tensor,
                         final_obs: Tensor, final_idx: np.ndarray) -> tuple[Tensor, Tensor, Tensor, dict[str, Any]]:
        """A recurrent critic's V(s_t) [T, B], its values of the last observations [B] and of
        episodes' final observations [K], each seen with the memory of the steps before it (one
        pass: a final observation follows its episode's last step, a last one its env's
        sequence; ``ends`` [T, B], NumPy: where episodes ended); and what minibatches replay: the
        memory (h, c) [B, 2 * lstm_size] each env's sequence began with, and ``ends``."""
        m = self.policy
        T, B = ends.shape
        K = len(final_idx)
        memory = tuple(self.tensor(np.concatenate([r.memory[i] for r in rollouts])) for i in (0, 1))
        final_rows = np.full((T, B), -1)
        final_rows[final_idx[:, 0], final_idx[:, 1]] = T * B + np.arange(K)
        segments, first = episode_segments(ends, final_rows, T * B + K + np.arange(B))
        f = m.encode(torch.cat([obs.reshape(T * B, *obs.shape[2:]), final_obs, last_obs]))
        v = m.critic_value(m.unroll(f, segments, segment_memory(memory, first)))
        return v[: T * B].reshape(T, B), v[T * B + K:], v[T * B: T * B + K], {"memory": memory, "ends": ends}

    def gae_batch(self, rollouts: list[Rollout]) -> dict[str, Tensor]:
        """Flattened [N] samples with GAE advantages and returns."""
        c = self.config
        s = self.stack(rollouts)
        adv, ret = gae(s["rewards"], s["values"], s["next_values"], s["done"], c.gamma, c.gae_lambda)
        T, B = adv.shape
        flat = lambda x: x.reshape(T * B, *x.shape[2:])
        seq = {"ends": s["ends"], "memory": s["memory"]} if "memory" in s else {}
        return {"obs": flat(s["obs"]), "actions": flat(s["actions"]), "logp": flat(s["logp"]),
                "adv": flat(adv), "ret": flat(ret), "values": flat(s["values"]), **seq}

    def minibatches(self, batch: dict[str, Tensor], size: int) -> list[tuple[Tensor, np.ndarray | None]]:
        """One epoch's minibatches of a :meth:`gae_batch`, in a fresh random order: the indices of
        their flat [T * B] samples, ``size`` each, and None; for a recurrent policy, whole
        sequences (each env's T steps, time-major; size // T envs, at least one), and those envs
        in a NumPy array, for :meth:`evaluate` to lay their episodes out without reading the
        indices back from the device."""
        if "memory" not in batch:
            perm = self.tensor(self.rng.permutation(len(batch["adv"])))
            return [(perm[start: start + size], None) for start in range(0, len(perm), size)]
        T, B = batch["ends"].shape
        order, k = self.rng.permutation(B), max(1, size // T)
        envs, steps = self.tensor(order), torch.arange(T, device=self.device)[:, None] * B
        return [((steps + envs[start: start + k]).reshape(-1), order[start: start + k]) for start in range(0, B, k)]

    def evaluate(self, batch: dict[str, Tensor], idx: Tensor | None = None,
                 envs: np.ndarray | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probabilities, entropies and values [N] of the current network for the samples
        ``idx`` of a :meth:`gae_batch` (all of them for None); a recurrent network replays the
        sequences of :meth:`minibatches`' ``envs`` (all, in order, for None) from their first memory."""
        m = self.policy
        if "memory" not in batch:
            return m.evaluate(*((batch["obs"], batch["actions"]) if idx is None else
                                (batch["obs"][idx], batch["actions"][idx])))
        if idx is None:
            idx, envs = torch.arange(len(batch["obs"]), device=self.device), np.arange(batch["ends"].shape[1])
        segments, first = episode_segments(batch["ends"][:, envs])
        memory = tuple(x[idx[: len(envs)]] for x in batch["memory"])  # the first step's indices are the envs
        obs = batch["obs"][idx]
        h = m.unroll(m.encode(obs), segments, segment_memory(memory, first))
        return m.heads(h, batch["actions"][idx], m.legal(obs))


@dataclass(frozen=True)
class AsyncConfig(OnPolicyConfig):
    """Settings of the asynchronous, V-trace-corrected algorithms (IMPALA, APPO)."""

    gae_lambda: float = 1.0
    """V-trace's lambda: 1.0 is the paper's V-trace; lower mixes in shorter returns."""
    vtrace_rho_bar: float = 1.0
    """Clip of the importance weights in the value targets and advantages (rho bar)."""
    vtrace_c_bar: float = 1.0
    """Clip of the trace-cutting importance weights (c bar)."""
    max_policy_lag: int | None = None
    """Drop (and count) trajectories from a policy more than this many versions behind the
    learner's (None: keep all)."""
    num_epochs: int = 1
    """Passes over each batch."""
    minibatch_size: int = 0
    """Samples per gradient step (0: the whole batch, one step per epoch)."""
    learner_queue_size: int = 0
    """Finished rollouts that may wait for the learner before runners pause (0: 2 per runner)."""
    rollouts_per_update: int = 0
    """Rollouts the learner takes from its queue per update, at most (0: one per runner)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.vtrace_rho_bar > 0 and self.vtrace_c_bar > 0, "vtrace_rho_bar and vtrace_c_bar must be positive")
        _check(self.max_policy_lag is None or self.max_policy_lag >= 0, "max_policy_lag must be >= 0 or None")
        _check(self.num_epochs >= 1, "num_epochs must be at least 1")
        _check(self.minibatch_size >= 0, "minibatch_size must be >= 0 (0: the whole batch)")
        _check(self.learner_queue_size >= 0, "learner_queue_size must be >= 0 (0: 2 per runner)")
        _check(self.rollouts_per_update >= 0, "rollouts_per_update must be >= 0 (0: one per runner)")

    @property
    def queue_size(self) -> int:
        """Bound of the learner's queue, in rollouts."""
        return self.learner_queue_size or 2 * self.num_env_runners

    @property
    def batch_rollouts(self) -> int:
        """Rollouts per learner update, at most."""
        return self.rollouts_per_update or self.num_env_runners


class VTraceLearner(OnPolicyLearner):
    """Learns from batches corrected with V-trace towards the learner's current policy: value
    regression to the V-trace targets, an entropy bonus and the algorithm's policy loss."""

    config: AsyncConfig

    def __init__(self, config: AsyncConfig, obs_space, action_space, store, policy_id: str = "default"):
        super().__init__(config, obs_space, action_space, store, policy_id)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr, eps=config.optimizer_eps, fused=True)

    def policy_loss(self, logp: Tensor, old_logp: Tensor, adv: Tensor) -> Tensor:
        """The loss to minimise for log-probabilities ``logp`` [N] of the network being trained,
        ``old_logp`` [N] of the learner's policy before this update, V-trace advantages [N]."""
        raise NotImplementedError

    def learn(self, rollouts: list[Rollout]) -> dict[str, float]:
        c, m = self.config, self.policy
        lr = self.scheduled_lr(self.optimizer)
        b = self.vtrace_batch(rollouts)
        size = c.minibatch_size or len(b["adv"])
        stats = []  # per step: policy loss, value loss, entropy
        for _ in range(c.num_epochs):
            for idx, envs in self.minibatches(b, size):
                adv = b["adv"][idx]
                if c.normalize_advantages and len(idx) > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                logp, entropy, value = self.evaluate(b, idx, envs)
                entropy = entropy.mean()
                pg = self.policy_loss(logp, b["logp"][idx], adv)
                vl = 0.5 * (value - b["vs"][idx]).pow(2).mean()
                loss = pg + c.vf_coef * vl - c.ent_coef * entropy
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                clip_grad_norm(m.parameters(), c.max_grad_norm)
                self.optimizer.step()
                stats.append(torch.stack([pg.detach(), vl.detach(), entropy.detach()]))
        self.merge_obs_stats(rollouts)
        pg_mean, vl_mean, ent_mean = torch.stack(stats).mean(0)
        rho = (b["logp"] - b["behaviour_logp"]).exp()
        return read_metrics({"loss/policy": pg_mean, "loss/value": vl_mean, "loss/entropy": ent_mean, "learner/lr": lr,
                             "learner/importance_ratio_mean": rho.mean(),
                             "learner/importance_ratio_clipped": (rho > c.vtrace_rho_bar).float().mean(),
                             "learner/explained_variance": explained_variance(b["values"], b["vs"])})

    def vtrace_batch(self, rollouts: list[Rollout]) -> dict[str, Tensor]:
        """Flattened [N] samples with V-trace value targets ``vs``, advantages ``adv`` and the
        learner's log-probabilities ``logp`` (the behaviour policy's are ``behaviour_logp``); for a
        recurrent policy, what :meth:`minibatches` and :meth:`evaluate` replay sequences from (the
        learner's log-probabilities come from its network replaying the runner's sequences, from
        the memory the runner began them with)."""
        c, m = self.config, self.policy
        s = self.stack(rollouts)
        T, B = s["rewards"].shape
        flat = lambda x: x.reshape(T * B, *x.shape[2:])
        obs, actions = flat(s["obs"]), flat(s["actions"])
        seq = {"ends": s["ends"], "memory": s["memory"]} if "memory" in s else {}
        with torch.no_grad(), eval_mode(m):  # the target policy, as the runners act
            if seq:
                target_logp = self.evaluate({"obs": obs, "actions": actions, **seq})[0].reshape(T, B)
            else:
                target_logp = m.evaluate_actions(obs, actions)[0].reshape(T, B)
        vs, adv = vtrace(s["logp"], target_logp, s["rewards"], s["values"], s["next_values"], s["done"],
                         c.gamma, c.gae_lambda, c.vtrace_rho_bar, c.vtrace_c_bar)
        return {"obs": obs, "actions": actions, "logp": flat(target_logp), "behaviour_logp": flat(s["logp"]),
                "vs": flat(vs), "adv": flat(adv), "values": flat(s["values"]), **seq}


def explained_variance(values: Tensor, returns: Tensor) -> Tensor:
    """1 - Var(returns - values) / Var(returns): how much of the returns the critic explains (0
    where the returns do not vary), as a 0-dim tensor on their device (see ``read_metrics``)."""
    var_ret = returns.var()
    explained = 1.0 - (returns - values).var() / var_ret
    return torch.where(var_ret > 0, explained, torch.zeros_like(explained))
