"""A CartPole that writes the wall-clock time of its first step to $SHOAL_PROBE_FILE (start-up benchmark)."""

import os
import time

from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.envs.registration import register


class StartupProbe(CartPoleEnv):
    """CartPole-v1 that records when it is first stepped."""

    def step(self, action):
        path = os.environ.get("SHOAL_PROBE_FILE")
        if path and not os.path.exists(path):
            with open(path, "w") as f:
                f.write(repr(time.time()))
        return super().step(action)


register("StartupProbe-v0", entry_point=StartupProbe, max_episode_steps=500, reward_threshold=475.0)
