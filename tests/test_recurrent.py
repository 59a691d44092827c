"""Recurrent policies (lstm_size): the learner replays exactly what the runners computed, memory
carries across rollouts and resets at episode ends, a task that needs memory is learned, and
what cannot carry a memory refuses in one line."""

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

import shoal
from shoal.errors import ShoalError
from shoal.onpolicy import episode_segments


class Recall(gym.Env):
    """A cue of -1 or +1 at the first step, ``delay`` blank steps, then a query: the action must
    name the cue (+1), else -1. Without a memory the best a policy can do is 0 on average."""

    def __init__(self, delay: int = 8):
        self.delay = delay
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(2)), 0
        return np.array([2.0 * self.cue - 1, 0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t <= self.delay:
            return np.array([0.0, float(self.t == self.delay)], np.float32), 0.0, False, False, {}
        return np.zeros(2, np.float32), 1.0 if int(action) == self.cue else -1.0, True, False, {}


if "RecallTest-v0" not in gym.registry:
    gym.register("RecallTest-v0", entry_point=Recall)


def test_episode_segments_lay_out_episodes_with_their_final_and_last_observations():
    # 2 envs, 4 steps; env 0's episode ends at t=1, env 1's at t=3 (its last step)
    done = np.array([[0, 0], [1, 0], [0, 0], [0, 1]], bool)
    segments, first = episode_segments(done)
    # rows t * 2 + b; columns: env 0 from its memory, env 0's new episode, env 1 from its memory
    np.testing.assert_array_equal(segments, [[0, 4, 1], [2, 6, 3], [-1, -1, 5], [-1, -1, 7]])
    np.testing.assert_array_equal(first, [0, -1, 1])
    final_rows = np.full((4, 2), -1)
    final_rows[1, 0], final_rows[3, 1] = 8, 9
    segments, first = episode_segments(done, final_rows, np.array([10, 11]))
    # a final observation follows its episode's last step; env 1's last observation starts afresh
    assert segments[:, 0].tolist() == [0, 2, 8, -1, -1] and segments[:, 1].tolist() == [4, 6, 10, -1, -1]
    assert segments[:, 2].tolist() == [1, 3, 5, 7, 9] and segments[:, 3].tolist() == [11, -1, -1, -1, -1]
    np.testing.assert_array_equal(first, [0, -1, 1, -1])


def test_the_learner_replays_what_the_runner_computed_step_by_step(tiny):
    """Log-probabilities, values, bootstrap values: the learner's sequences, cut at episode ends,
    started from the memory each rollout began with, give what the acting path gave."""
    config = tiny(lstm_size=16, num_envs_per_runner=4, rollout_steps=64, minibatch_size=128)
    with shoal.make(config) as algo:
        learner, runner = algo.learner.obj, algo.runners[0].obj
        runner.sample(64)  # the next rollout starts mid-episode, with a memory
        module = copy.deepcopy(runner.policy)
        rollout = runner.sample(64)
        done = rollout.terminated | rollout.truncated
        assert done.sum() >= 4 and np.abs(rollout.memory[0]).sum() > 0
        # the acting path, step by step, from the rollout's first memory
        module.memory = tuple(torch.as_tensor(x) for x in rollout.memory)
        values, finals = [], {}
        with torch.no_grad():
            for t in range(64):
                values.append(module.critic_value(module.features(torch.as_tensor(rollout.obs[t]))))
                for k, (tk, b) in enumerate(rollout.final_idx):
                    if tk == t:  # the final observation, seen with the memory of the episode's last step
                        memory = tuple(x[b: b + 1] for x in module.memory)
                        h = module._lstm_step(module.encoder(torch.as_tensor(rollout.final_obs[k: k + 1])), memory)[0]
                        finals[(t, b)] = float(module.critic_value(h)[0])
                module.forget(done[t])
            for a, b in zip(module.memory, runner.policy.memory):  # the runner goes on from the same memory
                torch.testing.assert_close(a, b)
            last = module.critic_value(module.features(torch.as_tensor(rollout.last_obs)))
        stack = learner.stack([rollout])
        torch.testing.assert_close(stack["values"], torch.stack(values), atol=1e-5, rtol=0)
        expected_next = torch.cat([torch.stack(values)[1:], last[None]])
        for (t, b), v in finals.items():
            expected_next[t, b] = v if rollout.truncated[t, b] else 0.0
        torch.testing.assert_close(stack["next_values"], expected_next, atol=1e-5, rtol=0)
        batch = learner.gae_batch([rollout])
        with torch.no_grad():
            torch.testing.assert_close(learner.evaluate(batch)[0], batch["logp"], atol=1e-5, rtol=0)
            minibatches = learner.minibatches(batch, 128)
            assert [len(idx) for idx in minibatches] == [128, 128]  # 2 envs' 64 steps each
            for idx in minibatches:
                torch.testing.assert_close(learner.evaluate(batch, idx)[0], batch["logp"][idx], atol=1e-5, rtol=0)


def test_ppo_with_an_lstm_learns_a_task_that_needs_memory(tmp_path):
    """Recall the cue of 8 steps before: 1.0 with an LSTM, in 6k-10k steps on seeds 0-2 (~4 s);
    the same PPO without one cannot do better than chance."""
    settings = dict(env="RecallTest-v0", num_envs_per_runner=8, rollout_steps=32, minibatch_size=256, num_epochs=10,
                    lr=1e-3, total_steps=16_384, eval_interval=2048, eval_episodes=20, stop_return=1.0,
                    progress=False, tensorboard=False, seed=0)
    summary = shoal.train(shoal.PPOConfig(lstm_size=32, **settings), run_dir=tmp_path / "lstm")
    assert summary["best_eval_return"] == 1.0, summary
    feed_forward = shoal.train(shoal.PPOConfig(**{**settings, "total_steps": 6144}), run_dir=tmp_path / "mlp")
    assert feed_forward["best_eval_return"] <= 0.5, feed_forward
    # deployed, the policy remembers across act() calls; reset() starts new episodes
    policy = shoal.load_policy(summary["checkpoint"])
    env = gym.vector.SyncVectorEnv([lambda: Recall()] * 6, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    for seed in (0, 1):
        obs, _ = env.reset(seed=seed)
        policy.reset()
        returns = np.zeros(6)
        for _ in range(9):
            obs, r, term, trunc, _ = env.step(policy.act(obs))
            returns += r
            policy.reset(term | trunc)
        assert (returns == 1.0).all(), returns
    with pytest.raises(ShoalError, match="recurrent"):
        from shoal.remote.policyserver import PolicyServer

        PolicyServer({"default": summary["checkpoint"]})


def test_trpo_refuses_an_lstm():
    with pytest.raises(ShoalError, match="trpo trains feed-forward policies only"):
        shoal.make_config("trpo", "CartPole-v1", lstm_size=16)


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_vtrace_learners_replay_the_runners_sequences(algo):
    """IMPALA's and APPO's target log-probabilities (the learner's network replaying each env's
    rollout from the memory the runner began it with) equal the behaviour ones at equal weights,
    for the whole batch and for minibatches of whole sequences."""
    config = shoal.make_config(algo, "CartPole-v1", lstm_size=16, num_envs_per_runner=4, rollout_steps=64,
                               minibatch_size=128, progress=False, tensorboard=False, torch_threads=1)
    with shoal.make(config) as algo_:
        learner, runner = algo_.learner.obj, algo_.runners[0].obj
        runner.sample(64)  # the next rollout starts mid-episode, with a memory
        rollout = runner.sample(64)
        assert np.abs(rollout.memory[0]).sum() > 0 and (rollout.terminated | rollout.truncated).sum() >= 4
        b = learner.vtrace_batch([rollout])
        torch.testing.assert_close(b["logp"], b["behaviour_logp"], atol=1e-5, rtol=0)
        with torch.no_grad():
            for idx in learner.minibatches(b, 128):
                assert len(idx) == 128
                torch.testing.assert_close(learner.evaluate(b, idx)[0], b["behaviour_logp"][idx], atol=1e-5, rtol=0)
        learner.learn([rollout])  # and a step of training on it


def test_appo_with_an_lstm_learns_a_task_that_needs_memory(tmp_path):
    """Recall (8 steps): 1.0 by 14k-20k steps on seeds 0 and 1 (~7 s); without the LSTM APPO had
    0.3 at 12k."""
    from shoal.algos.appo import APPOConfig

    config = APPOConfig(env="RecallTest-v0", lstm_size=32, num_envs_per_runner=8, rollout_steps=32, lr=1e-3,
                        total_steps=40_960, eval_interval=2048, eval_episodes=20, stop_return=1.0, progress=False,
                        tensorboard=False, seed=0)
    assert shoal.train(config, run_dir=tmp_path)["best_eval_return"] == 1.0


def test_central_inference_refuses_an_lstm(tiny):
    with pytest.raises(ShoalError, match="cannot serve a recurrent policy"):
        tiny(lstm_size=16, inference="central")
