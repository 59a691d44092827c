"""ReplayBuffer: transitions with n-step returns, uniform or prioritised sampling, a rate limiter.

Each stored transition is (obs, action, reward, next_obs, discount): ``reward`` is the n-step
discounted sum and ``discount`` is gamma^k where the target bootstraps from ``next_obs`` after k
steps, or 0 after a terminal state. A truncated episode (time limit) therefore still bootstraps,
from its true final observation.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:  # not imported at run time: a replay shard's process (Ape-X) holds no torch (~190 MB)
    import torch
    from torch import Tensor

    from shoal.hindsight import Hindsight
    from shoal.runner import Rollout


class Admission(NamedTuple):
    """A replay shard's answer to a writer: how many transitions it may add now, and whether the
    shard is still filling to the size learners start sampling it at (until then no update waits
    on what a writer adds)."""

    room: int
    filling: bool


class Transitions(NamedTuple):
    """A sampled batch. Shapes in brackets. The learner's batches hold tensors; batches in transit
    from a shard (:meth:`ReplayBuffer.sample_ready`) hold NumPy arrays, which Ray sends as
    out-of-band buffers, where a torch tensor goes through torch's own pickling: in an Ape-X DQN
    run on the ray backend that was ~15% of each shard's time and ~13% of the learner's, and
    sending arrays took the learner's 50 updates from 0.45 s to 0.28 s (BENCHMARKS.md)."""

    obs: Tensor  # [N, *input_shape] network inputs
    actions: Tensor  # [N] (discrete) or [N, act_dim]
    rewards: Tensor  # [N] n-step discounted reward
    next_obs: Tensor  # [N, *input_shape] network input to bootstrap from
    discounts: Tensor  # [N] gamma^k, or 0 after termination
    weights: Tensor  # [N] importance-sampling weights (1 when uniform)
    indices: np.ndarray  # [N] storage slots, for priority updates

    def as_tensors(self) -> Transitions:
        """A batch of NumPy columns with them wrapped as tensors (no copy, unless an array arrived
        read-only, as Ray's deserialised arrays do)."""
        import torch

        from shoal import devices

        return Transitions(*(devices.upload(a, torch.device("cpu")) for a in self[:6]), self.indices)

    def to(self, device: torch.device) -> Transitions:
        """The batch's tensors on ``device`` (itself on the CPU)."""
        if device.type == "cpu":
            return self
        return Transitions(*(t.to(device, non_blocking=True) for t in self[:6]), self.indices)


class SumTree:
    """Priorities as leaves of a binary tree of partial sums; every operation is vectorised."""

    def __init__(self, capacity: int):
        self.leaves = 1 << max(1, math.ceil(math.log2(capacity)))
        self.depth = int(math.log2(self.leaves))
        self.tree = np.zeros(2 * self.leaves)

    @property
    def total(self) -> float:
        """Sum of all priorities."""
        return float(self.tree[1])

    def get(self, idx: np.ndarray) -> np.ndarray:
        """Priorities of leaves ``idx``."""
        return self.tree[idx + self.leaves]

    def update(self, idx: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaves ``idx`` to ``priorities`` and recompute their ancestors level by level."""
        nodes = np.asarray(idx) + self.leaves
        self.tree[nodes] = priorities
        for _ in range(self.depth):
            nodes = np.unique(nodes // 2)
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]

    def find(self, values: np.ndarray) -> np.ndarray:
        """Leaf indices whose prefix-sum interval contains each value (descends all at once)."""
        nodes = np.ones(len(values), dtype=np.int64)
        values = values.copy()
        for _ in range(self.depth):
            left = self.tree[2 * nodes]
            right = values >= left
            values -= left * right
            nodes = 2 * nodes + right
        return nodes - self.leaves


class RateLimiter:
    """Reverb's SampleToInsertRatio: keeps samples per insert near ``samples_per_insert``.

    With diff = inserts * spi - samples (items), sampling n items is allowed once
    ``min_size_to_sample`` items were inserted and while diff - n >= spi * min_size - error_buffer;
    inserting n items is allowed while diff + n * spi <= spi * min_size + error_buffer.
    ``samples_per_insert=None`` never blocks (beyond the minimum size).
    """

    def __init__(self, samples_per_insert: float | None, min_size_to_sample: int, error_buffer: float):
        self.spi, self.min_size, self.error_buffer = samples_per_insert, min_size_to_sample, error_buffer
        self.inserts, self.samples = 0, 0

    def _diff(self) -> float:
        return self.inserts * self.spi - self.samples

    def can_sample(self, n: int) -> bool:
        """Whether drawing ``n`` more items keeps the ratio within the error buffer."""
        if self.filling():
            return False
        return self.spi is None or self._diff() - n >= self.spi * self.min_size - self.error_buffer

    def filling(self) -> bool:
        """Whether fewer than ``min_size_to_sample`` items were inserted (nothing may be sampled yet)."""
        return self.inserts < self.min_size

    def room(self) -> int:
        """How many items may be inserted now: the most n with diff + n * spi <= spi * min_size +
        error_buffer (before the first sample, that is min_size plus the error buffer's worth)."""
        if self.spi is None:
            return sys.maxsize
        return max(0, math.floor((self.spi * self.min_size + self.error_buffer - self._diff()) / self.spi))


def successors(r: Rollout) -> np.ndarray:
    """Each step's successor observation [T, B, *input_shape]: the next step's, or where an
    episode ended, its true final observation."""
    next_obs = np.concatenate([r.obs[1:], r.last_obs[None]])
    if len(r.final_idx):
        next_obs[r.final_idx[:, 0], r.final_idx[:, 1]] = r.final_obs
    return next_obs


class NStep:
    """Turns rollouts into n-step transitions, carrying each env's unfinished window across
    rollouts. The replay buffer owns one; an Ape-X runner owns one too, so it can compute its
    transitions' initial priorities before inserting them."""

    def __init__(self, gamma: float, n_step: int):
        self.gamma, self.n_step = gamma, n_step
        # Per (runner, env) stream: the last steps not yet long enough for an n-step transition.
        self.pending: dict[tuple[int, int], deque] = {}

    def __call__(self, r: Rollout, next_obs: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """(obs, actions, rewards, next_obs, discounts) of the transitions this rollout completes
        (``next_obs``: :func:`successors` of ``r``, if the caller has them)."""
        T, B = r.rewards.shape
        next_obs = successors(r) if next_obs is None else next_obs
        if self.n_step == 1:
            return (r.obs.reshape(T * B, *r.obs.shape[2:]), r.actions.reshape(T * B, *r.actions.shape[2:]),
                    r.rewards.reshape(-1), next_obs.reshape(T * B, *r.obs.shape[2:]),
                    np.where(r.terminated, 0.0, self.gamma).reshape(-1).astype(np.float32))
        out: list[tuple] = []
        for b in range(B):
            queue = self.pending.setdefault((r.runner_id, b), deque())
            for t in range(T):
                queue.append((r.obs[t, b], r.actions[t, b], r.rewards[t, b], next_obs[t, b], r.terminated[t, b]))
                if r.terminated[t, b] or r.truncated[t, b]:
                    while queue:  # the episode ended: every pending start gets a shorter window
                        out.append(self._window(queue))
                        queue.popleft()
                elif len(queue) == self.n_step:
                    out.append(self._window(queue))
                    queue.popleft()
        if not out:
            no_obs = np.empty((0, *r.obs.shape[2:]), r.obs.dtype)
            return (no_obs, np.empty((0, *r.actions.shape[2:]), r.actions.dtype),
                    np.empty(0, np.float32), no_obs.copy(), np.empty(0, np.float32))
        obs, actions, rewards, nxt, discounts = zip(*out)
        return (np.stack(obs), np.stack(actions), np.asarray(rewards, np.float32), np.stack(nxt),
                np.asarray(discounts, np.float32))

    def _window(self, queue: deque) -> tuple:
        """The transition starting at queue[0] and spanning the whole queue."""
        reward = sum(self.gamma**i * step[2] for i, step in enumerate(queue))
        discount = 0.0 if queue[-1][4] else self.gamma ** len(queue)
        return queue[0][0], queue[0][1], reward, queue[-1][3], discount

    def get_state(self) -> dict[tuple[int, int], list]:
        """The unfinished windows."""
        return {k: list(v) for k, v in self.pending.items()}

    def set_state(self, pending: dict[tuple[int, int], list]) -> None:
        """Restore :meth:`get_state`."""
        self.pending = {k: deque(v) for k, v in pending.items()}


def compress_rows(values: np.ndarray) -> np.ndarray:
    """Observations [N, ...] as N LZ4 blocks (an object array of ``bytes``), as
    :class:`CompressedRows` keeps them. Ape-X runners compress what they insert themselves: the
    work leaves the shard, which every runner waits on, and an Atari rollout travels to it in
    1/12-1/50 of the bytes."""
    import lz4.block

    values = np.ascontiguousarray(values)
    rows = np.empty(len(values), object)
    rows[:] = [lz4.block.compress(v, store_size=False) for v in values.reshape(len(values), -1)]
    return rows


class CompressedRows:
    """A replay column of observations kept LZ4-compressed, one ``bytes`` per row: indexed with an
    array of slots as the NumPy column it replaces (``column[idx] = rows``, ``column[idx]``).

    Atari's 4 stacked 84x84 frames (28 KB) compressed 12-50x in 3-9 us a row and came back in
    2-16 us (Space Invaders to Pong, lz4.block; zlib at level 1 took ~10x as long for the same
    sizes): a DQN batch of 32 transitions decompresses in well under a millisecond, against tens
    of milliseconds for its update, and 1M transitions fit in a few GB instead of 56. RLlib's
    ``compress_observations`` keeps LZ4 frames the same way."""

    def __init__(self, capacity: int, shape: tuple[int, ...], dtype: Any):
        self.rows = np.empty(capacity, object)
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.row_bytes = int(np.prod(shape)) * self.dtype.itemsize

    def __setitem__(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Store observations [N, *shape], or rows :func:`compress_rows` made of them already."""
        if values.dtype != object:  # the column's dtype and shape, as a NumPy column would insist on
            values = compress_rows(np.asarray(values, self.dtype).reshape(len(idx), *self.shape))
        self.rows[idx] = values

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        import lz4.block

        out = np.empty((len(idx), self.row_bytes), np.uint8)
        for i, row in enumerate(self.rows[idx]):
            out[i] = np.frombuffer(lz4.block.decompress(row, uncompressed_size=self.row_bytes), np.uint8)
        return out.view(self.dtype).reshape(len(idx), *self.shape)

    def nbytes(self, n: int) -> int:
        """Bytes the first ``n`` rows take: each ``bytes`` object whole (its 33-byte header too) and
        its pointer in the column."""
        return sum(map(sys.getsizeof, self.rows[:n])) + n * self.rows.itemsize


def _saved(column: np.ndarray | CompressedRows, n: int) -> np.ndarray:
    """A column's first ``n`` rows for a checkpoint: an array, or the compressed rows as they are."""
    return column.rows[:n].copy() if isinstance(column, CompressedRows) else column[:n].copy()


def _storable(column: np.ndarray | CompressedRows, saved: np.ndarray) -> np.ndarray:
    """:func:`_saved` rows as ``column`` takes them: decompressed for a NumPy column where the
    checkpoint was written with ``compress_observations`` (a CompressedRows column takes
    compressed rows as they are, and compresses arrays)."""
    if saved.dtype == object and not isinstance(column, CompressedRows):
        holder = CompressedRows(len(saved), column.shape[1:], column.dtype)
        holder.rows[:] = saved
        return holder[np.arange(len(saved))]
    return saved


def saved_transitions(states: list[dict[str, Any]], alpha: float) -> dict[str, Any]:
    """The transitions of a saved replay (:meth:`ReplayBuffer.get_state` of each of its shards),
    oldest first: its columns as saved, and each transition's priority (``None`` where the replay
    was uniform). The shards' rows are interleaved by age within their shard, as they were
    written side by side. ``alpha``: the priority exponent, for states that do not record it."""
    order, ages = [], []
    for s in states:
        n, pos = s["size"], s["pos"]
        order.append(np.r_[pos:n, 0:pos])  # a ring buffer: from its oldest row (at pos, once it wrapped)
        ages.append((np.arange(n) + 1) / max(n, 1))
    shard = np.concatenate([np.full(len(o), i) for i, o in enumerate(order)]).astype(np.int64)
    merged = np.argsort(np.concatenate(ages), kind="stable")
    offsets = np.cumsum([0] + [s["size"] for s in states])[:-1]  # of each shard's rows, its columns concatenated
    rows = (np.concatenate(order).astype(np.int64) + offsets[shard])[merged]

    def column(key: str) -> np.ndarray:  # one shard's as it is: a copy of a large replay less
        return states[0][key] if len(states) == 1 else np.concatenate([s[key] for s in states])

    out: dict[str, Any] = {key: column(key)[rows] for key in ("obs", "next_obs", "actions", "rewards", "discounts")}
    out["priorities"] = None
    if all(s["tree"] is not None for s in states):
        leaves = [s["tree"][len(s["tree"]) // 2:][:s["size"]] ** (1.0 / s.get("alpha", alpha)) for s in states]
        out["priorities"] = np.concatenate(leaves)[rows]
    return out


def _restore(column: np.ndarray | CompressedRows, n: int, saved: np.ndarray) -> None:
    """Put :func:`_saved` rows back in the first ``n`` slots."""
    column[np.arange(n)] = _storable(column, saved)


class ReplayBuffer:
    """A ring buffer of n-step transitions; uniform or prioritised (Schaul et al. 2016) sampling.
    With ``compress`` its observations are kept LZ4-compressed (:class:`CompressedRows`)."""

    GATHER_BYTES = 16 << 20  # most bytes one sample_ready call gathers for uniform batches

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype: Any, action_shape: tuple[int, ...],
                 action_dtype: Any, *,
                 gamma: float, n_step: int = 1, prioritized: bool = False, alpha: float = 0.6,
                 priority_eps: float = 1e-6, samples_per_insert: float | None = None,
                 min_size_to_sample: int = 1, error_buffer: float | None = None, seed: int = 0,
                 hindsight: Hindsight | None = None, compress: bool = False):
        self.capacity, self.gamma, self.n_step = capacity, gamma, n_step
        if compress:
            self.obs, self.next_obs = (CompressedRows(capacity, obs_shape, obs_dtype) for _ in range(2))
        else:
            self.obs, self.next_obs = (np.zeros((capacity, *obs_shape), obs_dtype) for _ in range(2))
        self.obs_bytes = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize  # one observation, uncompressed
        self.actions = np.zeros((capacity, *action_shape), action_dtype)
        self.rewards = np.zeros(capacity, np.float32)
        self.discounts = np.zeros(capacity, np.float32)
        self.pos, self.size = 0, 0
        self.prioritized, self.alpha, self.priority_eps = prioritized, alpha, priority_eps
        self.tree = SumTree(capacity) if prioritized else None
        self.max_priority = 1.0
        self.limiter = RateLimiter(samples_per_insert, min_size_to_sample,
                                   error_buffer if error_buffer is not None else max(1.0, samples_per_insert or 1.0))
        self.rng = np.random.default_rng(seed)
        self.nstep = NStep(gamma, n_step)
        self.hindsight = hindsight

    def __len__(self) -> int:
        return self.size

    def stored(self) -> int:
        """Transitions held (a method, so remote shards can be asked)."""
        return self.size

    # -- inserting -------------------------------------------------------------------------
    def add_rollout(self, r: Rollout) -> int:
        """Turn a rollout into n-step transitions and store them, with the hindsight copies of the
        episodes it finishes; returns how many were stored."""
        next_obs = successors(r)
        n = self.add(*self.nstep(r, next_obs))
        if self.hindsight is not None and (relabelled := self.hindsight(r, next_obs)) is not None:
            n += self.add(*relabelled, counted=False)
        return n

    def add(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
            discounts: np.ndarray, priorities: np.ndarray | None = None, counted: bool = True) -> int:
        """Store transitions; returns how many. Prioritised buffers give each its initial priority
        (|TD error| computed by the writer, as Ape-X's actors do) or, without one, the highest
        priority seen, so that it is replayed at least once. Transitions not ``counted`` (hindsight
        copies) leave the rate limiter as it was: updates per env step stay as configured."""
        n = len(rewards)
        idx = (self.pos + np.arange(n)) % self.capacity
        self.obs[idx], self.actions[idx], self.rewards[idx] = obs, actions, rewards
        self.next_obs[idx], self.discounts[idx] = next_obs, discounts
        if self.tree is not None:
            if priorities is None:
                self.tree.update(idx, np.full(n, self.max_priority**self.alpha))
            elif n:
                p = np.abs(priorities) + self.priority_eps
                self.max_priority = max(self.max_priority, float(p.max()))
                self.tree.update(idx, p**self.alpha)
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.capacity, self.size + n)
        self.limiter.inserts += n if counted else 0
        return n

    # -- sampling --------------------------------------------------------------------------
    def can_sample(self, batch_size: int) -> bool:
        """Whether the rate limiter allows drawing ``batch_size`` more transitions now."""
        return self.limiter.can_sample(batch_size)

    def sample(self, batch_size: int, beta: float = 0.4) -> Transitions:
        """Draw a batch of tensors; prioritised buffers also return importance weights (eq. in Sec. 3.4)."""
        return (self._uniform(batch_size, 1)[0] if self.tree is None else self._prioritized(batch_size, beta)).as_tensors()

    def _prioritized(self, batch_size: int, beta: float) -> Transitions:
        """A prioritised batch of NumPy arrays."""
        # Stratified: one draw in each of batch_size equal slices of the total priority.
        total = self.tree.total
        bounds = np.arange(batch_size) * (total / batch_size)
        values = np.minimum(bounds + self.rng.random(batch_size) * (total / batch_size), total * (1 - 1e-12))
        idx = np.minimum(self.tree.find(values), self.size - 1)
        probs = self.tree.get(idx) / total
        weights = (self.size * probs) ** (-beta)
        weights = (weights / weights.max()).astype(np.float32)
        self.limiter.samples += batch_size
        return Transitions(self.obs[idx], self.actions[idx], self.rewards[idx], self.next_obs[idx],
                           self.discounts[idx], weights, idx)

    def admission(self) -> Admission:
        """What the rate limiter lets writers do now (one call for an Ape-X runner)."""
        return Admission(self.limiter.room(), self.limiter.filling())

    def sample_ready(self, batch_size: int, beta: float = 0.4, count: int = 1) -> list[Transitions]:
        """Up to ``count`` batches that the rate limiter allows now (one call for remote shards),
        as NumPy arrays (:meth:`Transitions.as_tensors` makes them the learner's tensors).

        Uniform batches are drawn together: one draw of indices and one gather per column,
        split into views. Between gradient updates a lone batch cost ~95 us against ~27 us each
        drawn 16 at a time (DQN on CartPole, BENCHMARKS.md): the first NumPy and torch calls
        after an update run on cold caches. Prioritised batches are drawn one by one, each after
        the previous batch's priority update.
        """
        if self.tree is not None:
            out = []
            while len(out) < count and self.can_sample(batch_size):
                out.append(self._prioritized(batch_size, beta))
            return out
        row_bytes = 2 * self.obs_bytes + self.actions[:1].nbytes + 8
        count = min(count, max(1, self.GATHER_BYTES // (batch_size * row_bytes)))
        k = 0
        while k < count and self.limiter.can_sample(batch_size * (k + 1)):
            k += 1
        return self._uniform(batch_size, k) if k else []

    def _uniform(self, batch_size: int, k: int) -> list[Transitions]:
        """``k`` uniform batches (NumPy arrays) from one draw of indices and one gather per column;
        the rate limiter is charged for them."""
        idx = self.rng.integers(0, self.size, k * batch_size)
        self.limiter.samples += k * batch_size
        columns = [a[idx] for a in (self.obs, self.actions, self.rewards, self.next_obs, self.discounts)]
        weights = np.ones(batch_size, np.float32)
        # Each batch is views of its own rows of the gathered arrays: sent to a remote learner
        # it pickles those rows only.
        return [Transitions(*(c[i * batch_size:(i + 1) * batch_size] for c in columns), weights,
                            idx[i * batch_size:(i + 1) * batch_size]) for i in range(k)]

    def update_priorities(self, idx: np.ndarray, td_errors: np.ndarray) -> None:
        """New priorities |TD error| + eps for sampled slots."""
        if self.tree is None:
            return
        priorities = np.abs(td_errors) + self.priority_eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(idx, priorities**self.alpha)

    def nbytes(self) -> int:
        """Bytes the stored transitions take (observations as they are kept: compressed or not)."""
        n = self.size
        obs = sum(c.nbytes(n) if isinstance(c, CompressedRows) else n * self.obs_bytes
                  for c in (self.obs, self.next_obs))
        return obs + n * (self.actions[:1].nbytes + self.rewards.itemsize + self.discounts.itemsize)

    # -- checkpoints -----------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Contents and counters, for checkpoints with --save-replay."""
        n = self.size
        return {"obs": _saved(self.obs, n), "next_obs": _saved(self.next_obs, n), "actions": self.actions[:n].copy(),
                "rewards": self.rewards[:n].copy(), "discounts": self.discounts[:n].copy(), "pos": self.pos,
                "size": n, "tree": None if self.tree is None else self.tree.tree.copy(),
                "max_priority": self.max_priority, "inserts": self.limiter.inserts, "samples": self.limiter.samples,
                "rng": self.rng.bit_generator.state, "pending": self.nstep.get_state(),
                "hindsight": None if self.hindsight is None else self.hindsight.get_state(),
                "capacity": self.capacity, "alpha": self.alpha}

    def load(self, t: dict[str, Any]) -> int:
        """Add transitions of another replay (:func:`saved_transitions`, oldest first), the newest
        that fit; returns how many were added. They keep their priorities where both replays are
        prioritised; the rate limiter counts them as inserted up to the size learners start
        sampling at, and no sample drawn yet: updates then follow new env steps, as configured,
        not the loaded count."""
        take = slice(max(0, len(t["rewards"]) - self.capacity), None)
        p = t["priorities"]  # |TD| + eps, as add gives them (None: the highest priority, as add gives it)
        k = self.add(_storable(self.obs, t["obs"][take]), t["actions"][take], t["rewards"][take],
                     _storable(self.next_obs, t["next_obs"][take]), t["discounts"][take],
                     None if p is None else p[take] - self.priority_eps, counted=False)
        self.limiter.inserts, self.limiter.samples = min(self.size, self.limiter.min_size), 0
        return k

    def reset_limiter(self) -> None:
        """Start the rate limiter's counts again (the contents were not restored)."""
        self.limiter.inserts = self.limiter.samples = 0

    def set_state(self, s: dict[str, Any]) -> None:
        """Restore :meth:`get_state`."""
        n = s["size"]
        _restore(self.obs, n, s["obs"])
        _restore(self.next_obs, n, s["next_obs"])
        self.actions[:n] = s["actions"]
        self.rewards[:n], self.discounts[:n] = s["rewards"], s["discounts"]
        self.pos, self.size, self.max_priority = s["pos"], n, s["max_priority"]
        if self.tree is not None and s["tree"] is not None:
            self.tree.tree[:] = s["tree"]
        self.limiter.inserts, self.limiter.samples = s["inserts"], s["samples"]
        self.rng.bit_generator.state = s["rng"]
        self.nstep.set_state(s["pending"])
        if self.hindsight is not None and s.get("hindsight") is not None:
            self.hindsight.set_state(s["hindsight"])


class ShardedReplay:
    """The learner's view of one or more replay shards, each a role on any backend.

    Rollouts go to shard ``runner_id % shards``; batches come round-robin from shards whose rate
    limiter allows them, ``prefetch`` at a time (one remote call fetches several); priority
    updates are sent without waiting (a shard runs its calls in the order they were made).
    """

    def __init__(self, shards: list[Any], prefetch: int = 1):
        self.shards, self.prefetch = shards, prefetch
        self.turn = 0
        self.ready: deque[tuple[int, Transitions]] = deque()

    def add_rollout(self, r: Rollout) -> int:
        """Store a rollout in its runner's shard; returns the transitions stored."""
        shard = self.shards[r.runner_id % len(self.shards)]
        return shard.resolve(shard.call("add_rollout", r))

    def sample(self, batch_size: int, beta: float) -> tuple[int, Transitions] | None:
        """(shard index, batch) from the next shard that can give one, or None if none can."""
        for _ in range(len(self.shards)):
            if self.ready:
                break
            i, self.turn = self.turn, (self.turn + 1) % len(self.shards)
            shard = self.shards[i]
            self.ready.extend((i, b) for b in shard.resolve(shard.call("sample_ready", batch_size, beta, self.prefetch)))
        if not self.ready:
            return None
        i, batch = self.ready.popleft()
        return i, batch.as_tensors()

    def update_priorities(self, shard: int, idx: np.ndarray, td_errors: np.ndarray) -> None:
        """Send new priorities to the shard a batch came from (without waiting)."""
        self.shards[shard].call("update_priorities", idx, td_errors)

    def __len__(self) -> int:
        return sum(s.resolve(s.call("stored")) for s in self.shards)

    def get_state(self) -> list[dict[str, Any]]:
        """Every shard's state, for checkpoints."""
        return [s.resolve(s.call("get_state")) for s in self.shards]

    def set_state(self, states: list[dict[str, Any]]) -> None:
        """Restore :meth:`get_state`."""
        for s, state in zip(self.shards, states):
            s.resolve(s.call("set_state", state))

    def load(self, states: list[dict[str, Any]], alpha: float) -> int:
        """Put the transitions of a saved replay (:meth:`get_state`, of any number of shards and
        any capacity) into these shards, dealt round-robin, oldest first, so that each keeps the
        newest that fit; returns how many they took."""
        t = saved_transitions(states, alpha)
        m = len(self.shards)
        dealt = [{k: None if v is None else v[i::m] for k, v in t.items()} for i in range(m)]
        calls = [(s, s.call("load", d)) for s, d in zip(self.shards, dealt)]  # the shards load at once
        return sum(s.resolve(call) for s, call in calls)

    def forget_counts(self) -> None:
        """After a resume without replay contents: wait for min_size_to_sample new inserts."""
        for s in self.shards:
            s.resolve(s.call("reset_limiter"))
