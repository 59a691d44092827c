"""InferenceServer: central batched inference for runners (SEED RL's layout).

With ``--inference central`` runners hold no weights: each env step they send their raw
observations to an inference server, which gathers the requests of every runner that arrives
within ``max_wait_ms`` (``@shoal.batched``) into one forward pass with the newest published
weights, and returns network inputs, actions, log-probabilities and the version used. On the
ray backend it is a threaded actor, so calls from several runners are in flight at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shoal.batching import batched
from shoal.policy import set_up_torch, set_weights


class InferenceServer:
    """A policy copy following the WeightStore, answering batched ``explore`` requests."""

    def __init__(self, config, store, obs_space, action_space, server_id: int = 0, policy_id: str = "default",
                 max_batch: int = 64, max_wait_ms: float = 1.0):
        from shoal.algos import spec_for

        set_up_torch(config.torch_threads)
        self.config, self.store, self.policy_id = config, store, policy_id
        self.policy = spec_for(config).make_policy(config, obs_space, action_space)
        self.version = -1
        self.generator = torch.Generator().manual_seed(config.seed + 7_000_000 + server_id)
        self._batched = batched(max_batch, max_wait_ms)(self._explore_batch)
        self.batches = 0
        self.requests = 0

    def _sync(self) -> None:
        got = self.store.latest(self.policy_id, newer_than=self.version)
        if got is not None:
            self.version, weights = got
            set_weights(self.policy, weights)

    def explore(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(network input, action, log-probability, version) for one runner's raw observations;
        concurrent callers share a forward pass."""
        return self._batched(obs)

    @torch.no_grad()
    def _explore_batch(self, requests: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
        """One forward pass for every runner's observations: (input, action, logp, version) each."""
        self._sync()
        m = self.policy
        sizes = [len(r) for r in requests]
        x = m.normalize(torch.as_tensor(np.concatenate(requests)))  # concatenate copies: writable
        a, logp = m.explore(x, self.generator)
        bounds = np.cumsum([0, *sizes])
        x, a, logp = x.numpy(), a.numpy(), logp.numpy()
        self.batches += 1
        self.requests += len(requests)
        return [(x[lo:hi], a[lo:hi], logp[lo:hi], self.version) for lo, hi in zip(bounds[:-1], bounds[1:])]

    @torch.no_grad()
    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """Network inputs for raw observations, with the current normaliser."""
        self._sync()
        return self.policy.normalize(torch.tensor(obs)).numpy()

    def stats(self) -> dict[str, Any]:
        """Requests served and forward passes made (their ratio is the mean batch)."""
        return {"requests": self.requests, "batches": self.batches, "version": self.version}
