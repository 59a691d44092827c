"""InferenceServer: central batched inference for runners (SEED RL's layout).

With ``--inference central`` runners hold no weights: each env step they send their raw
observations to an inference server, which gathers the requests of every runner that arrives
within ``max_wait_ms`` (``@shoal.batched``) into one forward pass with the newest published
weights, and returns the observations as rollouts hold them (network inputs), actions,
log-probabilities and the version used. On the ray backend it is a threaded actor, so calls from
several runners are in flight at once. Its forward passes run on the learner's ``--device`` (SEED
RL's inference on the accelerator).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shoal import devices
from shoal.batching import batched
from shoal.policy import Memory, set_up_torch, set_weights


class InferenceServer:
    """A policy copy following the WeightStore, answering batched ``explore`` requests."""

    def __init__(self, config, store, obs_space, action_space, server_id: int = 0, policy_id: str = "default",
                 max_batch: int = 64, max_wait_ms: float = 1.0):
        from shoal.algos import spec_for

        set_up_torch(config.torch_threads)
        self.config, self.store, self.policy_id = config, store, policy_id
        self.device = devices.resolve(config.device)
        self.policy = spec_for(config).make_policy(config, obs_space, action_space).to(self.device).eval()  # a runner's
        self.version = -1
        self.generator = devices.generator(self.device, config.seed + 7_000_000 + server_id)
        self._batched = batched(max_batch, max_wait_ms)(self._explore_batch)
        self.batches = 0
        self.requests = 0

    def _sync(self) -> None:
        got = self.store.latest(self.policy_id, newer_than=self.version)
        if got is not None:
            self.version, weights = got
            set_weights(self.policy, weights)

    def explore(self, obs: np.ndarray, memory: Memory | None = None) -> tuple[Any, ...]:
        """(network input, action, log-probability, version) for one runner's raw observations;
        concurrent callers share a forward pass. A recurrent policy's runner sends its envs'
        memory (h, c) [B, 2 * lstm_size] too, and gets the memory after this step as a fifth item:
        the server holds none, so runners' requests batch as feed-forward ones do."""
        return self._batched((obs, memory))

    @torch.no_grad()
    def _explore_batch(self, requests: list[tuple[np.ndarray, Memory | None]]) -> list[tuple[Any, ...]]:
        """One forward pass for every runner's observations: (input, action, logp, version) each,
        and for a recurrent policy the memory after it, each row stepped from its own."""
        self._sync()
        m = self.policy
        sizes = [len(obs) for obs, _ in requests]
        # concatenate copies: writable
        x = m.inputs(torch.as_tensor(np.concatenate([obs for obs, _ in requests]), device=self.device))
        if m.recurrent:  # the acting path steps the module's memory: set to the runners', then read back
            m.memory = tuple(torch.as_tensor(np.concatenate([mem[i] for _, mem in requests]), device=self.device)
                             for i in (0, 1))
        a, logp = m.explore(m.network_inputs(x), self.generator)
        bounds = np.cumsum([0, *sizes])
        x, a, logp = x.cpu().numpy(), a.cpu().numpy(), logp.cpu().numpy()
        self.batches += 1
        self.requests += len(requests)
        rows = [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
        if m.recurrent:
            h, c = (t.cpu().numpy() for t in m.memory)
            return [(x[r], a[r], logp[r], self.version, (h[r], c[r])) for r in rows]
        return [(x[r], a[r], logp[r], self.version) for r in rows]

    @torch.no_grad()
    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """What a rollout holds for raw observations (network inputs, with the current normaliser
        unless the learner applies it: ``PolicyModule.inputs``)."""
        self._sync()
        return self.policy.inputs(torch.tensor(obs, device=self.device)).cpu().numpy()

    def stats(self) -> dict[str, Any]:
        """Requests served and forward passes made (their ratio is the mean batch)."""
        return {"requests": self.requests, "batches": self.batches, "version": self.version}
