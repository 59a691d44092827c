"""Hindsight Experience Replay (Andrychowicz et al. 2017) for goal-conditioned envs.

An episode that failed to reach its goal still shows how to reach the goals it did reach. When
an episode ends, each of its transitions is stored again ``k`` times, each time with a goal the
episode achieved in place of the desired one, and with the reward and termination the env
computes for that goal: the paper's Algorithm 1, with its ``future`` strategy by default (a goal
achieved at this step or later in the episode), or ``final`` (the episode's last) or ``episode``
(any of its steps). With k = 4, four in five stored transitions are relabelled, the ratio
stable-baselines3's HER replay samples at.

Envs follow Gymnasium-Robotics' GoalEnv interface: Dict observations with ``observation``,
``achieved_goal`` and ``desired_goal`` (shoal flattens them, so a goal is a slice of the flat
vector), and a vectorised ``compute_reward(achieved, desired, infos)``; ``compute_terminated``
where the env has it (reaching a goal may end an episode), else relabelled transitions never
terminate. The infos given to them are empty: rollouts do not keep the envs' infos.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from shoal.errors import ShoalError
from shoal.runner import Rollout

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")
GOAL_ENV = ("a goal env (Gymnasium-Robotics' GoalEnv interface: Dict observations with observation, achieved_goal "
            "and desired_goal, and a compute_reward(achieved_goal, desired_goal, info) method), such as "
            "BitFlipping-v0 or gymnasium-robotics' FetchReach")
STRATEGIES = ("future", "final", "episode")


class GoalLayout(NamedTuple):
    """Where the goals lie in the flat observation vector, and what the env's functions take."""

    achieved: slice
    desired: slice
    shape: tuple[int, ...]  # one goal's shape in the env's own space
    dtype: np.dtype


def goal_layout(space: gym.Space | None) -> GoalLayout | None:
    """The layout of a goal env's Dict observation space as shoal flattens it (Gymnasium's
    ``flatten``: the entries in the Dict's order, each flattened); None for any other space.
    Goals must be Box or MultiBinary, whose flattened values are the goal's own."""
    if not isinstance(space, gym.spaces.Dict) or not set(GOAL_KEYS) <= set(space.spaces):
        return None
    offsets, at = {}, 0
    for key, sub in space.spaces.items():
        size = gym.spaces.flatdim(sub)
        offsets[key] = slice(at, at + size)
        at += size
    achieved, desired = space["achieved_goal"], space["desired_goal"]
    for name, sub in (("achieved_goal", achieved), ("desired_goal", desired)):
        if not isinstance(sub, (gym.spaces.Box, gym.spaces.MultiBinary)):
            raise ShoalError(f"hindsight goals need Box or MultiBinary goals; {name} is {sub}")
    if achieved.shape != desired.shape:
        raise ShoalError(f"achieved_goal {achieved} and desired_goal {desired} differ in shape: "
                         "hindsight puts one in the other's place")
    return GoalLayout(offsets["achieved_goal"], offsets["desired_goal"], tuple(desired.shape), desired.dtype)


def own_space(env: gym.Env) -> gym.Space | None:
    """The observation space the env itself gives, below shoal's flattening wrapper."""
    inner = env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, gym.wrappers.FlattenObservation):
            return inner.env.observation_space
        inner = inner.env
    return None


class Hindsight:
    """Keeps each (runner, env)'s unfinished episode and turns every finished one into ``k``
    relabelled copies of its transitions: (obs, actions, rewards, next_obs, discounts) as
    :class:`shoal.replay.NStep` gives (one-step, so discount is gamma or 0)."""

    def __init__(self, layout: GoalLayout, compute_reward: Callable, compute_terminated: Callable | None, *,
                 k: int, strategy: str, gamma: float, clip_rewards: bool = False, seed: int = 0):
        if strategy not in STRATEGIES:
            raise ShoalError(f"unknown hindsight strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
        self.layout, self.compute_reward, self.compute_terminated = layout, compute_reward, compute_terminated
        self.k, self.strategy, self.gamma, self.clip_rewards = k, strategy, gamma, clip_rewards
        self.rng = np.random.default_rng(seed)
        # Per (runner, env): the current episode's steps so far, as chunks of (obs, actions, next_obs).
        self.pending: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}

    @classmethod
    def for_env(cls, env: gym.Env, *, k: int, strategy: str, gamma: float, clip_rewards: bool = False,
                seed: int = 0) -> Hindsight:
        """A relabeller for the envs that ``env`` (made by :func:`shoal.envs.make_env`) is one of;
        a clear error if it is not a goal env."""
        own = own_space(env)
        layout = goal_layout(own)
        if layout is None:
            space = own or env.observation_space
            kind = f"a {type(space).__name__} of shape {space.shape}" if isinstance(space, gym.spaces.Box) else space
            raise ShoalError(f"--her-goals needs {GOAL_ENV}; this env's observations are {kind}")
        try:
            compute_reward = env.get_wrapper_attr("compute_reward")
        except AttributeError:
            raise ShoalError(f"--her-goals needs the env's compute_reward(achieved_goal, desired_goal, info), "
                             f"which this env lacks: {GOAL_ENV}") from None
        try:
            compute_terminated = env.get_wrapper_attr("compute_terminated")
        except AttributeError:
            compute_terminated = None
        her = cls(layout, compute_reward, compute_terminated, k=k, strategy=strategy, gamma=gamma,
                  clip_rewards=clip_rewards, seed=seed)
        her._check_vectorised(own)
        return her

    def _check_vectorised(self, own: gym.spaces.Dict) -> None:
        """compute_reward must take batches, as the GoalEnv interface says: one call per rollout."""
        goals = np.stack([own["desired_goal"].sample() for _ in range(3)])
        rewards, _ = self._outcomes(goals, goals)
        if rewards.shape != (3,):
            raise ShoalError("--her-goals needs compute_reward to take a batch of goals [N, *goal_shape] and give "
                             f"N rewards (the GoalEnv interface); this env's gave shape {rewards.shape} for 3")

    def _outcomes(self, achieved: np.ndarray, desired: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rewards and terminations of reaching ``achieved`` when ``desired`` was the goal [N]."""
        n = len(achieved)
        infos = np.empty(n, object)
        infos[:] = [{} for _ in range(n)]
        rewards = np.asarray(self.compute_reward(achieved, desired, infos), np.float32)
        if rewards.shape == (n,) and self.clip_rewards:
            rewards = np.sign(rewards)
        if self.compute_terminated is None:
            return rewards, np.zeros(n, bool)
        return rewards, np.broadcast_to(np.asarray(self.compute_terminated(achieved, desired, infos), bool), (n,))

    def __call__(self, r: Rollout, next_obs: np.ndarray) -> tuple[np.ndarray, ...]:
        """The relabelled transitions of the episodes that rollout ``r`` finishes (``next_obs``
        [T, B, ...]: each step's successor, the true final observation where an episode ended)."""
        T, B = r.rewards.shape
        ended = r.terminated | r.truncated
        episodes = []
        for b in range(B):
            chunks = self.pending.setdefault((r.runner_id, b), [])
            start = 0
            for t in np.flatnonzero(ended[:, b]):
                chunks.append((r.obs[start:t + 1, b], r.actions[start:t + 1, b], next_obs[start:t + 1, b]))
                episodes.append(tuple(np.concatenate(c) for c in zip(*chunks)))
                chunks.clear()
                start = t + 1
            if start < T:
                chunks.append((r.obs[start:, b].copy(), r.actions[start:, b].copy(), next_obs[start:, b].copy()))
        return self.relabel(episodes)

    def relabel(self, episodes: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
        """``k`` copies of every transition of ``episodes`` (each (obs, actions, next_obs) of one
        whole episode), each with an achieved goal as its desired goal, and the env's reward and
        termination for it."""
        lay = self.layout
        obs, actions, nexts = [], [], []
        for ep_obs, ep_actions, ep_next in episodes:
            T = len(ep_obs)
            t = np.repeat(np.arange(T), self.k)
            if self.strategy == "future":  # a goal achieved at step t or later: t + U{0, ..., T - 1 - t}
                source = t + (self.rng.random(len(t)) * (T - t)).astype(np.int64)
            elif self.strategy == "final":
                source = np.full(len(t), T - 1)
            else:
                source = self.rng.integers(0, T, len(t))
            goals = ep_next[source, lay.achieved]
            o, n = ep_obs[t], ep_next[t]  # copies (fancy indexing)
            o[:, lay.desired] = goals
            n[:, lay.desired] = goals
            obs.append(o), actions.append(ep_actions[t]), nexts.append(n)
        if not obs:
            return None
        obs, actions, nexts = np.concatenate(obs), np.concatenate(actions), np.concatenate(nexts)
        shape = (len(obs), *lay.shape)
        rewards, terminated = self._outcomes(nexts[:, lay.achieved].reshape(shape).astype(lay.dtype),
                                             nexts[:, lay.desired].reshape(shape).astype(lay.dtype))
        return obs, actions, rewards, nexts, np.where(terminated, 0.0, self.gamma).astype(np.float32)

    def get_state(self) -> dict[str, Any]:
        """The unfinished episodes and the sampling state, for checkpoints with --save-replay."""
        return {"pending": {k: list(v) for k, v in self.pending.items()}, "rng": self.rng.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`."""
        self.pending = {k: list(v) for k, v in state["pending"].items()}
        self.rng.bit_generator.state = state["rng"]
