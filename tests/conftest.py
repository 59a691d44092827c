"""Shared helpers: small configs that train in seconds."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def small_ppo(**overrides):
    """A PPO config small enough for unit tests (not for learning)."""
    from shoal.algos.ppo import PPOConfig

    values = dict(env="CartPole-v1", num_envs_per_runner=4, rollout_steps=16, minibatch_size=32, num_epochs=2,
                  total_steps=10_000, progress=False, tensorboard=False, eval_episodes=2, eval_interval=0,
                  torch_threads=1)
    values.update(overrides)
    return PPOConfig(**values)


@pytest.fixture
def tiny():
    return small_ppo
