"""``--init-from RUN_DIR_OR_CHECKPOINT`` (rl-zoo's --trained-agent, SB3's load then learn): a new
run whose networks start from another run's checkpoint, with its own settings, and fresh
optimisers, counters and replay; and ``--init-replay``, whose replay starts with another run's
saved transitions."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
import yaml

import shoal
from shoal.cli import main

QUICK = {"progress": False, "tensorboard": False, "eval_interval": 0, "eval_episodes": 3}
OFF = {"learning_starts": 64, "batch_size": 32, "hidden_sizes": (32, 32)}


def trained(tmp_path, algo, env, steps, **settings):
    """A finished run's directory."""
    run = tmp_path / f"{algo}-source"
    shoal.train(shoal.make_config(algo, env, total_steps=steps, **QUICK, **settings), run_dir=run)
    return run


def state_of(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


@pytest.mark.parametrize("algo, env, settings, networks", [
    ("ppo", "CartPole-v1", {}, ()),
    ("dqn", "CartPole-v1", OFF, ("target",)),
    ("sac", "Pendulum-v1", OFF, ("critics", "target_critics")),
    ("td3", "Pendulum-v1", OFF, ("critics", "target_critics", "target_actor")),
    ("crossq", "Pendulum-v1", {**OFF, "critic_hidden_sizes": (32, 32)}, ("critics",)),
    ("tqc", "Pendulum-v1", {**OFF, "n_quantiles": 5}, ("critics", "target_critics")),
    ("qrdqn", "CartPole-v1", {**OFF, "n_quantiles": 5}, ("target",)),
    ("ars", "CartPole-v1", {"zero_policy": False}, ()),
])
def test_a_new_run_starts_from_the_checkpoints_networks_with_fresh_optimisers_and_counters(tmp_path, monkeypatch, algo,
                                                                                            env, settings, networks):
    source = trained(tmp_path, algo, env, 512, **settings)
    with shoal.load(source) as before:
        old = before.learner.obj
        policy, others = state_of(old.policy), {n: state_of(getattr(old, n)) for n in networks}
        alpha = old.log_alpha.item() if algo in ("sac", "crossq", "tqc") else None
        returns = before.evaluate()["eval/return_mean"]
    config = shoal.make_config(algo, env, init_from=str(source), lr=1e-4, total_steps=10_000, **QUICK, **settings)
    if not networks:  # all in the policy: read from policy.pt, with no pickled code (state.pt is pickled)
        monkeypatch.setattr(shoal.checkpoint, "read_state", lambda path: pytest.fail("state.pt was read"))
    with shoal.make(config) as algo_:
        learner = algo_.learner.obj
        assert same(state_of(learner.policy), policy)
        for name in networks:  # the critics and targets learned with that policy
            assert same(state_of(getattr(learner, name)), others[name]), name
        if alpha is not None:
            assert learner.log_alpha.item() == alpha and alpha != 0.0  # the temperature tuned with them
        optimizers = [o for o in vars(learner).values() if isinstance(o, torch.optim.Optimizer)]
        assert (optimizers or algo == "ars") and all(not o.state for o in optimizers)  # fresh: no moments
        assert all(g["lr"] == 1e-4 for o in optimizers for g in o.param_groups if "lr" in g)
        assert algo_.env_steps == 0 and algo_.policy_version == 1 and learner.version == 1
        if networks:
            assert len(learner.replay) == 0
        # runners and evaluators act with the loaded policy (the next version): the same evaluation
        assert algo_.evaluate()["eval/return_mean"] == returns
        algo_.train()
        assert algo_.policy_version >= 1


def test_fine_tuning_a_solved_policy_goes_on_from_its_return_and_resumes_without_its_source(tmp_path, capsys):
    source = tmp_path / "source"
    assert main(["train", "ppo", "--total-steps", "100000", "--stop-return", "475", "--run-dir", str(source),
                 "--no-progress", "--no-tensorboard"]) == 0
    with open(source / "eval.csv") as f:
        solved = float(list(csv.DictReader(f))[-1]["eval/return_mean"])
    assert solved >= 475
    tuned = tmp_path / "tuned"
    assert main(["train", "ppo", "--init-from", str(source), "--lr", "1e-4", "--total-steps", "1024",
                 "--eval-interval", "1024", "--run-dir", str(tuned), "--no-progress", "--no-tensorboard"]) == 0
    with open(tuned / "eval.csv") as f:
        first = float(list(csv.DictReader(f))[0]["eval/return_mean"])
    assert first >= 0.8 * solved  # a random policy's CartPole return is ~20
    assert yaml.safe_load((tuned / "config.yaml").read_text())["init_from"] == str(source)
    for path in source.rglob("*"):  # the source's checkpoints are gone: a resume restores the run's own
        if path.is_file():
            path.unlink()
    assert main(["train", "--resume", str(tuned), "--total-steps", "2048", "--no-progress"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["sac", "--env", "Pendulum-v1"], "is a checkpoint of ppo, not sac: start from it with `shoal train ppo"),
    (["ppo", "--hidden-sizes", "32"], "holds a network these settings do not build"),
    (["ppo", "--env", "Acrobot-v1"], "does not fit Acrobot-v1"),
])
def test_a_checkpoint_these_settings_cannot_start_from_is_refused_in_one_line_and_leaves_no_run(tmp_path, capsys,
                                                                                                 argv, message):
    source = trained(tmp_path, "ppo", "CartPole-v1", 256)
    assert_refused_in_one_line(capsys, ["train", *argv, "--init-from", str(source)], message, tmp_path / "run")


@pytest.mark.parametrize("algo, source_settings, argv, message", [
    ("sac", {"critic_hidden_sizes": (48, 40)}, ["--critic-hidden-sizes", "64"],
     "(critics.biases.0: [2, 1, 48] in the checkpoint, [2, 1, 64] now); changed since it was written: "
     "critic_hidden_sizes [48, 40] -> [64]. Start from it"),
    ("sac", {"critic_hidden_sizes": (48, 40)}, [],  # unset now: the actor's widths, as the checkpoint's were not
     "changed since it was written: critic_hidden_sizes [48, 40] -> None."),
    ("td3", {}, ["--no-twin-critics"], "(critics.biases.0: [2, 1, 32] in the checkpoint, [1, 1, 32] now); changed "
     "since it was written: twin_critics True -> False."),
    ("tqc", {"n_quantiles": 5}, ["--n-quantiles", "7"], "changed since it was written: n_quantiles 5 -> 7."),
])
def test_critics_these_settings_do_not_build_are_refused_in_one_line_and_leave_no_run(tmp_path, capsys, algo,
                                                                                     source_settings, argv, message):
    """The networks beyond the policy (critics, targets, in the pickled training state) are checked
    as the policy's are, before any role loads them: torch's size-mismatch error was what a user saw."""
    source = trained(tmp_path, algo, "Pendulum-v1", 128, **{**OFF, **source_settings})
    same_settings = ["--hidden-sizes", "32", "32", "--learning-starts", "64", "--batch-size", "32", "--eval-interval",
                     "0", "--eval-episodes", "3", "--no-tensorboard"]  # as the source's, but for argv
    assert_refused_in_one_line(capsys, ["train", algo, "--env", "Pendulum-v1", *same_settings, *argv, "--init-from",
                                        str(source)], message, tmp_path / "run")


def test_restoring_a_checkpoint_into_other_critics_is_refused_before_the_learner_loads_it(tmp_path):
    source = trained(tmp_path, "sac", "Pendulum-v1", 128, **{**OFF, "critic_hidden_sizes": (48, 40)})
    with shoal.make(shoal.make_config("sac", "Pendulum-v1", **QUICK, **OFF)) as other:
        critics = state_of(other.learner.obj.critics)
        with pytest.raises(shoal.ShoalError, match=r"\(critics.biases.0: \[2, 1, 48\] in the checkpoint, \[2, 1, 32\] "
                           r"now\); changed since it was written: critic_hidden_sizes \[48, 40\] -> None. Resume"):
            other.restore(source)
        assert same(state_of(other.learner.obj.critics), critics)


def assert_refused_in_one_line(capsys, argv, message, run):
    """``shoal argv`` into ``run`` fails with one line holding ``message``, and leaves no run directory."""
    capsys.readouterr()  # what came before: the source's own training (a busy machine's note on waiting threads, say)
    assert main([*argv, "--run-dir", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not run.exists()


def test_a_missing_checkpoint_is_named(tmp_path, capsys):
    assert main(["train", "ppo", "--init-from", str(tmp_path / "nowhere"), "--run-dir", str(tmp_path / "run"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"shoal: error: --init-from: {tmp_path / 'nowhere'} does not exist: give a run directory "
                           "or a checkpoint directory"), err
    assert not (tmp_path / "run").exists()


# --init-replay: a new run's replay starts with another run's saved transitions (SB3's load_replay_buffer)

def saved_rewards(run):
    """The rewards of a run's saved replay, oldest first."""
    state = shoal.checkpoint.read_state(shoal.checkpoint.resolve(run))["learner"]["replay"][0]
    return state["rewards"][np.r_[state["pos"]:state["size"], 0:state["pos"]]]


@pytest.mark.parametrize("source_algo, algo, env, extra", [("td3", "sac", "Pendulum-v1", {}),
                                                             ("dqn", "dqn", "CartPole-v1", {"rollout_steps": 4})])
def test_a_new_run_starts_with_a_saved_replay_whose_transitions_count_towards_learning_starts(tmp_path, source_algo,
                                                                                             algo, env, extra):
    source = trained(tmp_path, source_algo, env, 512, save_replay=True, gamma=0.98, **OFF)  # TD3's Pendulum preset's
    saved = saved_rewards(source)
    assert len(saved) == 512
    config = shoal.make_config(algo, env, init_replay=str(source), total_steps=10_000, gamma=0.98, **QUICK,
                               **{**OFF, "learning_starts": 300, "buffer_size": 400}, **extra)
    with shoal.make(config) as a:  # 400 of them fit: the newest, in order
        buf = a.learner.obj.replay.shards[0].obj
        np.testing.assert_array_equal(buf.rewards[np.r_[buf.pos:len(buf), 0:buf.pos]], saved[-400:])
        assert a.replay_loaded == 400 and a.policy_version == 1  # published: the runners act with the policy now
        assert not a.learner.obj.policy.random_actions
        assert a.train()["learner/updates_this_call"] > 0  # updates from the first step
        assert a.runners[0].obj.version == 1 and not a.runners[0].obj.policy.random_actions  # its rollout's
    config = shoal.make_config(algo, env, init_replay=str(source), total_steps=10_000, gamma=0.98, **QUICK,
                               **{**OFF, "learning_starts": 612}, **extra)
    with shoal.make(config) as a:  # 100 random steps to go, then updates
        assert a.replay_loaded == 512 and a.policy_version == 0 and a.learner.obj.policy.random_actions
        updates = []
        while a.env_steps < 100:
            updates.append((a.env_steps, a.train()["learner/updates_this_call"]))
        assert all(n == 0 for steps, n in updates[:-1]) and updates[-1][1] > 0, updates
        assert a.env_steps == 100  # the random steps come in long rollouts that end at learning_starts
        assert not a.learner.obj.policy.random_actions


def test_init_from_and_init_replay_of_one_run_go_on_from_its_networks_and_experience(tmp_path):
    source = trained(tmp_path, "dqn", "CartPole-v1", 512, save_replay=True, **OFF)
    run = tmp_path / "run"
    assert main(["train", "dqn", "--init-from", str(source), "--init-replay", str(source), "--total-steps", "256",
                 "--learning-starts", "64", "--batch-size", "32", "--hidden-sizes", "32", "32", "--run-dir", str(run),
                 "--no-progress", "--no-tensorboard"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["init_from"] == saved["init_replay"] == str(source)
    with open(run / "progress.csv") as f:
        assert float(list(csv.DictReader(f))[0]["learner/updates"]) > 0
    for path in source.rglob("*"):  # a resume restores the run's own replay, and never reads the source again
        if path.is_file():
            path.unlink()
    assert main(["train", "--resume", str(run), "--total-steps", "512", "--no-progress"]) == 0


@pytest.mark.parametrize("source_settings, argv, message", [
    ({"save_replay": False}, ["dqn"], "holds no replay buffer: its run did not set --save-replay"),
    ({}, ["dqn", "--gamma", "0.9"], "(gamma 0.99 there, 0.9 here): start from it with its values (--set gamma=0.99)"),
    ({}, ["sac", "--n-step", "3"], "(n_step 1 there, 3 here)"),
    ({}, ["dqn", "--env", "Acrobot-v1"], "does not fit Acrobot-v1"),
])
def test_a_replay_this_run_cannot_start_from_is_refused_in_one_line_and_leaves_no_run(tmp_path, capsys,
                                                                                      source_settings, argv, message):
    source = trained(tmp_path, "dqn", "CartPole-v1", 256, **{**OFF, "save_replay": True, **source_settings})
    assert_refused_in_one_line(capsys, ["train", *argv, "--init-replay", str(source)], message, tmp_path / "run")


def test_an_on_policy_checkpoint_holds_no_replay_to_start_from(tmp_path):
    source = trained(tmp_path, "ppo", "CartPole-v1", 256)
    with pytest.raises(shoal.ShoalError, match="is a checkpoint of ppo, which keeps no replay buffer"):
        shoal.make(shoal.make_config("dqn", "CartPole-v1", init_replay=str(source), **QUICK, **OFF))
