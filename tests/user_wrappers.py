"""Env wrappers as a user writes them for ``--env-wrapper user_wrappers:NAME`` (tests/test_env_wrappers.py)."""

from __future__ import annotations

import gymnasium as gym


class ScaleReward(gym.RewardWrapper):
    """Rewards times ``scale``."""

    def __init__(self, env, scale: float = 1.0):
        super().__init__(env)
        self.scale = scale

    def reward(self, reward):
        return self.scale * reward


def time_limit(env, steps: int = 50):
    """A function that wraps: episodes cut at ``steps``."""
    return gym.wrappers.TimeLimit(env, max_episode_steps=steps)


class OutOfSpace(gym.ObservationWrapper):
    """Observations outside the space it declares (the env's own): Gymnasium's checker objects."""

    def observation(self, observation):
        return observation + 100.0


class EpisodeScore(gym.Wrapper):
    """Says in its info, at the step that ends an episode, the episode's length as its ``score``
    (and nothing at other steps), and ``tag`` (not a number) at every step."""

    def reset(self, **kwargs):
        self.steps = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        info = {**info, "tag": "text"}
        if terminated or truncated:
            info["score"] = self.steps
        return obs, reward, terminated, truncated, info


class Raises(gym.Wrapper):
    def __init__(self, env):
        raise ValueError("no wrapper today")


def not_an_env(env):
    return 3


NOT_CALLABLE = 3
