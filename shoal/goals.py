"""Goal-conditioned envs: the bit-flipping task of the Hindsight Experience Replay paper.

``BitFlipping-v0`` (Andrychowicz et al. 2017, Sec. 3.1): a state of ``n_bits`` bits and a goal
of as many; each action flips one bit; the reward is -1 until the state equals the goal, 0 on
the step that reaches it, which ends the episode; after ``n_bits`` steps it is cut. Random
exploration almost never meets a goal of 10 or more bits, so a plain DQN learns nothing from
the -1s; with hindsight goals (``--her-goals``) it learns to reach every goal.

It follows Gymnasium-Robotics' GoalEnv interface, as its Fetch and Shadow Hand tasks do, and as
stable-baselines3's HER replay expects: Dict observations with ``observation``,
``achieved_goal`` and ``desired_goal``, and vectorised ``compute_reward``,
``compute_terminated`` and ``compute_truncated`` of (achieved goals, desired goals, infos).
``continuous=True`` takes a Box action in [-1, 1]^n_bits instead, flipping the bits whose
entries are positive (for SAC, TD3 and DDPG).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class BitFlippingEnv(gym.Env):
    """Reach a goal of ``n_bits`` bits by flipping one bit a step (or any, with ``continuous``)."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, n_bits: int = 10, continuous: bool = False, render_mode: str | None = None):
        if not 1 <= n_bits <= 1000:
            raise ValueError(f"n_bits must be in [1, 1000], not {n_bits}")
        self.n_bits, self.continuous, self.render_mode = n_bits, continuous, render_mode
        bits = gym.spaces.MultiBinary(n_bits)
        self.observation_space = gym.spaces.Dict({"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = (gym.spaces.Box(-1.0, 1.0, (n_bits,), np.float32) if continuous
                             else gym.spaces.Discrete(n_bits))
        self.state = np.zeros(n_bits, np.int8)
        self.goal = np.zeros(n_bits, np.int8)
        self.steps = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        while np.array_equal(self.state, self.goal):  # an episode that starts solved teaches nothing
            self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.steps = 0
        return self._obs(), {"is_success": False}

    def step(self, action: Any):
        if self.continuous:
            flips = np.asarray(action).reshape(self.n_bits) > 0
            self.state = np.where(flips, 1 - self.state, self.state).astype(np.int8)
        else:
            self.state[int(action)] = 1 - self.state[int(action)]
        self.steps += 1
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], {}))
        terminated = bool(self.compute_terminated(obs["achieved_goal"], obs["desired_goal"], {}))
        truncated = not terminated and self.steps >= self.n_bits
        return obs, reward, terminated, truncated, {"is_success": terminated}

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """0 where the achieved goal equals the desired one, else -1 (for one goal or a batch [N, n_bits])."""
        return -np.any(np.asarray(achieved_goal) != np.asarray(desired_goal), axis=-1).astype(np.float32)

    def compute_terminated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """Reaching the goal ends the episode."""
        return np.all(np.asarray(achieved_goal) == np.asarray(desired_goal), axis=-1)

    def compute_truncated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """Goals never cut an episode (the step limit does)."""
        return np.zeros(np.shape(achieved_goal)[:-1], bool)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return f"state {''.join(map(str, self.state))}  goal {''.join(map(str, self.goal))}\n"
        return None


if "BitFlipping-v0" not in gym.registry:
    gym.register("BitFlipping-v0", entry_point="shoal.goals:BitFlippingEnv")
