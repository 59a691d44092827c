"""ONNX export: ONNX Runtime gives the actions ``policy.act`` gives, for every kind of policy and
action space; the file is written only when it does; ``shoal export`` says what the model takes."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.algos import get
from shoal.envs import MaskedBox, MixedBox
from shoal.errors import ShoalError
from shoal.policy import Policy

ort = pytest.importorskip("onnxruntime")

VECTOR = gym.spaces.Box(-5, 5, (6,), np.float32)
MASKED = MaskedBox(np.r_[np.full(4, -5.0), np.zeros(5)].astype(np.float32), np.r_[np.full(4, 5.0), np.ones(5)].astype(np.float32), 5)
# an 8x8 picture, 2 vector entries and a mask of 5
PICTURE_MASKED = MixedBox(np.r_[np.zeros(64), np.full(2, -5.0), np.zeros(5)].astype(np.float32),
                          np.r_[np.full(64, 255.0), np.full(2, 5.0), np.ones(5)].astype(np.float32), ((8, 8, 1),), 5)


def policy_of(algo: str, obs_space: gym.Space, action_space: gym.Space, **overrides) -> Policy:
    """An untrained policy of ``algo`` (random weights; a normaliser with statistics of its own).
    Its weights are drawn from fixed seeds, not from whatever state the tests before it left
    torch's generator in: a draw of a convolutional TQC's weights plus this noise sums terms large
    enough that float32 rounding in ONNX Runtime's convolutions moved an action by 1e-3 (8 of
    100 draws), past what the export's check accepts."""
    config = get(algo).config_cls(env="CartPole-v1", hidden_sizes=(32, 32), **overrides)
    torch.manual_seed(0)
    module = get(algo).make_policy(config, obs_space, action_space)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # logits far from ties, as a trained policy's are
        if module.obs_norm is not None:
            module.obs_norm.mean.uniform_(-1, 1)
            module.obs_norm.var.uniform_(0.5, 4)
        for name, b in module.named_buffers():  # batch (re)normalisation's, as a trained one's
            if name.endswith("running_mean"):
                b.uniform_(-1, 1)
            elif name.endswith("running_var"):
                b.uniform_(0.5, 4)
    return Policy(module, 7, config)


def run_model(path, obs: np.ndarray, memory: int = 0, steps: int = 1) -> list[np.ndarray]:
    """ONNX Runtime's actions for ``steps`` steps of the same observations, memory carried."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    h = c = np.zeros((len(obs), memory), np.float32)
    actions = []
    for _ in range(steps):
        feed = {"obs": obs, **({"lstm_h": h, "lstm_c": c} if memory else {})}
        a, *hc = session.run(None, feed)
        if memory:
            h, c = hc
        actions.append(a)
    return actions


CASES = {
    "ppo-discrete": ("ppo", VECTOR, gym.spaces.Discrete(3, start=-1), {}),
    "ppo-gaussian-normalised": ("ppo", VECTOR, gym.spaces.Box(-2, np.array([1, 2, 3], np.float32)), {"normalize_obs": True}),
    "ppo-lstm": ("ppo", VECTOR, gym.spaces.Discrete(4), {"lstm_size": 8}),
    "ppo-multi-discrete-masked": ("ppo", MASKED, gym.spaces.MultiDiscrete([2, 3], start=[1, -1]), {}),
    "a2c-multi-binary": ("a2c", VECTOR, gym.spaces.MultiBinary(3), {}),
    "dqn-images": ("dqn", gym.spaces.Box(0, 255, (36, 36, 3), np.uint8), gym.spaces.Discrete(4), {"dueling": True}),
    "dqn-masked": ("dqn", MASKED, gym.spaces.Discrete(5), {}),
    "qrdqn-dueling-masked": ("qrdqn", MASKED, gym.spaces.Discrete(5), {"dueling": True, "n_quantiles": 5}),
    "dqn-c51-dueling-masked": ("dqn", MASKED, gym.spaces.Discrete(5), {"dueling": True, "num_atoms": 11}),
    "ppo-picture-masked-normalised": ("ppo", PICTURE_MASKED, gym.spaces.Discrete(5), {"normalize_obs": True}),
    "dqn-picture-masked": ("dqn", PICTURE_MASKED, gym.spaces.Discrete(5), {"dueling": True}),
    "qrdqn-noisy-images": ("qrdqn", gym.spaces.Box(0, 255, (36, 36, 3), np.uint8), gym.spaces.Discrete(4),
                           {"noisy": True, "n_quantiles": 5}),  # the means
    "sac-squashed": ("sac", VECTOR, gym.spaces.Box(-2, 2, (2,)), {}),
    "sac-discrete": ("sac", VECTOR, gym.spaces.Discrete(3), {}),
    "td3": ("td3", VECTOR, gym.spaces.Box(0, 1, (2,)), {}),
    "ars-linear-normalised": ("ars", VECTOR, gym.spaces.Box(-2, 2, (2,)), {}),  # clipped
    "ars-mlp-discrete": ("ars", VECTOR, gym.spaces.Discrete(3), {"policy": "mlp"}),
    "ars-mlp-squashed": ("ars", VECTOR, gym.spaces.Box(0, np.array([1, 4], np.float32)), {"policy": "mlp"}),
    "crossq-renormalised": ("crossq", VECTOR, gym.spaces.Box(-2, 2, (2,)), {}),
    "tqc-images": ("tqc", gym.spaces.Box(0, 255, (36, 36, 3), np.uint8), gym.spaces.Box(-1, 1, (2,)), {}),
    "ppo-your-encoder": ("ppo", VECTOR, gym.spaces.Discrete(3), {"encoder": "user_encoders:Tanh"}),
    "sac-your-cnn": ("sac", gym.spaces.Box(0, 255, (7, 7, 3), np.uint8), gym.spaces.Box(-1, 1, (2,)),
                     {"encoder": "user_encoders:SmallCNN"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_onnx_runtime_gives_the_actions_the_policy_gives(case, tmp_path):
    algo, obs_space, action_space, overrides = CASES[case]
    policy = policy_of(algo, obs_space, action_space, **overrides)
    report = policy.export_onnx(tmp_path / "p.onnx")
    assert report["inputs"]["obs"] == (list(obs_space.shape), str(np.dtype(obs_space.dtype)))
    obs_space.seed(123)  # observations the export's own check did not see
    obs = np.stack([obs_space.sample() for _ in range(64)])
    memory = 2 * overrides.get("lstm_size", 0)
    got = run_model(tmp_path / "p.onnx", obs, memory, steps=3 if memory else 1)
    policy.reset()
    want = [policy.act(obs) for _ in got]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape == (64, *action_space.shape)
        assert np.allclose(g, w, rtol=1e-4, atol=1e-5)
        assert all(action_space.contains(a) for a in w)
    if memory:  # the memory matters: the same observations, other actions once it has built up
        assert not all(np.array_equal(want[0], w) for w in want[1:])
    meta = {p.key: p.value for p in __import__("onnx").load(str(tmp_path / "p.onnx")).metadata_props}
    assert meta["shoal.algo"] == algo and meta["shoal.version"] == "7"
    assert json.loads(meta["shoal.observation_space"])["shape"] == list(obs_space.shape)
    assert json.loads(meta["shoal.observation_space"]).get("mask_dim", 0) == getattr(obs_space, "mask_dim", 0)


def test_a_model_that_acts_otherwise_is_not_written(tmp_path, monkeypatch):
    from shoal import export

    policy = policy_of("ppo", VECTOR, gym.spaces.Discrete(3))
    forward = export.DeployedPolicy.forward
    monkeypatch.setattr(export.DeployedPolicy, "forward", lambda self, obs: forward(self, obs).flip(0))
    with pytest.raises(ShoalError, match=r"actions differ from the policy's for \d+ of 256 sample observations"):
        policy.export_onnx(tmp_path / "p.onnx")
    assert list(tmp_path.iterdir()) == []


def test_shoal_export_writes_a_trained_run_s_policy_and_refuses_bad_paths_in_one_line(tmp_path, capsys):
    import shoal
    from shoal.cli import main

    run = tmp_path / "run"
    shoal.train(get("ppo").config_cls(env="CartPole-v1", total_steps=512, rollout_steps=64, num_envs_per_runner=2, minibatch_size=64,
                                      progress=False, tensorboard=False, seed=0), run_dir=run)
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "cartpole.onnx")]) == 0
    out = capsys.readouterr().out
    assert "takes obs [N, 4] float32" in out and "gives action [N] int64" in out and "256 sample observations" in out
    env = gym.make("CartPole-v1")
    obs = np.stack([env.reset(seed=s)[0] for s in range(32)])
    assert np.array_equal(run_model(tmp_path / "cartpole.onnx", obs)[0], shoal.load_policy(run).act(obs))
    for out, message in ((tmp_path / "no" / "p.onnx", "is not a directory"), (tmp_path, "is a directory")):
        assert main(["export", str(run), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert main(["export", str(tmp_path / "none")]) == 2
    assert "shoal: error:" in capsys.readouterr().err


def test_without_the_export_extra_the_error_says_what_to_install(tmp_path, monkeypatch):
    import importlib

    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module",
                        lambda name, *a: (_ for _ in ()).throw(ImportError(name)) if name == "onnxscript" else real(name, *a))
    with pytest.raises(ShoalError, match=r"needs onnxscript: pip install 'shoal\[export\]'"):
        policy_of("ppo", VECTOR, gym.spaces.Discrete(3)).export_onnx(tmp_path / "p.onnx")
