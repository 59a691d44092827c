"""--device: a learner trains where it says and computes there what it computes on the CPU.

CI has no GPU, so the learners run on ``fakegpu`` (tests/fake_device.py), a device that computes
on the CPU but fails wherever a tensor on the CPU meets one on the device, a device tensor is
read as NumPy or pickled, or a draw uses another device's generator, as CUDA does; and that
counts the values the host reads back, each of which would stall a GPU's queue.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fake_device
import shoal
import shoal.devices
from shoal.algos import make_config
from shoal.backends import RayBackend
from shoal.cli import main
from shoal.errors import ConfigError, ShoalError
from shoal.policy import get_weights

# a failing runner fails the run here, instead of being restarted
QUIET = dict(progress=False, tensorboard=False, eval_episodes=1, eval_interval=0, total_steps=10_000,
             max_runner_restarts=0)
ON_POLICY = dict(num_envs_per_runner=4, rollout_steps=16)
ON_POLICY_ALGOS = ("ppo", "a2c", "trpo", "impala", "appo")
# one env, one update per step from the 64th: ~36 updates in OFF_POLICY_STEPS (counted in steps:
# the random steps before learning_starts come in one rollout, Algorithm._sync_rollout_steps)
OFF_POLICY = dict(num_envs_per_runner=1, rollout_steps=1, updates_per_step=1, learning_starts=64, batch_size=32,
                  hidden_sizes=(32, 32))
OFF_POLICY_STEPS = 100
CASES = {
    "ppo": ("ppo", "CartPole-v1", dict(ON_POLICY, minibatch_size=32, num_epochs=2, normalize_obs=True,
                                       normalize_rewards=True)),
    "ppo-continuous": ("ppo", "Pendulum-v1", dict(ON_POLICY, minibatch_size=32, num_epochs=2)),
    "ppo-lstm": ("ppo", "CartPoleNoVel-v1", dict(ON_POLICY, minibatch_size=32, num_epochs=2, lstm_size=8)),
    "ppo-sde": ("ppo", "Pendulum-v1", dict(ON_POLICY, minibatch_size=32, num_epochs=2, use_sde=True,
                                           sde_sample_freq=4, ortho_init=False)),
    "a2c": ("a2c", "CartPole-v1", dict(ON_POLICY, rollout_steps=8)),
    "trpo": ("trpo", "Pendulum-v1", dict(ON_POLICY, vf_minibatch_size=32, vf_epochs=2)),
    "impala": ("impala", "CartPole-v1", ON_POLICY),
    "appo-lstm": ("appo", "CartPoleNoVel-v1", dict(ON_POLICY, lstm_size=8)),
    "dqn": ("dqn", "CartPole-v1", dict(OFF_POLICY, prioritized=True, n_step=3, dueling=True)),
    "ddpg": ("ddpg", "Pendulum-v1", OFF_POLICY),
    # two updates a step and an actor every third: one phase's metrics (updates 1 and 2) hold the
    # actor's loss from before its first update and from after
    "td3": ("td3", "Pendulum-v1", dict(OFF_POLICY, updates_per_step=2, policy_delay=3)),
    "sac": ("sac", "Pendulum-v1", dict(OFF_POLICY, prioritized=True)),
    "sac-discrete": ("sac", "CartPole-v1", OFF_POLICY),
    "sac-sde": ("sac", "Pendulum-v1", dict(OFF_POLICY, use_sde=True)),
    # image observations: uint8 frames through convolutional encoders
    "ppo-images": ("ppo", "MiniGrid-Empty-5x5-v0", dict(ON_POLICY, minibatch_size=32, num_epochs=1)),
    "dqn-images": ("dqn", "MiniGrid-Empty-5x5-v0", dict(OFF_POLICY, buffer_size=1000)),
    "sac-images": ("sac", "PixelReach-v0", dict(OFF_POLICY, buffer_size=1000, hidden_sizes=(32,))),
    # --inference central: the runners' forward passes on the device too (SEED RL's layout)
    "ppo-central": ("ppo", "CartPole-v1", dict(ON_POLICY, minibatch_size=32, num_epochs=2, inference="central")),
    "ppo-continuous-central": ("ppo", "Pendulum-v1", dict(ON_POLICY, minibatch_size=32, inference="central")),
    "appo-lstm-central": ("appo", "CartPoleNoVel-v1", dict(ON_POLICY, lstm_size=8, inference="central")),
    "dqn-central": ("dqn", "CartPole-v1", dict(OFF_POLICY, inference="central")),
    "sac-central": ("sac", "Pendulum-v1", dict(OFF_POLICY, inference="central")),
    "sac-discrete-central": ("sac", "CartPole-v1", dict(OFF_POLICY, inference="central")),
    "td3-central": ("td3", "Pendulum-v1", dict(OFF_POLICY, inference="central")),
    # --encoder: the user's module (tests/user_encoders.py) moves with the networks it feeds; SAC's
    # critics have one of their own
    "ppo-encoder": ("ppo", "CartPole-v1", dict(ON_POLICY, minibatch_size=32, num_epochs=2,
                                               encoder="user_encoders:Tanh", encoder_kwargs={"width": 16})),
    "sac-encoder": ("sac", "Pendulum-v1", dict(OFF_POLICY, encoder="user_encoders:Tanh")),
    "dqn-images-encoder": ("dqn", "MiniGrid-Empty-5x5-v0", dict(OFF_POLICY, buffer_size=1000,
                                                                encoder="user_encoders:SmallCNN")),
}

# --runner-device: the runners' policy copies act on the device (learner there too); each of these
# covers a part of the acting path: images, the observation and reward normalisers, an LSTM's
# memory, gSDE's held noise, epsilon-greedy, a tanh-Gaussian, clipped noise; Ape-X's runners compute
# the priorities of what they insert
RUNNER_CASES = {**{case: CASES[case] for case in ("dqn-images", "ppo", "ppo-lstm", "ppo-sde", "sac", "td3",
                                                  "ppo-continuous", "sac-encoder")},
                "dqn-apex": ("dqn", "CartPole-v1", dict(OFF_POLICY, apex=True, prioritized=True, num_env_runners=2))}

# learners whose iterations must make the host wait for the device no more often with more
# gradient steps (``more``: the setting that gives them more); tests/test_cuda.py checks them on CUDA
WAIT_CASES = [
    ("dqn", "CartPole-v1", "updates_per_step", dict(OFF_POLICY)),
    ("sac", "Pendulum-v1", "updates_per_step", dict(OFF_POLICY)),
    ("td3", "Pendulum-v1", "updates_per_step", dict(OFF_POLICY)),
    ("ppo", "CartPole-v1", "num_epochs", dict(ON_POLICY, minibatch_size=16)),
    ("impala", "CartPole-v1", "num_epochs", dict(ON_POLICY, minibatch_size=16)),
    ("ppo", "CartPoleNoVel-v1", "num_epochs", dict(ON_POLICY, minibatch_size=16, lstm_size=8)),
    ("appo", "CartPoleNoVel-v1", "num_epochs", dict(ON_POLICY, minibatch_size=16, lstm_size=8)),
]

@pytest.fixture
def fakegpu(monkeypatch):
    """The fake device installed, its generators given to learners, its checks on (where CUDA is,
    tests/conftest.py leaves it out and tests/test_cuda.py checks the real device)."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: tests/test_cuda.py checks it instead of the stand-in")
    fake_device.install()
    monkeypatch.setattr(shoal.devices, "generator", fake_device.generator)
    with fake_device.checks():
        yield fake_device.DEVICE


def training_length(algo, settings):
    """How long a case trains: 4 iterations on-policy, 50 of Ape-X's asynchronous loop (~100 updates), and
    OFF_POLICY_STEPS env steps for the other off-policy runs."""
    if algo in ON_POLICY_ALGOS:
        return {"iterations": 4}
    return {"iterations": 50} if settings.get("apex") else {"steps": OFF_POLICY_STEPS}


def learner_state(config, length, save_to=None, roles=lambda algo: [algo.learner, *algo.inference]):
    """The learner's state after ``length`` (``iterations`` and ``steps``: as many iterations
    and at least as many env steps), and the devices the policies of ``roles`` are on (the
    learner's and the inference servers', by default)."""
    with shoal.make(config) as algo:
        while algo.iteration < length.get("iterations", 0) or algo.env_steps < length.get("steps", 0):
            algo.train()
        devices = {p.device.type for role in roles(algo) for p in role.obj.policy.parameters()}
        if save_to is not None:
            algo.save(save_to)
        return algo.backend.get(algo.learner.call("get_state")), devices


@pytest.mark.parametrize("case", CASES)
def test_every_learner_trains_on_a_device_as_it_does_on_the_cpu(fakegpu, tmp_path, case):
    algo, env, settings = CASES[case]
    length = training_length(algo, settings)
    cpu, where = learner_state(make_config(algo, env, device="cpu", **QUIET, **settings), length)
    assert where == {"cpu"}
    config = make_config(algo, env, device=fakegpu, **QUIET, **settings)
    device, where = learner_state(config, length, save_to=tmp_path / "ck")
    assert where == {"fakegpu"}
    assert cpu["weights"].keys() == device["weights"].keys()
    for k, value in cpu["weights"].items():
        # the same sums in another order: the LSTMs run CUDA's fused cell there (tests/fake_device.py),
        # the convolutions another of torch's kernels
        tolerance = 1e-4 if "lstm" in case else 1e-6 if "images" in case else 0
        np.testing.assert_allclose(device["weights"][k].astype(float), value.astype(float), atol=tolerance,
                                   rtol=0, err_msg=k)
    assert all(not isinstance(t, torch.Tensor) or t.device.type == "cpu" for t in _leaves(device))
    # the device's checkpoint resumes on the CPU and on the device
    for resume_on in ("cpu", fakegpu):
        with shoal.load(tmp_path / "ck", device=resume_on) as resumed:
            assert resumed.learner.obj.device.type == torch.device(resume_on).type
            resumed.train()


def runner_state(config, length, save_to=None):
    """The learner's state after ``length``, and the devices the runners' policies are on."""
    return learner_state(config, length, save_to, roles=lambda algo: algo.runners)


def resume_with_runners_on(checkpoint, runner_device):
    """Resume ``checkpoint`` with the runners on ``runner_device`` and train an iteration there."""
    with shoal.load(checkpoint, runner_device=runner_device) as resumed:
        assert {p.device.type for p in resumed.runners[0].obj.policy.parameters()} == {
            torch.device(runner_device).type}
        resumed.train()


@pytest.mark.parametrize("case", RUNNER_CASES)
def test_runners_act_on_a_device_as_they_do_on_the_cpu(fakegpu, tmp_path, case):
    """Same seeds, the same run: the draws of the device's generator are the CPU's (tests/fake_device.py),
    so the weights after some iterations are the CPU run's whatever acted."""
    algo, env, settings = RUNNER_CASES[case]
    length = training_length(algo, settings)
    cpu, where = runner_state(make_config(algo, env, **QUIET, **settings), length)
    assert where == {"cpu"}
    config = make_config(algo, env, device=fakegpu, runner_device=fakegpu, **QUIET, **settings)
    device, where = runner_state(config, length, save_to=tmp_path / "ck")
    assert where == {"fakegpu"}
    tolerance = 1e-4 if "lstm" in case else 1e-6 if "images" in case else 0
    for k, value in cpu["weights"].items():
        np.testing.assert_allclose(device["weights"][k].astype(float), value.astype(float), atol=tolerance,
                                   rtol=0, err_msg=k)
    for runner_device in ("cpu", fakegpu):  # the runners' state (an LSTM's memory, the RNG) resumes on either
        resume_with_runners_on(tmp_path / "ck", runner_device)


@pytest.mark.parametrize("num_envs", [1, 8])
def test_a_runner_on_a_device_reads_back_four_values_a_step_whatever_its_envs(fakegpu, num_envs):
    """The env action, the action, its log-probability and the network input: one copy each per
    step for all the runner's envs (on a GPU the first waits for the forward pass, and the others
    find their data ready), and no upload that blocks."""
    config = make_config("dqn", "MiniGrid-Empty-5x5-v0", device="cpu", runner_device=fakegpu, **QUIET,
                         **{**OFF_POLICY, "num_envs_per_runner": num_envs, "buffer_size": 1000})
    with shoal.make(config) as algo:
        runner = algo.runners[0].obj
        runner.sample(1)  # the weights loaded
        before, uploads = fake_device.host_reads, fake_device.blocking_uploads
        rollout = runner.sample(10)
        reads = fake_device.host_reads - before
    assert fake_device.blocking_uploads == uploads
    ended = len(rollout.final_idx) > 0  # then the final observations' network inputs, all in one copy
    assert reads == 4 * 10 + 1 + ended, reads  # and the last observations' network inputs


def _leaves(tree):
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    if isinstance(tree, (list, tuple)):
        return [x for v in tree for x in _leaves(v)]
    return [tree]


def test_an_upload_to_the_cpu_shares_a_writable_arrays_memory_and_copies_a_read_only_ones():
    """A read-only array (Ray's object store hands them out: a learner merging a runner's
    observation statistics met one) must not back a tensor; torch warned of it on every such run."""
    cpu = torch.device("cpu")
    writable = np.arange(4.0)
    assert shoal.devices.upload(writable, cpu).data_ptr() == writable.ctypes.data
    read_only = np.arange(4.0)
    read_only.flags.writeable = False
    tensor = shoal.devices.upload(read_only, cpu)
    assert tensor.data_ptr() != read_only.ctypes.data and tensor.tolist() == [0.0, 1.0, 2.0, 3.0]
    tensor += 1  # its own memory
    assert read_only.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_device_auto_is_the_cpu_without_cuda_and_cuda_without_one_fails_in_one_line(capsys, tmp_path):
    config = make_config("ppo", "CartPole-v1", device="auto", **QUIET, **ON_POLICY, minibatch_size=32)
    with shoal.make(config) as algo:
        assert algo.learner.obj.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for flag in ("--device", "--runner-device"):
        run = tmp_path / flag
        code = main(["train", "ppo", "--env", "CartPole-v1", flag, "cuda", "--run-dir", str(run), "--no-progress"])
        err = capsys.readouterr().err
        assert code != 0
        assert f"{flag} cuda: no cuda device" in err and f"{flag} cpu" in err and "Traceback" not in err
        assert not run.exists()


def test_device_names_are_checked_where_the_config_is_made():
    for name in ("gpu", "mps"):
        with pytest.raises(ConfigError, match=f"--device must be cpu, cuda, cuda:N or auto, got '{name}'"):
            make_config("ppo", "CartPole-v1", device=name)
        with pytest.raises(ConfigError, match=f"--runner-device must be cpu, cuda, cuda:N or auto, got '{name}'"):
            make_config("ppo", "CartPole-v1", runner_device=name)
    with pytest.raises(ConfigError, match="on the ray backend the learner uses the GPU Ray gives it"):
        make_config("ppo", "CartPole-v1", device="cuda:1", backend="ray")
    with pytest.raises(ConfigError, match="--runner-device cuda:1: on the ray backend runners use the GPU share"):
        make_config("ppo", "CartPole-v1", runner_device="cuda:1", backend="ray")
    with pytest.raises(ConfigError, match="--runner-device cuda cannot be combined with --inference central"):
        make_config("ppo", "CartPole-v1", runner_device="cuda", inference="central")
    if torch.cuda.is_available():  # (the stand-in device stays out: tests/conftest.py)
        return
    with pytest.raises(ShoalError, match="there are 1 fakegpu devices here, numbered from 0"):
        fake_device.install()
        shoal.devices.resolve("fakegpu:3")


@pytest.mark.parametrize("device, runner_device, cluster_gpus, central, asks", [
    ("cpu", "cpu", 2, False, (0, 0, 0)), ("auto", "cpu", 0, False, (0, 0, 0)), ("auto", "cpu", 2, False, (1, 0, 0)),
    ("cuda", "cpu", 1, False, (1, 0, 0)), ("cuda", "cpu", 1, True, (0.5, 0.25, 0)), ("cpu", "cpu", 1, True, (0, 0, 0)),
    ("cuda", "cpu", 0, False, None),
    # runners on the GPU: a half of the learner's, or a whole one shared where the learner is on the CPU
    ("cuda", "cuda", 1, False, (0.5, 0, 0.25)), ("cpu", "cuda", 1, False, (0, 0, 0.5)),
    ("auto", "auto", 1, False, (0.5, 0, 0.25)), ("auto", "auto", 0, False, (0, 0, 0)), ("cpu", "cuda", 0, False, None)])
def test_ray_roles_ask_for_a_gpu_share_when_their_device_needs_one(device, runner_device, cluster_gpus, central,
                                                                   asks):
    backend = RayBackend.__new__(RayBackend)  # its resource figures only, without starting Ray
    backend.config = make_config("ppo", "CartPole-v1", device=device, runner_device=runner_device, backend="ray",
                                 num_env_runners=2,
                                 **(dict(inference="central", num_inference_servers=2) if central else {}))
    backend.cpus, backend.gpus = 2.0, float(cluster_gpus)
    if asks is None:
        flag = "--device" if device == "cuda" else "--runner-device"
        with pytest.raises(ShoalError, match=f"{flag} cuda: the Ray cluster has no GPU"):
            backend.learner_gpus(), backend.runner_gpus()
    else:
        assert (backend.learner_gpus(), backend.inference_gpus(), backend.runner_gpus()) == asks


@pytest.mark.parametrize("algo, env, more, settings", WAIT_CASES)
def test_a_learners_updates_make_the_host_wait_for_the_device_no_more_often(fakegpu, algo, env, more, settings):
    """On a GPU every value the host reads (a norm compared, a loss printed), and every blocking
    copy to it (a minibatch's indices), waits for the work queued before it: an iteration's waits
    must not grow with its gradient steps. It waits once for the weights it publishes (a copy
    per dtype) and once for its metrics. (tests/test_cuda.py counts them with CUDA's own sync
    debug mode where a GPU is lent.)"""
    reads = {}
    for n in (2, 3):
        config = make_config(algo, env, device=fakegpu, **QUIET, **{**settings, more: n})
        with shoal.make(config) as algo_:
            while algo_.train().get("learner/updates", 1) == 0:  # until replay starts the updates
                pass
            before = fake_device.waits()
            algo_.train()
            reads[n] = fake_device.waits() - before
            dtypes = {v.dtype for v in algo_.learner.obj.policy.state_dict().values()}
    assert reads[2] == reads[3] == len(dtypes) + 1, (reads, dtypes)


def test_published_weights_leave_the_device_in_one_copy_per_dtype(fakegpu):
    """A learner publishes every iteration: a copy per tensor made the host wait for the GPU a
    dozen times each (~8 ms of DQN's 33 ms Breakout iteration on an H200)."""
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))  # float32 and int64 entries
    module(torch.randn(5, 3))  # running statistics and a count that are not their initial values
    expected = get_weights(module)
    on_device = module.to(fakegpu)
    before = fake_device.host_reads
    got = get_weights(on_device)
    assert fake_device.host_reads - before == 2
    assert list(got) == list(expected)
    for k, value in expected.items():
        assert got[k].dtype == value.dtype and got[k].shape == value.shape, k
        np.testing.assert_array_equal(got[k], value, err_msg=k)


@pytest.mark.parametrize("case", ["ppo", "ppo-continuous", "ppo-sde", "ppo-lstm", "dqn", "sac", "sac-images",
                                  "ppo-encoder", "dqn-images-encoder"])
def test_a_deployed_policy_and_the_policy_server_act_on_a_device_as_on_the_cpu(fakegpu, tmp_path, case):
    from shoal.remote.policyserver import PolicyClient, PolicyServer

    algo, env, settings = CASES[case]
    config = make_config(algo, env, **QUIET, **settings)
    with shoal.make(config) as algo_:
        algo_.train()
        algo_.save(tmp_path / "ck")
    cpu, device = shoal.load_policy(tmp_path / "ck"), shoal.load_policy(tmp_path / "ck").to(fakegpu)
    assert device.device.type == "fakegpu" and {p.device.type for p in device.module.parameters()} == {"fakegpu"}
    obs = np.stack([cpu.observation_space.sample() for _ in range(8)])
    if cpu.module.recurrent:  # three steps of eight episodes, the memory held by the policy, then by the caller
        for _ in range(3):
            np.testing.assert_allclose(device.act(obs), cpu.act(obs), atol=1e-5)
        done = np.arange(8) % 2 == 0  # half the episodes end: their memory starts afresh
        device.reset(done), cpu.reset(done)
        np.testing.assert_allclose(device.act(obs), cpu.act(obs), atol=1e-5)
        (a, (h, c)), (b, (h2, c2)) = device.act_with_memory(obs, None), cpu.act_with_memory(obs, None)
        np.testing.assert_allclose(a, b, atol=1e-5)
        np.testing.assert_allclose(h, h2, atol=1e-5)
        return
    np.testing.assert_allclose(device.act(obs), cpu.act(obs), atol=1e-5)
    if case in ("ppo", "ppo-encoder"):  # exported from a CPU copy, checked there against its actions
        assert device.export_onnx(tmp_path / "policy.onnx")["checked"] > 0
    server = PolicyServer({"default": tmp_path / "ck"}, port=0, device=fakegpu).start()
    assert {p.device.type for p in server.policies["default"].module.parameters()} == {"fakegpu"}
    client = PolicyClient(server.address)
    try:
        np.testing.assert_allclose(client.act(obs)[0], cpu.act(obs), atol=1e-5)
    finally:
        client.close()
        server.stop(grace=0)


def test_ray_runners_waiting_for_a_gpu_share_say_so(monkeypatch, caplog):
    """Runners on --runner-device cuda whose GPU share another run holds wait, silently in Ray:
    the backend says what they wait for (the resource figures alone: CI has no GPU for Ray)."""
    import logging

    import ray

    import shoal.backends

    backend = RayBackend.__new__(RayBackend)
    backend.config = make_config("ppo", "CartPole-v1", device="cuda", runner_device="cuda", backend="ray",
                                 num_env_runners=2)
    backend.cpus, backend.gpus = 4.0, 1.0
    monkeypatch.setattr(shoal.backends, "RUNNER_START_WARN_S", 0.0)
    monkeypatch.setattr(ray, "wait", lambda pings, **_: ([], pings))  # both still starting
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 4.0, "GPU": 0.2})
    monkeypatch.setattr(RayBackend, "get", lambda self, futures: futures)
    with caplog.at_level(logging.WARNING, logger="shoal"):
        backend.wait_for_runners(["ping-0", "ping-1"])
    assert ("2 of 2 runners wait for GPUs: each asks for 0.25, and the Ray cluster has 0.2 of 1 free (another run, "
            "or another shoal Algorithm in this process, holds them); they start when GPUs free up, or stop this run "
            "and give it --runner-device cpu") in caplog.text
    assert "wait for CPUs" not in caplog.text
