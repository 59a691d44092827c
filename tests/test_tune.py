"""`shoal tune`: Optuna searches an algorithm's settings, each trial a whole run; evaluations are
reported to its pruner; the study is kept in its directory and grows with the same command; its
best settings train with `shoal train --config best.yaml`; mistakes end in one line before any
trial runs."""

from __future__ import annotations

import csv

import optuna
import pytest
import user_wrappers
import yaml

import shoal
from shoal.cli import main
from shoal.tuning import SPACES, Param

TRIAL = ["--total-steps", "2048", "--evaluations", "2"]


def rows(study_dir):
    with open(study_dir / "trials.csv") as f:
        return list(csv.DictReader(f))


def test_each_trial_runs_its_drawn_settings_and_best_yaml_holds_the_best(tmp_path, capsys):
    study = tmp_path / "study"
    fixed = tmp_path / "fixed.yaml"  # a run's config.yaml, say: where it ran is not a setting to tune with
    fixed.write_text(f"algo: ppo\nent_coef: 0.01\nrun_dir: {tmp_path / 'elsewhere'}\n")
    assert main(["tune", "ppo", "--env", "CartPole-v1", "--trials", "3", *TRIAL, "--no-prune", "--param",
                 "lr=log(1e-4, 1e-2)", "hidden_sizes=[[64, 64], [16]]", "--set", "gamma=0.98", "--config",
                 str(fixed), "--study-dir", str(study)]) == 0
    out = capsys.readouterr().out
    assert "trial 2: eval return" in out and f"--config {study / 'best.yaml'}" in out
    trials = rows(study)
    assert [t["trial"] for t in trials] == ["0", "1", "2"] and {t["state"] for t in trials} == {"complete"}
    for t in trials:  # the run of each trial has the settings drawn for it, and the fixed ones
        ran = yaml.safe_load((study / f"trial_{int(t['trial']):04d}" / "config.yaml").read_text())
        assert ran["lr"] == pytest.approx(float(t["lr"])) and ran["hidden_sizes"] == yaml.safe_load(t["hidden_sizes"])
        assert ran["gamma"] == 0.98 and ran["ent_coef"] == 0.01
        assert ran["total_steps"] == 2048 and ran["eval_interval"] == 1024
        with open(study / f"trial_{int(t['trial']):04d}" / "eval.csv") as f:
            evaluations = list(csv.DictReader(f))  # the trial's value: its final evaluation's mean return
        assert float(t["value"]) == pytest.approx(float(evaluations[-1]["eval/return_mean"]))
    best = max(trials, key=lambda t: float(t["value"]))
    settings = yaml.safe_load((study / "best.yaml").read_text())
    assert settings["gamma"] == 0.98 and settings["ent_coef"] == 0.01 and "run_dir" not in settings
    assert settings["lr"] == pytest.approx(float(best["lr"])) and not (tmp_path / "elsewhere").exists()
    config = shoal.make_config("ppo", "CartPole-v1", **settings)  # as `shoal train --config best.yaml` layers it
    assert config.hidden_sizes == tuple(yaml.safe_load(best["hidden_sizes"]))
    capsys.readouterr()
    assert main(["eval", str(study)]) == 2  # the study is no run: its best trial is
    assert f"its best is {study / ('trial_%04d' % int(best['trial']))}" in capsys.readouterr().err


def test_a_pruned_trial_stops_at_the_evaluation_the_pruner_rejects(tmp_path, monkeypatch, capsys):
    """The pruner sees every evaluation as it comes (the run's callback gets its metrics): one
    that rejects any value stops each trial at its first evaluation, with no trial complete."""
    monkeypatch.setattr(optuna.pruners, "MedianPruner", lambda **_: optuna.pruners.ThresholdPruner(lower=1e9))
    study = tmp_path / "study"
    assert main(["tune", "a2c", "--env", "CartPole-v1", "--trials", "2", "--total-steps", "2000", "--evaluations",
                 "4", "--param", "lr=[0.001, 0.0007]", "--study-dir", str(study)]) == 1
    trials = rows(study)
    assert [t["state"] for t in trials] == ["pruned", "pruned"]
    assert all(500 <= int(t["env_steps"]) < 1000 for t in trials), trials  # the first of 4 evaluations, 500 apart
    assert "pruned at " in capsys.readouterr().out and not (study / "best.yaml").exists()


def test_the_same_command_adds_trials_to_the_study_and_another_search_is_refused_there(tmp_path, capsys):
    study = tmp_path / "study"
    command = ["tune", "dqn", "--env", "CartPole-v1", "--trials", "1", *TRIAL, "--param", "gamma=[0.9, 0.99]",
               "--set", "learning_starts=500", "--study-dir", str(study)]
    assert main(command) == 0 and main(command) == 0
    assert [t["trial"] for t in rows(study)] == ["0", "1"]
    capsys.readouterr()
    assert main([*command[:-4], "--param", "lr=[0.001]", "--study-dir", str(study)]) == 2
    err = capsys.readouterr().err
    assert "holds a study with other space" in err and len(err.strip().splitlines()) == 1
    assert [t["trial"] for t in rows(study)] == ["0", "1"]


def test_the_random_sampler_draws_what_optuna_s_random_sampler_draws_from_the_seed(tmp_path):
    """With a startup trial and TPE the later trials would be modelled; random draws each afresh."""
    study = shoal.tune("ppo", "CartPole-v1", trials=3, total_steps=512, evaluations=1, seed=7, startup_trials=1,
                       params={"lr": "log(1e-5, 1e-2)", "gamma": "float(0.9, 0.999)"}, sampler="random",
                       study_dir=tmp_path / "study", prune=False)
    reference = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    drawn = []
    for _ in range(3):
        trial = reference.ask()
        drawn.append((trial.suggest_float("lr", 1e-5, 1e-2, log=True), trial.suggest_float("gamma", 0.9, 0.999)))
        reference.tell(trial, 0.0)
    assert [(pytest.approx(float(t["lr"])), pytest.approx(float(t["gamma"]))) for t in study.trials] == drawn


def test_successive_halving_prunes_at_the_first_evaluation_each_trial_below_the_best_there(tmp_path, capsys):
    """rl-zoo's halving: a rung at the first evaluation, where a trial goes on only in the best third
    of the trials there so far (the best one, with fewer than six), and the next rung at three times
    its steps, past these trials' end."""
    study = tmp_path / "study"
    assert main(["tune", "ppo", "--env", "CartPole-v1", "--trials", "5", *TRIAL, "--pruner", "halving", "--sampler",
                 "random", "--param", "lr=log(1e-5, 1e-2)", "--study-dir", str(study)]) == 0
    assert "pruned by halving" in capsys.readouterr().out
    firsts, outcomes = [], []
    for t in rows(study):
        with open(study / f"trial_{int(t['trial']):04d}" / "eval.csv") as f:
            first = float(next(csv.DictReader(f))["eval/return_mean"])
        outcomes.append((t["state"], int(t["env_steps"])))
        expected = ("complete", 2048) if not firsts or first >= max(firsts) else ("pruned", 1024)
        assert outcomes[-1] == expected, (firsts, first, outcomes)
        firsts.append(first)
    assert ("pruned", 1024) in outcomes and outcomes[0] == ("complete", 2048)


def test_a_study_pruned_by_hyperband_runs_its_trials(tmp_path, capsys):
    study = tmp_path / "study"
    assert main(["tune", "ppo", "--env", "CartPole-v1", "--trials", "2", *TRIAL, "--pruner", "hyperband",
                 "--param", "lr=log(1e-5, 1e-2)", "--study-dir", str(study)]) == 0
    assert "pruned by hyperband" in capsys.readouterr().out
    assert rows(study)[0]["state"] == "complete" and {t["state"] for t in rows(study)} <= {"complete", "pruned"}


def test_a_trial_whose_run_fails_is_recorded_and_the_study_goes_on(tmp_path, capsys):
    study = tmp_path / "study"
    assert main(["tune", "ppo", "--env", "FrozenLake-v1", "--trials", "2", *TRIAL, "--param", "gamma=[0.9, 0.99]",
                 "--set", "env_kwargs={map_name: 9x9}", "--study-dir", str(study)]) == 1
    out = capsys.readouterr().out
    assert out.count("failed: environment 'FrozenLake-v1' could not be made") == 2, out
    assert [t["state"] for t in rows(study)] == ["fail", "fail"]


MISTAKES = [
    (["--param", "learning_rate=log(1e-5, 1e-2)"], "SB3's learning_rate: shoal calls it lr"),
    (["--param", "lr=log(1e-5)"], "a range takes two numbers, the lower first"),
    (["--param", "lr=float(0.1, 0.01)"], "a range takes two numbers, the lower first"),
    (["--param", "lr=log(0, 1)"], "log(A, B) needs A > 0"),
    (["--param", "lr=3"], "give a range"),
    (["--param", "minibatch_size=[64, 100000]"], "minibatch_size 100000 is larger than a batch"),
    (["--param", "lr"], "--param expects NAME=SPEC"),
    (["--trials", "0"], "--trials must be at least 1"),
    (["--n-jobs", "0"], "--n-jobs must be at least 1"),
    (["--total-steps", "0"], "--total-steps must be at least 1, got 0"),  # not the preset's: it is not unset
    (["--timeout-s", "0"], "--timeout-s must be positive, got 0"),  # a study of no trials, where it was taken
    (["--n-jobs", "2", "--set", "backend=ray"], "trials on the ray backend run one at a time"),
    (["--metric", "loss/value"], "--metric names a column of the evaluations (eval.csv)"),
    (["--direction", "up"], "--direction is maximize or minimize, got 'up'"),
    (["--sampler", "grid"], "--sampler"),
    (["--pruner", "threshold"], "--pruner"),
    (["--n-trials", "5", "--n-startup-trials", "2"],  # rl-zoo's names, and shoal train's, get shoal tune's
     "rl-zoo's n_trials: shoal calls it --trials; rl-zoo's n_startup_trials: shoal calls it --startup-trials"),
    (["--run-dir", "runs/x"], "shoal train's run_dir: shoal calls it --study-dir here (each trial's run is a "),
    (["--n-timesteps", "1000"], "rl-zoo's n_timesteps: shoal calls it --total-steps"),
]


@pytest.mark.parametrize("flags, message", MISTAKES)
def test_a_mistaken_search_ends_in_one_line_before_any_trial(tmp_path, capsys, flags, message):
    code = main(["tune", "ppo", "--env", "CartPole-v1", *flags, "--study-dir", str(tmp_path / "study")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "study").exists()


def test_every_algorithm_has_a_default_space_whose_values_make_valid_settings():
    from shoal import algos

    assert set(SPACES) == set(algos.ALGOS)
    for name, space in SPACES.items():
        spec = algos.get(name)
        for setting, text in space.items():
            for value in Param.parse(setting, text).values():
                spec.config_cls(**{setting: value})


@pytest.mark.parametrize("algo, env, drops", [("ppo", "MiniGrid-Empty-5x5-v0", True),
                                              ("trpo", "MiniGrid-Empty-5x5-v0", True),
                                              ("dqn", "MiniGrid-Empty-5x5-v0", True), ("ppo", "CartPole-v1", False),
                                              ("sac", "PixelReach-v0", False)])
def test_the_default_space_leaves_out_what_linear_heads_on_shoals_cnn_do_not_take(algo, env, drops):
    """PPO's and DQN's heads on the convolutional encoder are linear: hidden_sizes and activation
    would be searched for nothing. SAC's MLPs come after its encoders, and vectors take them."""
    from shoal import algos
    from shoal.tuning import default_space

    spec = algos.get(algo)
    space = default_space(spec, shoal.make_config(algo, env))
    assert ({"hidden_sizes", "activation"} & space.keys() == set()) is drops, space
    assert space.keys() <= SPACES[algo].keys() and "lr" in space
    if drops:  # with your own encoder the MLPs come after it, so they are searched
        assert "hidden_sizes" in default_space(spec, shoal.make_config(algo, env, encoder="user_encoders:SmallCNN"))


def test_a_choice_of_lists_is_drawn_and_stored_by_its_text():
    p = Param.parse("hidden_sizes", "[[64, 64], [256, 256]]")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = {tuple(p.suggest(study.ask())) for _ in range(12)}
    assert drawn == {(64, 64), (256, 256)}
    assert set(study.trials[0].params.values()) <= {"[64, 64]", "[256, 256]"}


def test_the_python_api_returns_the_study(tmp_path):
    study = shoal.tune("sac", "Pendulum-v1", trials=1, total_steps=600, evaluations=1,
                       params={"tau": [0.005, 0.02]}, sets={"learning_starts": 100, "env_wrappers": [user_wrappers.ScaleReward]},
                       study_dir=tmp_path / "s")
    assert study.best_params["tau"] in (0.005, 0.02) and study.best_trial_dir == tmp_path / "s" / "trial_0000"
    assert study.best_value == pytest.approx(float(rows(tmp_path / "s")[0]["value"]))
    # the fixed settings as a config file holds them (a class from Python: its import path)
    assert yaml.safe_load((tmp_path / "s" / "best.yaml").read_text())["env_wrappers"] == ["user_wrappers:ScaleReward"]


def test_trials_run_in_several_processes_share_the_study_each_drawing_its_own_settings(tmp_path, capfd):
    study = tmp_path / "study"
    assert main(["tune", "ppo", "--env", "CartPole-v1", "--trials", "5", "--n-jobs", "2", *TRIAL, "--no-prune",
                 "--param", "lr=log(1e-4, 1e-2)", "--study-dir", str(study)]) == 0
    out = capfd.readouterr().out  # the second process's lines too, where the first prints them
    assert "5 trials of 2,048 steps, 2 at a time" in out
    done = [line.split(":")[0] for line in out.splitlines() if ": eval return" in line and "best" not in line]
    assert sorted(done) == [f"trial {n}" for n in range(5)]
    trials = rows(study)
    assert [t["trial"] for t in trials] == ["0", "1", "2", "3", "4"] and {t["state"] for t in trials} == {"complete"}
    assert len({t["lr"] for t in trials}) == 5  # the processes' samplers are seeded apart
    for t in trials:
        ran = yaml.safe_load((study / f"trial_{int(t['trial']):04d}" / "config.yaml").read_text())
        assert ran["lr"] == pytest.approx(float(t["lr"]))
    assert yaml.safe_load((study / "best.yaml").read_text())["lr"] == pytest.approx(
        float(max(trials, key=lambda t: float(t["value"]))["lr"]))



def test_a_study_judges_trials_by_the_metric_it_is_given_in_its_direction(tmp_path, capsys):
    """eval/score (the episode's length, given at its last step: --episode-info) minimised: each
    trial's value is its final evaluation's score, and the best is the lowest."""
    study = tmp_path / "study"
    argv = ["tune", "ppo", "--env", "CartPole-v1", "--trials", "3", *TRIAL, "--no-prune", "--param",
            "lr=log(1e-4, 1e-2)", "--set", "episode_info=[score]", "env_wrappers=[user_wrappers:EpisodeScore]",
            "--metric", "eval/score", "--direction", "minimize", "--study-dir", str(study)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "to minimize eval/score" in out and "trial 0: eval/score " in out
    trials = rows(study)
    for t in trials:
        with open(study / f"trial_{int(t['trial']):04d}" / "eval.csv") as f:
            assert float(t["value"]) == pytest.approx(float(list(csv.DictReader(f))[-1]["eval/score"]))
    lowest = min(trials, key=lambda t: float(t["value"]))
    assert (study / "best.yaml").read_text().startswith(f"# shoal tune: trial {lowest['trial']}, eval/score ")
    argv[argv.index("minimize")] = "maximize"  # the same study judged the other way: refused
    assert main(argv) == 2
    assert "holds a study with other direction" in capsys.readouterr().err
    assert main(["tune", "ppo", "--env", "CartPole-v1", "--trials", "1", *TRIAL, "--metric", "eval/absent",
                 "--study-dir", str(tmp_path / "absent")]) == 1  # no trial gave it: none completes
    assert "failed: its evaluations gave no eval/absent" in capsys.readouterr().out


def test_sigterm_to_the_command_alone_ends_the_other_processes_trials_saved(tmp_path):
    """A scheduler's or `timeout`'s stop reaches the `shoal` process only. Here it comes once that
    process has run its trial and waits for the other's (the sampler seeded 1 draws 1 epoch there,
    seeded 2 draws 20 in the other process, whose trial so takes ~7x as long): the other process's
    trial is ended saved, as Ctrl-C ends it, instead of running on orphaned, and the study's
    results are written."""
    import signal
    import subprocess
    import sys
    import time

    from shoal import checkpoint as ckpt

    study, steps = tmp_path / "study", 12_000
    # pytest-xdist's workers ignore SIGINT and a child inherits that: the command restores it (a shell's does)
    command = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "runpy.run_module('shoal.cli', run_name='__main__', alter_sys=True)")
    p = subprocess.Popen([sys.executable, "-c", command, "tune", "ppo", "--env", "CartPole-v1", "--trials", "2",
                          "--total-steps", str(steps), "--evaluations", "1", "--n-jobs", "2", "--no-prune",
                          "--seed", "1", "--param", "num_epochs=[20, 1]", "--set", "minibatch_size=32",
                          "--study-dir", str(study)],
                         stdout=subprocess.DEVNULL, stderr=(tmp_path / "err").open("w"))
    deadline = time.time() + 120

    def complete() -> int:
        try:
            trials = optuna.load_study(study_name="shoal", storage=f"sqlite:///{study / 'study.db'}").trials
        except Exception:  # not made yet
            return 0
        return sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)

    while not complete() and time.time() < deadline:  # the first trial has ended
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)
    err = (tmp_path / "err").read_text()
    assert p.returncode == 130 and "interrupted; the study's trials are in" in err and "Traceback" not in err, err
    trials = {int(t["num_epochs"]): t for t in rows(study)}
    assert trials[1]["state"] == "complete" and int(trials[1]["env_steps"]) >= steps
    slow = study / f"trial_{int(trials[20]['trial']):04d}"
    assert 0 < ckpt.read_meta(ckpt.resolve(slow))["env_steps"] < steps  # saved where it had come to
    size = (slow / "progress.csv").stat().st_size
    time.sleep(2)  # and no process trains on
    assert (slow / "progress.csv").stat().st_size == size


def test_a_study_whose_tables_another_process_makes_meanwhile_opens(tmp_path, monkeypatch):
    """A new study.db's tables are made by whichever process opens it first; one that loses the
    race (its CREATE TABLE finds the table made: a fresh clone's test polling the study did that
    to `shoal tune`, 2026-11-29) opens it again instead of failing."""
    import optuna
    import sqlalchemy

    from shoal import tuning

    real, calls = optuna.storages.RDBStorage, []

    def racing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the other process makes the tables while this one does
            real(*args, **kwargs)
            raise sqlalchemy.exc.OperationalError("CREATE TABLE trials", {}, Exception("table trials already exists"))
        return real(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    storage = tuning._storage(tmp_path)
    assert len(calls) == 2 and storage.get_all_studies() == []
    calls.clear()

    def locked(*args, **kwargs):
        calls.append(1)
        raise sqlalchemy.exc.OperationalError("SELECT", {}, Exception("database is locked"))

    monkeypatch.setattr(optuna.storages, "RDBStorage", locked)
    with pytest.raises(sqlalchemy.exc.OperationalError, match="database is locked"):
        tuning._storage(tmp_path)  # any other error is the user's to see, at once
    assert len(calls) == 1
