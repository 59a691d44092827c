"""Recurrent policies (lstm_size): the learner replays exactly what the runners computed, memory
carries across rollouts and resets at episode ends, a task that needs memory is learned (and played
with the memory held by the caller: act_with_memory, the policy server), and
what cannot carry a memory refuses in one line."""

import copy
import re

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


OWN_CRITIC_ENCODER = {"encoder": "user_encoders:Tanh", "encoder_kwargs": {"width": 8}, "share_encoder": False}


@pytest.mark.parametrize("inference, sets", [("local", {}), ("central", {}), ("local", OWN_CRITIC_ENCODER)],
                         ids=["local", "central", "own-critic-encoder"])
def test_the_learner_replays_what_the_runner_computed_step_by_step(tiny, inference, sets):
    """Log-probabilities, values, bootstrap values: the learner's sequences, cut at episode ends,
    started from the memory each rollout began with, give what the acting path gave. With
    central inference the runner holds its envs' memory and the server steps it, each runner's
    rows from their own. With a critic's own encoder each LSTM reads its own encoder's features."""
    config = tiny(lstm_size=16, num_envs_per_runner=4, rollout_steps=64, minibatch_size=128, inference=inference,
                  **sets)
    with shoal.make(config) as algo:
        learner, runner = algo.learner.obj, algo.runners[0].obj
        runner.sample(64)  # the next rollout starts mid-episode, with a memory
        acting = algo.inference[0].obj.policy if inference == "central" else runner.policy  # who holds the weights
        module = copy.deepcopy(acting)
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
                        h = module._lstm_step(module.encode(torch.as_tensor(rollout.final_obs[k: k + 1])), memory)[0]
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
            assert [len(idx) for idx, _ in minibatches] == [128, 128]  # 2 envs' 64 steps each
            for idx, envs in minibatches:
                np.testing.assert_array_equal(idx[:2].numpy(), envs)  # the envs whose sequences they are
                torch.testing.assert_close(learner.evaluate(batch, idx, envs)[0], batch["logp"][idx], atol=1e-5,
                                           rtol=0)


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
    # the memory held by the caller: act_with_memory in Python, and the policy server's clients
    play = lambda act, memory: recall_returns(env, act, memory)  # noqa: E731
    assert (play(lambda obs, m: policy.act_with_memory(obs, m), None) == 1.0).all()
    serve_a_recurrent_policy(summary["checkpoint"], env, play)


def recall_returns(env, act, memory) -> np.ndarray:
    """Returns of 6 Recall episodes played by ``act(obs, memory) -> (actions, memory)``, each
    env's memory zeroed when its episode ends."""
    obs, _ = env.reset(seed=2)
    returns = np.zeros(6)
    for _ in range(9):
        actions, memory = act(obs, memory)
        obs, r, term, trunc, _ = env.step(actions)
        returns += r
        memory = tuple(np.where((term | trunc)[:, None], 0.0, m) for m in memory)
    return returns


def serve_a_recurrent_policy(checkpoint, env, play) -> None:
    """The policy server answers a recurrent policy's clients from the memory each sends: unary
    calls, a stream, and several clients batched into one forward pass; a request without its
    memory, or with a memory of the wrong shape, is refused with its reason, and the server goes on."""
    import threading

    import grpc

    from shoal.remote.policyserver import PolicyClient, PolicyServer, initial_memory

    server = PolicyServer({"default": checkpoint}, port=0, max_batch=8, max_wait_ms=20).start()
    try:
        client = PolicyClient(server.address)
        info = client.describe()
        assert info.lstm_size == 32
        unary = lambda obs, m: (lambda a, _, m: (a, m))(*client.act_with_memory(obs, m))  # noqa: E731
        assert (play(unary, initial_memory(info, 6)) == 1.0).all()
        stream = client.stream()
        streamed = lambda obs, m: (lambda a, _, m: (a, m))(*stream.act_with_memory(obs, m))  # noqa: E731
        assert (play(streamed, initial_memory(info, 6)) == 1.0).all()
        stream.close()
        # clients of one observation each, at once: their rows share forward passes, each its own memory
        envs = [gym.vector.SyncVectorEnv([lambda: Recall()], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
                for _ in range(6)]
        results = [None] * 6

        def one_client(i):
            c = PolicyClient(server.address)
            results[i] = recall_returns_of_one(envs[i], c, initial_memory(info), seed=i)

        threads = [threading.Thread(target=one_client, args=(i,)) for i in range(6)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert results == [1.0] * 6, results
        for memory, message in ((None, "this policy is recurrent (lstm_size 32): send its memory"),
                                (initial_memory(info, 5), "lstm_h must have shape [6, 64] for these observations"),
                                ((np.full((6, 64), np.nan, np.float32),) * 2, "lstm_h must be finite")):
            with pytest.raises(shoal.ServerError, match=re.escape(message)) as e:
                client.act_with_memory(np.zeros((6, 2), np.float32), memory)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.act_with_memory(np.zeros(2, np.float32), initial_memory(info))[2][0].shape == (64,)
    finally:
        server.stop(grace=0)


def recall_returns_of_one(env, client, memory, seed: int) -> float:
    """One Recall episode played by a policy server's client, one observation per request."""
    obs, _ = env.reset(seed=seed)
    total = 0.0
    for _ in range(9):
        action, _, memory = client.act_with_memory(obs[0], memory)
        obs, r, term, trunc, _ = env.step(np.array([action]))
        total += float(r[0])
        if term[0] or trunc[0]:
            break
    return total


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
            for idx, envs in learner.minibatches(b, 128):
                assert len(idx) == 128
                torch.testing.assert_close(learner.evaluate(b, idx, envs)[0], b["behaviour_logp"][idx], atol=1e-5,
                                           rtol=0)
        learner.learn([rollout])  # and a step of training on it


def test_appo_with_an_lstm_learns_a_task_that_needs_memory(tmp_path):
    """Recall (8 steps): 1.0 by 14k-20k steps on seeds 0 and 1 (~7 s); without the LSTM APPO had
    0.3 at 12k."""
    from shoal.algos.appo import APPOConfig

    config = APPOConfig(env="RecallTest-v0", lstm_size=32, num_envs_per_runner=8, rollout_steps=32, lr=1e-3,
                        total_steps=40_960, eval_interval=2048, eval_episodes=20, stop_return=1.0, progress=False,
                        tensorboard=False, seed=0)
    assert shoal.train(config, run_dir=tmp_path)["best_eval_return"] == 1.0


def test_ppo_with_an_lstm_learns_recall_through_central_inference(tmp_path):
    """The runners hold their envs' memories and send them with each step's observations; the
    inference server steps them: Recall is learned as with local inference."""
    config = shoal.PPOConfig(env="RecallTest-v0", lstm_size=32, inference="central", num_envs_per_runner=8,
                             rollout_steps=32, minibatch_size=256, num_epochs=10, lr=1e-3, total_steps=16_384,
                             eval_interval=2048, eval_episodes=20, stop_return=1.0, progress=False,
                             tensorboard=False, seed=0)
    assert shoal.train(config, run_dir=tmp_path)["best_eval_return"] == 1.0
