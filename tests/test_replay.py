"""Replay mechanics: n-step targets, sum-tree sampling, importance weights, rate limiting, round trip."""

import pickle

import numpy as np
import pytest
import torch

from shoal.backends import LocalHandle
from shoal.replay import CompressedRows, RateLimiter, ReplayBuffer, ShardedReplay, SumTree
from shoal.runner import Rollout


def rollout(rewards, terminated, truncated, runner_id=0):
    """One env; observation at step t is [t]; a final observation after step t is [100 + t]."""
    T = len(rewards)
    term = np.array(terminated, bool)[:, None]
    trunc = np.array(truncated, bool)[:, None]
    final_idx = np.argwhere(term | trunc)
    return Rollout(obs=np.arange(T, dtype=np.float32).reshape(T, 1, 1), actions=np.zeros((T, 1), np.int64),
                   logp=np.zeros((T, 1), np.float32), rewards=np.array(rewards, np.float32)[:, None],
                   terminated=term, truncated=trunc, last_obs=np.array([[float(T)]], np.float32),
                   final_idx=final_idx, final_obs=np.array([[100.0 + t] for t, _ in final_idx], np.float32),
                   policy_id="default", policy_version=0, runner_id=runner_id, obs_moments=None)


def stored(buf):
    return {float(buf.obs[i, 0]): (float(buf.rewards[i]), float(buf.next_obs[i, 0]), float(buf.discounts[i]))
            for i in range(len(buf))}


def test_n_step_targets_respect_termination_and_truncation():
    g = 0.5
    buf = ReplayBuffer(100, (1,), np.float32, (), np.int64, gamma=g, n_step=3)
    # steps 0..2 end in termination at t=2; steps 3..4 end in truncation at t=4; steps 5..6 continue.
    buf.add_rollout(rollout([1, 2, 4, 8, 16, 32, 64], [0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0]))
    got = stored(buf)
    assert got[0.0] == (1 + g * 2 + g**2 * 4, 102.0, 0.0)  # terminated: no bootstrap
    assert got[1.0] == (2 + g * 4, 102.0, 0.0)
    assert got[2.0] == (4, 102.0, 0.0)
    assert got[3.0] == (8 + g * 16, 104.0, g**2)  # truncated: bootstrap from the true final obs
    assert got[4.0] == (16, 104.0, g)
    assert 5.0 not in got  # only 2 steps of the running episode so far: waits for a third
    buf.add_rollout(rollout([128], [0], [0]))  # the next rollout completes it (obs index restarts at 0)
    assert stored(buf)[5.0] == (32 + g * 64 + g**2 * 128, 1.0, g**3)


def test_one_step_transitions_bootstrap_unless_terminated():
    buf = ReplayBuffer(10, (1,), np.float32, (), np.int64, gamma=0.9)
    buf.add_rollout(rollout([1, 1, 1], [0, 1, 0], [1, 0, 0]))
    got = stored(buf)
    assert got[0.0] == (1.0, 100.0, pytest.approx(0.9))  # truncated at t=0: next is the final obs
    assert got[1.0] == (1.0, 101.0, 0.0)
    assert got[2.0] == (1.0, 3.0, pytest.approx(0.9))  # the rollout's last step: next is last_obs


def test_sum_tree_samples_in_proportion_to_priority():
    rng = np.random.default_rng(0)
    tree = SumTree(5)
    priorities = np.array([1.0, 2.0, 3.0, 4.0, 0.0])
    tree.update(np.arange(5), priorities)
    assert tree.total == pytest.approx(10.0)
    n = 200_000
    counts = np.bincount(tree.find(rng.random(n) * tree.total), minlength=tree.leaves)[:5]
    expected = n * priorities / priorities.sum()
    chi2 = ((counts[:4] - expected[:4]) ** 2 / expected[:4]).sum()
    assert counts[4] == 0
    assert chi2 < 16.3  # 99.9% quantile of chi-square with 3 degrees of freedom


def test_importance_weights_and_priority_updates():
    buf = ReplayBuffer(8, (1,), np.float32, (), np.int64, gamma=0.9, prioritized=True, alpha=1.0, priority_eps=0.0, seed=1)
    buf.add_rollout(rollout([0] * 4, [0] * 4, [0] * 4))
    buf.update_priorities(np.arange(4), np.array([1.0, 1.0, 1.0, 5.0]))
    batch = buf.sample(4, beta=1.0)
    p = np.array([1, 1, 1, 5])[batch.indices] / 8.0
    expected = (4 * p) ** -1.0
    np.testing.assert_allclose(batch.weights.numpy(), expected / expected.max(), rtol=1e-6)
    assert buf.max_priority == 5.0


def test_rate_limiter_blocks_and_unblocks():
    lim = RateLimiter(samples_per_insert=4, min_size_to_sample=10, error_buffer=4)
    lim.inserts = 9
    assert not lim.can_sample(1)  # below the minimum size
    lim.inserts = 10
    assert lim.can_sample(4) and not lim.can_sample(5)  # only the error buffer's worth yet
    lim.samples = 4
    assert not lim.can_sample(1) and lim.room() == 2  # 2 inserts may come, not 3
    lim.inserts += 1  # one insert buys samples_per_insert samples
    assert lim.can_sample(4) and not lim.can_sample(5)
    assert RateLimiter(None, 1, 0).room() >= 10**9


def test_replay_state_round_trip():
    buf = ReplayBuffer(16, (1,), np.float32, (), np.int64, gamma=0.9, n_step=2, prioritized=True, seed=3)
    buf.add_rollout(rollout([1, 2, 3, 4, 5], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]))
    buf.update_priorities(np.arange(len(buf)), np.arange(len(buf), dtype=float) + 1)
    copy = ReplayBuffer(16, (1,), np.float32, (), np.int64, gamma=0.9, n_step=2, prioritized=True, seed=99)
    copy.set_state(buf.get_state())
    a, b = buf.sample(8), copy.sample(8)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.weights.numpy(), b.weights.numpy())
    buf.add_rollout(rollout([6], [0], [0]))
    copy.add_rollout(rollout([6], [0], [0]))  # the pending step carried over completes the same way
    assert stored(buf) == stored(copy)


def test_writer_priorities_set_sampling_frequencies():
    buf = ReplayBuffer(4, (1,), np.float32, (), np.int64, gamma=0.9, prioritized=True, alpha=1.0, priority_eps=0.0, seed=2)
    obs = np.arange(4, dtype=np.float32)[:, None]
    buf.add(obs, np.zeros(4, np.int64), np.zeros(4, np.float32), obs, np.full(4, 0.9, np.float32),
            priorities=np.array([1.0, 0.0, 3.0, 4.0]))
    assert buf.max_priority == 4.0
    counts = np.bincount(np.concatenate([buf.sample(8).indices for _ in range(5000)]), minlength=4)
    assert counts[1] == 0
    np.testing.assert_allclose(counts / counts.sum(), [1 / 8, 0, 3 / 8, 4 / 8], atol=0.01)


def test_n_step_assembly_is_the_same_in_a_runner_and_in_the_buffer():
    from shoal.replay import NStep

    a = ReplayBuffer(100, (1,), np.float32, (), np.int64, gamma=0.5, n_step=3)
    b = ReplayBuffer(100, (1,), np.float32, (), np.int64, gamma=0.5, n_step=3)
    nstep = NStep(0.5, 3)
    for r in (rollout([1, 2, 4, 8], [0, 0, 1, 0], [0, 0, 0, 0]), rollout([16, 32, 64], [0, 0, 0], [0, 1, 0])):
        a.add_rollout(r)
        b.add(*nstep(r))
    assert stored(a) == stored(b) and len(a) == 6


@pytest.mark.parametrize("prioritized", [False, True])
def test_batches_drawn_together_are_the_rate_limiters_count_of_real_transitions(prioritized):
    """Uniform batches come from one gather split into views: as many as drawing one at a time
    would give, each row a stored transition, the limiter charged for each."""
    rng = np.random.default_rng(0)
    for inserted, count in ((40, 16), (55, 3), (70, 16), (9, 16)):
        buf = ReplayBuffer(128, (2,), np.float32, (), np.int64, gamma=0.9, prioritized=prioritized, samples_per_insert=0.5,
                           min_size_to_sample=10, error_buffer=4, seed=1)
        obs = rng.normal(size=(inserted, 2)).astype(np.float32)
        buf.add(obs, np.arange(inserted), np.arange(inserted, dtype=np.float32), obs + 1, np.full(inserted, 0.9, np.float32))
        one_by_one = 0
        samples = buf.limiter.samples
        while one_by_one < count and buf.limiter.can_sample(4 * (one_by_one + 1)):
            one_by_one += 1
        batches = buf.sample_ready(4, count=count)
        allowed = max(0, int((inserted * 0.5 - 5 + 4) // 4)) if inserted >= 10 else 0  # by hand
        assert len(batches) == one_by_one == min(count, allowed)
        assert buf.limiter.samples == samples + 4 * len(batches)
        for b in batches:  # NumPy arrays, as they travel from a shard
            rows = b.actions
            np.testing.assert_array_equal(b.obs, obs[rows])
            np.testing.assert_array_equal(b.next_obs, obs[rows] + 1)
            np.testing.assert_array_equal(b.rewards, rows.astype(np.float32))
            np.testing.assert_array_equal(b.indices, rows)
            assert b.obs.shape == (4, 2) and b.weights.shape == (4,)
        assert len(buf.sample_ready(4, count=count)) == min(count, allowed - len(batches))  # the rest


def test_a_batch_drawn_with_others_pickles_its_own_rows_only():
    """Sent to a remote learner (Ape-X fetches 8 at a time), a batch must not carry the gather."""
    buf = ReplayBuffer(1024, (256,), np.float32, (), np.int64, gamma=0.9, seed=0)
    n = 1000
    buf.add(np.ones((n, 256), np.float32), np.zeros(n, np.int64), np.zeros(n, np.float32), np.ones((n, 256), np.float32),
            np.ones(n, np.float32))
    batches = buf.sample_ready(32, count=8)
    alone = len(pickle.dumps(buf.sample(32)))  # ~65 KB of observations
    assert len(batches) == 8 and len(pickle.dumps(batches[3])) < 1.1 * alone
    assert len(pickle.dumps(batches)) < 8.5 * alone


def test_batches_travel_as_arrays_and_reach_the_learner_as_tensors():
    """A shard hands out NumPy arrays (Ray sends them out-of-band; tensors go through torch's
    pickling); the learner's view of the shards wraps them as tensors."""
    from shoal.backends import LocalHandle
    from shoal.replay import ShardedReplay

    for prioritized in (False, True):
        buf = ReplayBuffer(64, (1,), np.float32, (), np.int64, gamma=0.9, prioritized=prioritized, seed=3)
        buf.add(np.arange(64, dtype=np.float32)[:, None], np.arange(64), np.zeros(64, np.float32),
                np.zeros((64, 1), np.float32), np.ones(64, np.float32))
        sent = buf.sample_ready(4, count=2)
        assert all(isinstance(a, np.ndarray) for b in sent for a in b)
        _, batch = ShardedReplay([LocalHandle(buf)], prefetch=2).sample(4, 0.4)
        assert all(isinstance(a, torch.Tensor) for a in batch[:6]) and isinstance(batch.indices, np.ndarray)
        np.testing.assert_array_equal(batch.obs[:, 0].numpy(), batch.indices)
        assert batch.weights.dtype == torch.float32


def test_read_only_arrays_become_writable_tensors():
    """Ray hands a batch's arrays over read-only; the learner's tensors must not share them."""
    import warnings

    from shoal.replay import Transitions

    arrays = [np.ones((2, 3), np.float32), np.zeros(2, np.int64), *(np.ones(2, np.float32) for _ in range(4))]
    for a in arrays[:3]:
        a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it wraps a read-only array
        batch = Transitions(*arrays, np.arange(2)).as_tensors()
    batch.obs.add_(1)
    assert float(batch.obs.sum()) == 12 and float(arrays[0].sum()) == 6


def frames(n, seed=0):
    """Atari-like uint8 observations [n, 4, 42, 42]: a dark screen with a bright block per frame."""
    rng = np.random.default_rng(seed)
    obs = np.zeros((n, 4, 42, 42), np.uint8)
    for i, (y, x) in enumerate(rng.integers(0, 36, (n, 2))):
        obs[i, :, y:y + 6, x:x + 6] = rng.integers(100, 256)
    return obs


def filled(compress, prioritized, seed=5):
    buf = ReplayBuffer(64, (4, 42, 42), np.uint8, (), np.int64, gamma=0.9, prioritized=prioritized, seed=seed,
                       compress=compress)
    for k in range(3):  # 90 transitions in a ring of 64: it wraps
        obs = frames(31, seed=k)
        buf.add(obs[:-1], np.arange(30) % 4, np.ones(30, np.float32), obs[1:], np.full(30, 0.9, np.float32))
    return buf


def assert_same_batches(a, b, prioritized):
    for _ in range(3):
        x, y = a.sample_ready(16, count=4), b.sample_ready(16, count=4)
        assert len(x) == len(y) > 0
        for p, q in zip(x, y):
            for column_p, column_q in zip(p, q):
                np.testing.assert_array_equal(column_p, column_q)
            if prioritized:
                a.update_priorities(p.indices, np.arange(16.0))
                b.update_priorities(q.indices, np.arange(16.0))


@pytest.mark.parametrize("prioritized", [False, True])
def test_compressed_observations_are_stored_and_drawn_bit_for_bit_in_a_fraction_of_the_memory(prioritized):
    plain, packed = filled(False, prioritized), filled(True, prioritized)
    assert isinstance(packed.obs, CompressedRows) and packed.obs.rows[0] is not None
    assert_same_batches(plain, packed, prioritized)
    assert plain.nbytes() == 64 * (2 * 4 * 42 * 42 + 8 + 4 + 4)
    assert packed.nbytes() < plain.nbytes() / 10  # 1-2 KB a transition against 14 KB


@pytest.mark.parametrize("saved_compressed", [False, True])
def test_replay_state_restores_into_a_buffer_with_the_other_compression_setting(saved_compressed):
    source = filled(saved_compressed, prioritized=True)
    state = source.get_state()
    assert (state["obs"].dtype == object) == saved_compressed
    if saved_compressed:  # a checkpoint keeps the compressed rows as they are
        assert len(pickle.dumps(state)) < 64 * 2 * 4 * 42 * 42 / 10
    for compress in (False, True):
        copy = ReplayBuffer(64, (4, 42, 42), np.uint8, (), np.int64, gamma=0.9, prioritized=True, seed=0,
                            compress=compress)
        copy.set_state(state)
        twin = filled(saved_compressed, prioritized=True)
        twin.set_state(state)
        assert_same_batches(twin, copy, prioritized=True)


def numbered(capacity, count, prioritized=False, compress=False, seed=0):
    """A buffer that was given transitions 0..count-1 (obs [i], reward i, priority i + 1), one at a
    time: a ring of ``capacity`` that wrapped where count exceeds it."""
    buf = ReplayBuffer(capacity, (1,), np.float32, (), np.int64, gamma=0.9, prioritized=prioritized, alpha=0.5,
                       priority_eps=0.0, seed=seed, compress=compress)
    for i in range(count):
        buf.add(np.array([[i]], np.float32), np.array([i % 2]), np.array([i], np.float32),
                np.array([[i + 1]], np.float32), np.array([0.9], np.float32), priorities=np.array([i + 1.0]))
    return buf


def contents(buf):
    """The transitions a buffer holds, oldest first, by their number."""
    order = np.r_[buf.pos:len(buf), 0:buf.pos]
    return [float(r) for r in buf.rewards[order]]


@pytest.mark.parametrize("capacity, expect", [(5, list(range(8, 13))), (16, list(range(5, 13)))])
def test_a_saved_replay_loads_into_another_capacity_newest_kept_and_in_order(capacity, expect):
    source = numbered(8, 13)  # wrapped: holds 5..12, its oldest at pos 5
    copy = ReplayBuffer(capacity, (1,), np.float32, (), np.int64, gamma=0.9)
    shards = ShardedReplay([LocalHandle(copy)])
    assert shards.load([source.get_state()], alpha=0.6) == len(expect)
    assert contents(copy) == expect
    np.testing.assert_array_equal(copy.next_obs[:len(copy), 0], copy.obs[:len(copy), 0] + 1)  # rows whole
    for i in range(13, 15):  # new transitions follow the loaded ones; none of the slots read is empty
        copy.add(np.array([[i]], np.float32), np.array([0]), np.array([i], np.float32),
                 np.array([[i + 1]], np.float32), np.array([0.9], np.float32))
    assert contents(copy) == (expect + [13, 14])[-capacity:]
    assert set(copy.sample(64).rewards.tolist()) <= set(expect + [13, 14])


def test_loaded_transitions_keep_their_priorities_and_a_uniform_replays_get_the_highest():
    source = numbered(8, 8, prioritized=True)
    copy = ReplayBuffer(8, (1,), np.float32, (), np.int64, gamma=0.9, prioritized=True, alpha=1.0, priority_eps=0.0)
    ShardedReplay([LocalHandle(copy)]).load([source.get_state()], alpha=0.6)  # the state names its own alpha, 0.5
    np.testing.assert_allclose(copy.tree.get(np.arange(8)), np.arange(8) + 1.0)  # priorities i + 1, at alpha 1
    rewards = copy.sample(20_000).rewards.numpy()
    np.testing.assert_allclose(np.bincount(rewards.astype(int), minlength=8) / 20_000, (np.arange(8) + 1) / 36,
                               atol=0.015)
    uniform = ReplayBuffer(8, (1,), np.float32, (), np.int64, gamma=0.9, prioritized=True, alpha=1.0)
    uniform.update_priorities(np.array([0]), np.array([7.0]))  # the highest seen so far: 7
    ShardedReplay([LocalHandle(uniform)]).load([numbered(8, 4).get_state()], alpha=0.6)
    np.testing.assert_allclose(uniform.tree.get(np.arange(4)), 7.0, rtol=1e-5)


def test_a_sharded_replay_loads_into_another_number_of_shards_dealt_in_age_order():
    two = [numbered(4, 6), numbered(4, 3)]  # shard 0 holds 2..5 (wrapped), shard 1 holds 0..2
    for r in two[1:]:
        r.rewards[:3] += 100  # tell the shards apart: 100..102
    three = [ReplayBuffer(8, (1,), np.float32, (), np.int64, gamma=0.9) for _ in range(3)]
    assert ShardedReplay([LocalHandle(b) for b in three]).load([b.get_state() for b in two], alpha=0.6) == 7
    held = [contents(b) for b in three]
    assert sorted(sum(held, [])) == [2, 3, 4, 5, 100, 101, 102]
    for shard in held:  # each shard's rows stay in the order they were written
        assert [r for r in shard if r < 100] == sorted(r for r in shard if r < 100)
        assert [r for r in shard if r >= 100] == sorted(r for r in shard if r >= 100)
    one = ReplayBuffer(3, (1,), np.float32, (), np.int64, gamma=0.9)
    ShardedReplay([LocalHandle(one)]).load([b.get_state() for b in two], alpha=0.6)
    assert contents(one) == [4, 5, 102]  # the newest, by age within their shards (2 3 4 5 | 100 101 102)


@pytest.mark.parametrize("saved_compressed, compress", [(True, False), (False, True), (True, True)])
def test_loaded_observations_convert_between_compression_settings(saved_compressed, compress):
    source = filled(saved_compressed, prioritized=False)
    copy = ReplayBuffer(100, (4, 42, 42), np.uint8, (), np.int64, gamma=0.9, compress=compress)
    assert ShardedReplay([LocalHandle(copy)]).load([source.get_state()], alpha=0.6) == 64
    order = np.r_[source.pos:64, 0:source.pos]
    np.testing.assert_array_equal(copy.obs[np.arange(64)], source.obs[order])
    np.testing.assert_array_equal(copy.next_obs[np.arange(64)], source.next_obs[order])


def test_the_rate_limiter_counts_loaded_transitions_as_a_filled_buffer_not_as_owed_updates():
    copy = ReplayBuffer(64, (1,), np.float32, (), np.int64, gamma=0.9, samples_per_insert=4, min_size_to_sample=10,
                        error_buffer=4)
    ShardedReplay([LocalHandle(copy)]).load([numbered(64, 40).get_state()], alpha=0.6)
    assert not copy.limiter.filling()
    assert copy.can_sample(4) and not copy.can_sample(5)  # the error buffer's worth, not 40 x 4 samples
    few = ReplayBuffer(64, (1,), np.float32, (), np.int64, gamma=0.9, samples_per_insert=4, min_size_to_sample=10,
                       error_buffer=4)
    ShardedReplay([LocalHandle(few)]).load([numbered(64, 6).get_state()], alpha=0.6)
    assert few.limiter.filling() and few.limiter.inserts == 6  # 4 new transitions to go
