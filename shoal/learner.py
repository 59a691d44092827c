"""Learner: owns the network, optimiser and update rule; publishes weights after each update.

An algorithm subclasses :class:`Learner` and implements ``learn(rollouts) -> metrics``; the
base class keeps the version, publishes to the WeightStore and summarises episodes.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, NamedTuple

import numpy as np
import torch

from shoal import devices
from shoal.errors import Diverged, ShoalError
from shoal.policy import RunningNorm, get_weights, set_up_torch, set_weights
from shoal.runner import Rollout, merge_infos


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` that scales the gradients only when it must.

    Its total norm and scale are the same; when the norm is within ``max_norm`` (most updates)
    it skips the multiplication by 1 that torch's version makes, and torch's bookkeeping around
    it (DQN's update on CartPole: 1,085 -> 1,040 us). A NaN norm leaves the gradients as they
    are (torch's makes them all NaN). On a GPU it always scales, as torch's: reading the norm
    there would make the CPU wait for the GPU every update. Returns the total norm before clipping.
    """
    params = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if norm.device.type != "cpu" or norm + 1e-6 > max_norm:  # torch scales by min(1, max_norm / (norm + 1e-6))
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def read_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """``metrics`` with its 0-dim tensors as floats, read back in one copy: on a GPU each read
    makes the CPU wait for the queued work, and an iteration's metrics were a read apiece."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return metrics
    values = torch.stack([metrics[k].detach().double() for k in keys]).tolist()
    return {**metrics, **dict(zip(keys, values))}


def load_optimizer(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Load an optimiser's saved state (its moments and step counts, parameter by parameter) and
    keep this run's parameter groups with their settings: a checkpoint whose networks were grouped
    otherwise (written with other learning rates of their own, or before there were any) loads the
    same state for the same parameters. The parameters must be the same, in the same order: a count
    or a moment's shape that differs is refused."""
    groups, start = [], 0
    for group in optimizer.param_groups:
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": list(range(start, start + len(group["params"])))})
        start += len(group["params"])
    saved_params = sum(len(g["params"]) for g in saved["param_groups"])
    if saved_params != start:
        raise ShoalError(f"the checkpoint's optimiser holds {saved_params} parameter tensors, this learner's "
                         f"{start}: it was written for other networks")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, state in saved["state"].items():  # moments of another shape would fail only at the next step
        want = tuple(params[index].shape)
        other = [tuple(v.shape) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() and v.shape != want]
        if other:
            raise ShoalError(f"the checkpoint's optimiser holds moments of shape {other[0]} for parameter {index}, "
                             f"whose shape here is {want}: it was written for other networks")
    optimizer.load_state_dict({"state": saved["state"], "param_groups": groups})


def network_shapes(extra: dict[str, Any]) -> dict[str, list[int]]:
    """The shapes of the tensors in a learner's :meth:`Learner.extra_state` by dotted key
    ("critics.weights.0": [2, 4, 256]): its networks beyond the policy, not its optimisers' state
    (an entry of "state" and "param_groups"), which a new run starts afresh."""
    shapes: dict[str, list[int]] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, torch.Tensor):
            shapes[key] = list(value.shape)
        elif isinstance(value, dict) and not {"state", "param_groups"} <= value.keys():
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))

    walk(extra, "")
    return shapes


def check_losses(metrics: dict[str, Any], version: int, env_steps: int, config: Any) -> None:
    """Raise, before the weights are published, once a loss the learner reports (the mean of an
    iteration's updates, read anyway) is NaN or infinite: the weights it stepped are then
    ruined, and runners acting with them would fail in ways that point at the env instead."""
    bad = [f"{k} is {float(v)}" for k, v in metrics.items() if k.startswith("loss/") and not math.isfinite(v)]
    if bad:
        raise Diverged(f"training diverged: {', '.join(bad)} in the updates that made policy version {version} "
                       f"(at {env_steps:,} env steps), so its weights hold NaN or inf and were not published: "
                       f"{Diverged.advice(config)}")


CPU_WAIT_WINDOW_S = 10.0
"""Seconds between a learner's readings of :class:`CpuWait`."""


class CpuWait:
    """The share of their runnable time this process's threads spent waiting for a CPU, over
    windows of :data:`CPU_WAIT_WINDOW_S` seconds: Linux's per-thread schedstat counts the
    nanoseconds each thread ran and those it waited on a run queue (nothing, off Linux).

    Torch's intra-op threads meet at the end of every parallel op, so when other processes hold
    the cores, each op waits for its last thread to be scheduled. SAC's preset (2 threads) made
    6 updates a second on Pendulum-v1 beside one busy process on 2 cores, against 114 with one
    thread (BENCHMARKS.md); its two threads waited for a CPU 44% of the time, against 1% alone.
    Learners report the share as ``learner/cpu_wait``, and the trainer advises fewer threads."""

    def __init__(self):
        self.counts, self.at = self.read(), time.monotonic()
        self.share: float | None = None  # of the latest window; None before the first

    @staticmethod
    def read() -> dict[str, tuple[int, int]]:
        """{thread id: (ns running, ns waiting)} for this process's threads."""
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:  # not Linux
            return {}
        counts = {}
        for tid in tids:
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    run, wait = f.read().split()[:2]
                counts[tid] = (int(run), int(wait))
            except (OSError, ValueError):  # a thread that ended since the listing
                pass
        return counts

    def poll(self) -> float | None:
        """The share of the latest whole window (a new one starts when the last has ended)."""
        now = time.monotonic()
        if now - self.at >= CPU_WAIT_WINDOW_S:
            counts = self.read()
            run = wait = 0
            for tid, (r, w) in counts.items():
                r0, w0 = self.counts.get(tid, (0, 0))  # a thread started in the window: all of it
                run, wait = run + r - r0, wait + w - w0
            self.counts, self.at = counts, now
            if run + wait > 0:
                self.share = wait / (run + wait)
        return self.share


class UpdateResult(NamedTuple):
    """What one learner update reports back to the driver."""

    metrics: dict[str, float]
    version: int  # the version just published
    env_steps: int  # steps in the rollouts learned from
    episode_returns: list[float]  # episodes the rollouts completed
    episode_lengths: list[int]
    episode_infos: dict[str, list[float]] = {}  # their --episode-info values


class Learner:
    """Base learner: version counter, publishing, state for checkpoints."""

    REWARD_CLIP = 10.0  # of normalised rewards, as VecNormalize's clip_reward

    def __init__(self, config, obs_space, action_space, store, policy_id: str = "default"):
        from shoal.algos import spec_for

        set_up_torch(config.torch_threads)
        torch.manual_seed(config.seed)
        self.config, self.store, self.policy_id = config, store, policy_id
        self.device = devices.resolve(config.device)
        self.policy = spec_for(config).make_policy(config, obs_space, action_space).to(self.device)
        self.rng = np.random.default_rng(config.seed)
        # The learner's own torch stream: the global one is shared with in-process roles on the
        # local backend, which would make local and Ray runs draw different noise.
        self.generator = devices.generator(self.device, config.seed)
        self.version = 0
        self.env_steps = 0
        self.cpu_wait = CpuWait()
        self.dropped_rollouts = 0  # too old for max_policy_lag (asynchronous loop)
        self.dropped_steps = 0
        # normalize_rewards: the running variance of the runners' discounted returns
        self.return_norm = RunningNorm(()).to(self.device) if getattr(config, "normalize_rewards", False) else None

    def tensor(self, x: Any) -> torch.Tensor:
        """``x`` (an array) as a tensor on the learner's device (shared with it on the CPU)."""
        return devices.upload(x, self.device)

    def remaining(self, env_steps: int | None = None) -> float:
        """Fraction of total_steps still to go after ``env_steps`` env steps (default: the steps
        learned from so far), for linear schedules."""
        return max(0.0, 1.0 - (self.env_steps if env_steps is None else env_steps) / self.config.total_steps)

    def scheduled_lr(self, *optimizers: torch.optim.Optimizer, env_steps: int | None = None) -> float:
        """Set the optimizers' learning rate for an update at ``env_steps`` env steps (default:
        the steps learned from before this update) and return it: ``lr``, or with ``lr_schedule``
        linear decayed to 0 at total_steps (SB3's and rl-zoo's ``lin_`` schedules)."""
        c = self.config
        factor = self.remaining(env_steps) if c.lr_schedule == "linear" else 1.0
        for optimizer in optimizers:
            for group in optimizer.param_groups:  # each at its setting's rate (:meth:`adam`)
                group["lr"] = self.base_lr(group.get("lr_setting", "lr")) * factor
        return c.lr * factor

    def base_lr(self, setting: str) -> float:
        """The learning rate ``setting`` names before any schedule: ``lr``, or a network's own
        (``actor_lr``, ``critic_lr``, ``alpha_lr``), which is ``lr`` where it is not given."""
        own = getattr(self.config, setting, None)
        return self.config.lr if own is None else own

    def adam(self, networks: dict[str, Any], **kwargs: Any) -> torch.optim.Adam:
        """One fused Adam over several networks' parameters, each list under the setting of its
        learning rate (``{"actor_lr": ..., "critic_lr": ..., "alpha_lr": ...}``; an empty list is
        left out). Where their rates are all the same, one parameter group holds them; else each
        network is a group of its own, in the order given, stepped at its own rate, as separate
        optimisers would be (RLlib's actor_lr, critic_lr and alpha_lr)."""
        networks = {k: ps for k, v in networks.items() if (ps := list(v))}
        if len({self.base_lr(k) for k in networks}) == 1:
            groups = [{"params": [p for ps in networks.values() for p in ps], "lr_setting": next(iter(networks))}]
        else:
            groups = [{"params": ps, "lr_setting": k} for k, ps in networks.items()]
        for group in groups:
            group["lr"] = self.base_lr(group["lr_setting"])
        return torch.optim.Adam(groups, eps=self.config.optimizer_eps, fused=True, **kwargs)

    def learn(self, rollouts: list[Rollout]) -> dict[str, float]:
        """The algorithm's update on a batch of rollouts; returns flat metrics."""
        raise NotImplementedError

    def merge_obs_stats(self, rollouts: list[Any]) -> None:
        """Merge the runners' raw-observation statistics (``obs_moments``) into the policy's
        normaliser, in runner order."""
        if self.policy.obs_norm is not None:
            for r in rollouts:
                if r.obs_moments is not None:
                    self.policy.obs_norm.update(r.obs_moments)

    def merge_return_stats(self, rollouts: list[Any]) -> None:
        """Merge the statistics of the runners' discounted returns (``return_moments`` of Rollouts,
        or of Ape-X's summaries) into the reward normaliser (normalize_rewards), in runner order."""
        if self.return_norm is not None:
            for r in rollouts:
                if r.return_moments is not None:
                    self.return_norm.update(r.return_moments)

    def normalized_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """``rewards`` as the losses take them: with normalize_rewards divided by the running std
        of the runners' discounted returns (stable-baselines3's VecNormalize norm_reward) and
        clipped to +-REWARD_CLIP; as they are otherwise."""
        if self.return_norm is None:
            return rewards
        std = torch.sqrt(self.return_norm.var + self.return_norm.eps).to(rewards.dtype)
        return (rewards / std).clamp(-self.REWARD_CLIP, self.REWARD_CLIP)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The learner's optimisers (most have one; TD3's and DDPG's actor's and critics')."""
        return [v for v in vars(self).values() if isinstance(v, torch.optim.Optimizer)]

    def extra_state(self) -> dict[str, Any]:
        """The algorithm's state beyond the policy weights (optimisers, critics, targets)."""
        raise NotImplementedError

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`extra_state`."""
        raise NotImplementedError

    def load_networks(self, weights: dict[str, Any], extra: dict[str, Any]) -> int:
        """Start from another run's networks (``--init-from``): its policy ``weights`` and, from its
        :meth:`extra_state`, the networks beyond the policy; this run's optimisers, counters and
        random state stay fresh. Published as the next version (runners and evaluators hold the
        first); returns it."""
        set_weights(self.policy, weights)
        self.load_extra_networks(extra)
        self.version += 1
        self.publish()
        return self.version

    EXTRA_NETWORKS = True
    """Whether the algorithm has networks beyond the policy (:meth:`load_extra_networks` reads them)."""

    def extra_shapes(self) -> dict[str, list[int]]:
        """:func:`network_shapes` of this learner's :meth:`extra_state`: what a checkpoint's must
        be for :meth:`load_extra_networks` to take them."""
        return network_shapes(self.extra_state())

    def load_extra_networks(self, extra: dict[str, Any]) -> None:
        """The networks of :meth:`extra_state`'s ``extra`` beyond the policy (critics, targets), not
        its optimisers' state."""
        raise NotImplementedError

    def update(self, *rollouts: Rollout) -> UpdateResult:
        """Learn from the rollouts, publish version+1, and report metrics and episodes.

        Policy lag is how many versions behind the learner each rollout's policy was. With
        ``max_policy_lag`` set, older rollouts are dropped, not learned from, and counted; their
        steps and episodes still count as sampled.
        """
        lags = [self.version - r.policy_version for r in rollouts]
        max_lag = getattr(self.config, "max_policy_lag", None)
        fresh = [r for r, lag in zip(rollouts, lags) if max_lag is None or lag <= max_lag]
        steps = sum(r.env_steps for r in rollouts)
        self.dropped_rollouts += len(rollouts) - len(fresh)
        self.dropped_steps += steps - sum(r.env_steps for r in fresh)
        metrics = {}
        if fresh:
            metrics = self.learn(fresh)
            check_losses(metrics, self.version + 1, self.env_steps + steps, self.config)
            self.version += 1
            self.publish()
        metrics.update({"learner/policy_lag_mean": float(np.mean(lags)), "learner/policy_lag_max": float(max(lags)),
                        "learner/dropped_rollouts": float(self.dropped_rollouts),
                        "learner/dropped_steps": float(self.dropped_steps)})
        self.report_cpu_wait(metrics)
        self.env_steps += steps
        return UpdateResult(metrics, self.version, steps,
                            [x for r in rollouts for x in r.episode_returns],
                            [x for r in rollouts for x in r.episode_lengths],
                            merge_infos(r.episode_infos for r in rollouts))

    def report_cpu_wait(self, metrics: dict[str, float]) -> None:
        """Add ``learner/cpu_wait``, :class:`CpuWait`'s share of the latest window, once there is one."""
        share = self.cpu_wait.poll()
        if share is not None:
            metrics["learner/cpu_wait"] = share

    def publish(self) -> int:
        """Publish the current weights as the current version."""
        return self.store.publish(self.policy_id, self.version, get_weights(self.policy))

    def get_weights(self) -> dict[str, np.ndarray]:
        """Current weights (NumPy)."""
        return get_weights(self.policy)

    def get_state(self) -> dict[str, Any]:
        """All the learner needs to continue exactly, on the CPU."""
        return devices.to_cpu({"weights": self.get_weights(), "extra": self.extra_state(),
                               "version": self.version, "env_steps": self.env_steps,
                               "dropped": (self.dropped_rollouts, self.dropped_steps),
                               "rng": self.rng.bit_generator.state, "torch_rng": self.generator.get_state(),
                               **({"return_norm": {k: v.clone() for k, v in self.return_norm.state_dict().items()}}
                                  if self.return_norm is not None else {})})

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` and republish the restored weights."""
        set_weights(self.policy, state["weights"])
        self.load_extra_state(state["extra"])
        for optimizer in self.optimizers():  # a saved optimizer brings its epsilon: the settings' holds
            for group in optimizer.param_groups:
                group["eps"] = self.config.optimizer_eps
        self.version, self.env_steps = state["version"], state["env_steps"]
        if self.return_norm is not None and "return_norm" in state:
            self.return_norm.load_state_dict(state["return_norm"])
        self.dropped_rollouts, self.dropped_steps = state.get("dropped", (0, 0))
        self.rng.bit_generator.state = state["rng"]
        try:
            self.generator.set_state(state["torch_rng"])
        except RuntimeError:  # saved by another device's generator (resumed on another device): reseeded
            self.generator.manual_seed(self.config.seed + self.version)
        self.publish()
