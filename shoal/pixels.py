"""Continuous control from pixels, small enough for a CPU: ``PixelReach-v0``.

A dot must reach a target on a ``size`` x ``size`` screen (10 by default) that the agent sees only
as pixels: uint8 [size, size, 2], the dot lit in the first channel and the target in the
second. An action (dx, dy) in [-1, 1]^2 moves the dot by up to 1.5 pixels a step; the reward is
minus the dot's distance to the target over ``size``, every step of 15. Random actions score
about -7.8; moving straight to the target and staying there, about -0.6 (means over 300
starts). The dot's position is continuous but shown rounded to a pixel, so a policy has to read
both positions from the image to act well.

It exercises what SAC, TD3 and DDPG do with image observations (an encoder for the actor,
another for the critics, uint8 frames through rollouts and replay) in minutes rather than the
hours of CarRacing-v3 or a DeepMind Control task from pixels.

With ``proprio=True`` the agent sees a camera and feels its own position, as a robot does: the
observation is a Dict of ``image`` (uint8 [size, size, 1], the target alone) and ``position``
(float32 [2], the dot's x and y over ``size``), so a policy must read the target from the pixels
and itself from the vector.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class PixelReachEnv(gym.Env):
    """Move a dot onto a target, both seen as pixels only."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, size: int = 10, max_steps: int = 15, render_mode: str | None = None, proprio: bool = False):
        if not 4 <= size <= 256:
            raise ValueError(f"size must be in [4, 256], not {size}")
        self.size, self.max_steps, self.render_mode, self.proprio = size, max_steps, render_mode, proprio
        self.observation_space: gym.Space = gym.spaces.Box(0, 255, (size, size, 2), np.uint8)
        if proprio:
            self.observation_space = gym.spaces.Dict({
                "image": gym.spaces.Box(0, 255, (size, size, 1), np.uint8),
                "position": gym.spaces.Box(0.0, 1.0, (2,), np.float32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.pos = np.zeros(2)
        self.target = np.zeros(2, np.int64)
        self.steps = 0

    def _obs(self) -> Any:
        frame = self._frame()
        if self.proprio:
            return {"image": frame[..., 1:], "position": (self.pos / self.size).astype(np.float32)}
        return frame

    def _frame(self) -> np.ndarray:
        frame = np.zeros((self.size, self.size, 2), np.uint8)
        x, y = np.clip(np.rint(self.pos), 0, self.size - 1).astype(np.int64)
        frame[y, x, 0] = 255
        frame[self.target[1], self.target[0], 1] = 255
        return frame

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(0, self.size - 1, 2)
        self.target = self.np_random.integers(0, self.size, 2)
        self.steps = 0
        return self._obs(), {}

    def step(self, action: Any):
        move = np.clip(np.asarray(action, np.float64).reshape(2), -1.0, 1.0)
        self.pos = np.clip(self.pos + 1.5 * move, 0, self.size - 1)
        self.steps += 1
        reward = -float(np.linalg.norm(self.pos - self.target)) / self.size
        return self._obs(), reward, False, self.steps >= self.max_steps, {}

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        frame = self._frame()
        rgb = np.stack([frame[..., 0], frame[..., 1], np.zeros_like(frame[..., 0])], -1)
        return np.repeat(np.repeat(rgb, 16, 0), 16, 1)  # 16x: a visible video


if "PixelReach-v0" not in gym.registry:
    gym.register("PixelReach-v0", entry_point="shoal.pixels:PixelReachEnv")
