"""Partially observed classics, for recurrent policies: the velocities hidden from the observation.

rl-baselines3-zoo's benchmarks for recurrent PPO (``CartPoleNoVel-v1`` and kin, its
MaskVelocityWrapper): the same envs with every velocity in the observation set to 0, so a
policy must infer motion from what it remembers of earlier steps. A feed-forward policy sees
CartPole's pole angle but not where it is heading, and cannot balance it for long.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

# id -> (the fully observed env, the observation indices that hold velocities)
NO_VELOCITY = {
    "CartPoleNoVel-v1": ("CartPole-v1", (1, 3)),  # x, x', theta, theta'
    "PendulumNoVel-v1": ("Pendulum-v1", (2,)),  # cos, sin, theta'
    "MountainCarNoVel-v0": ("MountainCar-v0", (1,)),  # position, velocity
    "MountainCarContinuousNoVel-v0": ("MountainCarContinuous-v0", (1,)),
    "LunarLanderNoVel-v3": ("LunarLander-v3", (2, 3, 5)),  # x, y, x', y', angle, angle', legs
    "LunarLanderContinuousNoVel-v3": ("LunarLanderContinuous-v3", (2, 3, 5)),
}


class MaskVelocity(gym.ObservationWrapper):
    """Sets the observation's elements at ``indices`` to 0 (its space unchanged)."""

    def __init__(self, env: gym.Env, indices: tuple[int, ...]):
        super().__init__(env)
        self.mask = np.ones(env.observation_space.shape, env.observation_space.dtype)
        self.mask[list(indices)] = 0

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation * self.mask


def _no_velocity(env_id: str, **kwargs: Any) -> gym.Env:
    base, indices = NO_VELOCITY[env_id]
    return MaskVelocity(gym.make(base, **kwargs), indices)


for _id, (_base, _) in NO_VELOCITY.items():
    if _id not in gym.registry:
        _spec = gym.spec(_base)  # the time limit and reward threshold of the env it hides part of
        gym.register(_id, entry_point=_no_velocity, kwargs={"env_id": _id},
                     max_episode_steps=None, reward_threshold=_spec.reward_threshold)
