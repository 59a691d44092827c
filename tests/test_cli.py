"""The shoal command as a user meets it: the happy path, and one clear line for each mistake."""

import csv
import dataclasses
import itertools
import os
import re
import statistics
import subprocess
import sys
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
import yaml

import shoal
from shoal.algos import ALGOS
from shoal.cli import _parse, main
from shoal.config import build, parse_set, preset, preset_envs
from shoal.envs import env_spaces
from shoal.algos.ppo import PPOConfig
from shoal.errors import ConfigError, ShoalError

FAST = ["--no-progress", "--no-tensorboard", "--num-envs-per-runner", "4", "--rollout-steps", "16",
        "--minibatch-size", "32", "--num-epochs", "1", "--eval-episodes", "2"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_train_eval_plot_round_trip(capsys, tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--env", "CartPole-v1", "--total-steps", "256",
                           "--run-dir", str(run), *FAST, "--tensorboard")
    assert code == 0, err
    assert "run directory:" in err
    for name in ("config.yaml", "progress.csv", "eval.csv", "curve.png"):
        assert (run / name).is_file(), name
    assert list((run / "tb").glob("events.out.tfevents.*"))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["algo"] == "ppo" and saved["rollout_steps"] == 16 and saved["gamma"] == 0.98  # preset kept

    code, out, err = run_cli(capsys, "eval", str(run), "--episodes", "3", "--deterministic",
                             "--video", str(tmp_path / "videos"))
    assert code == 0, err
    assert "over 3 episodes (deterministic" in out
    videos = sorted((tmp_path / "videos").glob("*.mp4"))
    assert len(videos) == 3 and all(v.stat().st_size > 1000 for v in videos)
    for not_a_dir, message in ((run / "config.yaml", "is a file"), (run / "config.yaml" / "v", "Not a directory")):
        code, out, err = run_cli(capsys, "eval", str(run), "--episodes", "1", "--video", str(not_a_dir))
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err

    class NoFrames(gym.Wrapper):  # CartPole's spaces, and no render mode (a custom env's __init__ takes none)
        def __init__(self):
            super().__init__(gym.make("CartPole-v1"))
            self.metadata = {"render_modes": []}

    gym.register("NoFrames-v0", entry_point=NoFrames, max_episode_steps=50)
    code, out, err = run_cli(capsys, "eval", str(run), "--env", "NoFrames-v0", "--episodes", "1")
    assert code == 0 and "NoFrames-v0: return" in out and "over 1 episode (deterministic" in out, err
    code, out, err = run_cli(capsys, "eval", str(run), "--env", "NoFrames-v0", "--episodes", "1",
                             "--video", str(tmp_path / "none"))
    assert code == 2 and err.strip().splitlines()[-1] == (
        "shoal: error: NoFrames-v0 cannot be recorded: --video needs an env that renders 'rgb_array' frames, and "
        "its metadata's render_modes are []"), err
    assert not (tmp_path / "none").exists()
    code, out, _ = run_cli(capsys, "eval", str(run), "--episodes", "2")  # as the run's evaluations
    assert code == 0 and "over 2 episodes (deterministic" in out
    code, out, _ = run_cli(capsys, "eval", str(run), "--episodes", "2", "--stochastic")
    assert code == 0 and "over 2 episodes (stochastic" in out

    code, out, err = run_cli(capsys, "plot", str(run), str(run), "--out", str(tmp_path / "both.png"))
    assert code == 0, err
    assert (tmp_path / "both.png").stat().st_size > 10_000

    # On a headless machine (no display, no XDG_RUNTIME_DIR), in a fresh process (`python -m shoal`)
    # so that pygame starts there: the videos come with no stray "error: XDG_RUNTIME_DIR is
    # invalid" from SDL.
    headless = {k: v for k, v in os.environ.items()
                if k not in ("DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR", "SDL_VIDEODRIVER")}
    done = subprocess.run([sys.executable, "-m", "shoal", "eval", str(run), "--episodes", "1",
                           "--video", str(tmp_path / "one")], env=headless, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("wrote 1 video to "), done.stdout


def test_mujoco_envs_are_recorded_on_a_headless_machine(capsys, tmp_path):
    """Gymnasium's MuJoCo renderer tries GLFW first, which needs a display: shoal has it render
    with EGL where there is none. A renderer that fails anyway is one line with what to install,
    and leaves no empty video directory behind."""
    import ctypes.util

    pytest.importorskip("mujoco")
    if ctypes.util.find_library("EGL") is None:
        pytest.skip("this machine has no libEGL")
    run = tmp_path / "pendulum"
    code, _, err = run_cli(capsys, "train", "ppo", "--env", "InvertedPendulum-v5", "--total-steps", "64",
                           "--run-dir", str(run), *FAST)
    assert code == 0, err
    headless = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL",
                                                                 "PYOPENGL_PLATFORM")}
    record = [sys.executable, "-m", "shoal", "eval", str(run), "--episodes", "1", "--max-steps", "20",
              "--video"]
    done = subprocess.run([*record, str(tmp_path / "videos")], env=headless, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("wrote 1 video to "), done.stderr
    assert (tmp_path / "videos" / "InvertedPendulum-v5-episode-0.mp4").stat().st_size > 1000
    done = subprocess.run([*record, str(tmp_path / "none" / "here")], env={**headless, "MUJOCO_GL": "glfw"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith(
        "shoal: error: InvertedPendulum-v5 could not render a frame ("), done.stderr
    assert "MuJoCo renders with MUJOCO_GL=egl, shoal's default there" in done.stderr
    assert not (tmp_path / "none").exists()


def test_env_kwargs_reach_the_runs_envs_evaluations_resume_and_eval(capsys, tmp_path):
    """FrozenLake without slipping (is_slippery=false, as gym.make takes it) is walked in 6 steps;
    on the slippery default the same policy almost never arrives. The run's evaluations, its
    config, a resume and `shoal eval` all make the env the run trained on."""

    def evals():
        with open(run / "eval.csv") as f:
            return [(float(r["eval/return_mean"]), float(r["eval/length_mean"])) for r in csv.DictReader(f)]

    run = tmp_path / "lake"
    code, _, err = run_cli(capsys, "train", "ppo", "--env", "FrozenLake-v1", "--env-kwargs", "is_slippery=false",
                           "--total-steps", "12000", "--eval-interval", "4000", "--run-dir", str(run), "--no-progress")
    assert code == 0, err
    assert yaml.safe_load((run / "config.yaml").read_text())["env_kwargs"] == {"is_slippery": False}
    assert evals()[-1] == (1.0, 6.0)
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "16000", "--no-progress")
    assert code == 0, err
    assert len(evals()) == 4 and evals()[-1] == (1.0, 6.0)
    code, out, _ = run_cli(capsys, "eval", str(run), "--episodes", "20")
    assert code == 0 and "return 1.00 ± 0.00 over 20 episodes (deterministic; length 6.0" in out
    code, out, _ = run_cli(capsys, "eval", str(run), "--episodes", "50", "--env-kwargs", "is_slippery=true")
    assert code == 0 and float(out.split("return ")[1].split()[0]) < 0.5
    code, _, err = run_cli(capsys, "eval", str(run), "--env-kwargs", "map_name=8x8")
    assert code == 2 and "does not fit FrozenLake-v1: the env gives observations Box(0.0, 1.0, (64,), float32)" in err


def test_cuda_graph_off_a_gpu_or_on_crossq_is_refused_in_one_line_before_a_run_directory(capsys, tmp_path):
    for algo, device, message in (
            ("sac", "cpu", "--cuda-graph records the learner's updates on a GPU: it takes --device cuda (this "
                           "learner is on cpu; --no-cuda-graph trains without it)"),
            ("tqc", "cpu", "it takes --device cuda"),
            ("crossq", "cuda", "--cuda-graph records the updates of sac and tqc, not crossq's")):
        run = tmp_path / algo
        code, _, err = run_cli(capsys, "train", algo, "--env", "Pendulum-v1", "--cuda-graph", "--device", device,
                               "--run-dir", str(run), "--no-progress")
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
        assert not run.exists()


def test_spaces_shoal_cannot_train_on_are_refused_in_one_line_before_a_run_directory(capsys, tmp_path):
    class Spaces(gym.Env):
        def __init__(self, observation_space, action_space):
            self.observation_space, self.action_space = observation_space, action_space

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), 0.0, False, True, {}

    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    gym.register("TextObs-v0", entry_point=Spaces, kwargs={"observation_space": gym.spaces.Text(5),
                                                           "action_space": gym.spaces.Discrete(2)})
    gym.register("Unbounded-v0", entry_point=Spaces, kwargs={
        "observation_space": box, "action_space": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)})
    for algo, env, message in (
            ("ppo", "TextObs-v0", "is not supported: shoal trains on Box observations, and on Discrete, "
                                  "MultiDiscrete, MultiBinary ones and Tuples or Dicts of those"),
            ("sac", "Unbounded-v0", "has infinite bounds: this algorithm's actor scales its actions to the bounds"),
            ("td3", "Unbounded-v0", "or train ppo, a2c or trpo")):
        run = tmp_path / f"{algo}-{env}"
        code, _, err = run_cli(capsys, "train", algo, "--env", env, "--run-dir", str(run), "--no-progress")
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
        assert not run.exists()
    code, _, err = run_cli(capsys, "train", "ppo", "--env", "Unbounded-v0", "--total-steps", "64",
                           "--run-dir", str(tmp_path / "ppo"), *FAST)
    assert code == 0, err  # Gaussian actions need no bounds


def test_progress_where_stderr_is_not_a_terminal_is_a_plain_line_every_interval(capsys, tmp_path, monkeypatch):
    """A batch job's log (or `| tee`, CI) gets whole lines as training goes, not rich's bar drawn
    once at the end and cut to 80 columns."""
    import shoal.trainer

    monkeypatch.setattr(shoal.trainer, "PROGRESS_LINE_S", 0.0)  # a line each iteration
    run = tmp_path / "logged"
    fast = [a for a in FAST if a != "--no-progress"]
    code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "256", "--run-dir", str(run), *fast)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == f"ppo CartPole-v1: training to 256 env steps in {run} (a line every 0 s)"
    steps = [line for line in lines if " steps " in line and "/s return " in line]
    assert len(steps) == 4 and "━" not in err  # 4 iterations of 64 steps
    assert steps[-1].startswith("ppo CartPole-v1       256/256 steps 100% ") and " ETA 0:00:00" in steps[-1]
    assert all(len(line) > 80 for line in steps)  # never cut to a terminal's width
    monkeypatch.setattr(shoal.trainer, "PROGRESS_LINE_S", 3600.0)
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "512")
    assert code == 0 and len(err.splitlines()) == 6 and "training to 512 env steps" in err, err  # that line and the summary's 5


def test_a_learner_whose_threads_wait_for_cpus_advises_one_torch_thread_once(capsys, tmp_path, monkeypatch):
    """Torch's threads wait for each other at every op, so beside processes that hold the cores
    a learner with several slows many times over (shoal.learner.CpuWait): the run says so, once,
    and progress.csv keeps the share."""
    import shoal.learner

    reads = itertools.count()
    monkeypatch.setattr(shoal.learner, "CPU_WAIT_WINDOW_S", 0.0)  # a window each update
    monkeypatch.setattr(shoal.learner.CpuWait, "read", staticmethod(lambda: {"1": (next(reads) * 10**9,) * 2}))
    for threads in (2, 1):
        run = tmp_path / f"t{threads}"
        code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "256", "--run-dir", str(run),
                               "--torch-threads", str(threads), *FAST)
        notes = [line for line in err.splitlines() if "waited for a CPU" in line]
        assert code == 0 and len(notes) == (threads > 1), err
        assert all("50% of their time" in n and "--torch-threads 1" in n for n in notes), notes
        rows = shoal.rundir.read_rows(run / "progress.csv")
        assert [float(r["learner/cpu_wait"]) for r in rows] == [0.5] * 4


def test_stop_time_s_ends_a_run_by_its_wall_time_and_a_resume_needs_more(capsys, tmp_path):
    run = tmp_path / "timed"
    code, out, err = run_cli(capsys, "train", "ppo", "--stop-time-s", "2", "--total-steps", "100000000",
                             "--eval-interval", "0", "--run-dir", str(run), *FAST)
    assert code == 0, err
    # the summary goes where the progress bar does, with the wall time that stopped it (and not only
    # the seconds of training, which leave out start-up and evaluations)
    wall = float(err.split("stopped at --stop-time-s (")[1].split(" s of wall time")[0])
    assert "start-up and evaluations included): eval return" in err and wall >= 2, err
    with open(run / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    # the last row is stamped as its iteration ends, the limit checked just after: a hair under 2
    # there (1.9996 s in one run) is the same stop
    assert 1.95 <= float(rows[-1]["time/wall_s"]) < 10 and int(rows[-1]["env_steps"]) < 100_000_000
    assert float(rows[-2]["time/wall_s"]) < 2  # the first iteration past the limit was the last
    code, _, err = run_cli(capsys, "train", "--resume", str(run))
    assert code == 2 and f"{run} already ran for " in err and "pass a larger --stop-time-s to train on" in err
    code, out, err = run_cli(capsys, "train", "--resume", str(run), "--stop-time-s", "4")
    assert code == 0 and "stopped at --stop-time-s" in err, err
    code, _, err = run_cli(capsys, "train", "ppo", "--stop-time-s", "0")
    assert code == 2 and "stop_time_s must be positive" in err
    # a limit that start-up alone exceeds still trains one iteration (as RLlib's time_total_s),
    # so the run has its row, a checkpoint and a plot rather than failing at the plot
    short = tmp_path / "short"
    code, _, err = run_cli(capsys, "train", "ppo", "--stop-time-s", "0.001", "--run-dir", str(short), *FAST)
    assert code == 0 and "stopped at --stop-time-s" in err, err
    with open(short / "progress.csv") as f:
        assert len(list(csv.DictReader(f))) == 1
    assert (short / "curve.png").exists() and (short / "checkpoints" / "ckpt_000000001").is_dir()


def test_plot_of_a_directory_of_runs_overlays_each_run_in_it(capsys, tmp_path):
    runs = tmp_path / "runs"
    for seed in (1, 2):
        code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "128", "--seed", str(seed), "--run-dir",
                               str(runs / f"s{seed}"), *FAST)
        assert code == 0, err
    (runs / "notes").mkdir()  # not a run: passed over
    code, out, err = run_cli(capsys, "plot", str(runs))
    assert code == 0 and out.strip() == f"wrote {runs / 'curves.png'}", err
    from matplotlib.image import imread

    code, out, err = run_cli(capsys, "plot", str(runs / "s1"), str(runs / "s2"), "--out", str(tmp_path / "both.png"))
    assert code == 0, err
    assert (imread(runs / "curves.png") == imread(tmp_path / "both.png")).all()  # the same two runs, overlaid
    code, _, err = run_cli(capsys, "plot", str(runs / "notes"))  # a directory holding no run
    assert code == 2 and "notes has no progress.csv" in err, err


def test_a_plot_of_many_runs_gives_each_a_colour_and_one_legend_entry_beside_the_panels(tmp_path, monkeypatch):
    """A study's 20 trials, say: with the two-entries-a-run legend of a few runs, it covered the curves."""
    import matplotlib.pyplot as plt

    from shoal import plot

    runs = []
    for i in range(6):
        run = tmp_path / f"trial_{i}"
        run.mkdir()
        (run / "progress.csv").write_text("env_steps,time/wall_s,episode/return_mean\n100,1,10\n200,2,20\n")
        (run / "eval.csv").write_text(f"env_steps,time/wall_s,eval/return_mean\n200,2,{i}\n")
        runs.append(run)
    drawn = []
    monkeypatch.setattr(plot, "save_figure", lambda fig, out: (drawn.append(fig), plt.close(fig), out)[-1])
    plot.plot_runs(runs, tmp_path / "all.png")
    steps, wall = drawn[0].axes
    assert steps.get_legend() is None and [t.get_text() for t in wall.get_legend().get_texts()] == [
        f"trial_{i}" for i in range(6)]
    assert len({tuple(line.get_color()) for line in steps.lines}) == 6  # the train and eval lines of a run share one
    plot.plot_runs(runs[:2], tmp_path / "two.png")  # a few runs: a train and an eval entry each, inside
    assert len(drawn[1].axes[0].get_legend().get_texts()) == 4


def test_plot_aggregate_draws_each_settings_mean_over_its_seeds_labelled_by_what_differs(tmp_path, monkeypatch, capsys):
    import matplotlib.pyplot as plt

    from shoal import plot

    runs = tmp_path / "runs"
    # (lr, seed): its evaluations (env steps, wall seconds, return); the second lr=0.001 run stopped early
    evals = {(0.001, 0): [(100, 1, 10), (200, 2, 20)], (0.001, 1): [(100, 1, 30)],
             (0.003, 0): [(100, 1, 50), (200, 2, 70)], (0.003, 1): [(100, 1, 70), (200, 2, 90)]}
    for (lr, seed), points in evals.items():
        run = runs / f"lr{lr}-s{seed}"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(f"algo: ppo\nenv: CartPole-v1\nlr: {lr}\nseed: {seed}\nrun_dir: {run}\n")
        (run / "progress.csv").write_text("env_steps,time/wall_s,episode/return_mean\n100,1,10\n")
        (run / "eval.csv").write_text("env_steps,time/wall_s,eval/return_mean\n"
                                      + "".join(f"{x},{t},{y}\n" for x, t, y in points))
    drawn = []
    monkeypatch.setattr(plot, "save_figure", lambda fig, out: (drawn.append(fig), plt.close(fig), out)[-1])
    assert main(["plot", str(runs), "--aggregate"]) == 0
    steps = drawn[0].axes[0]
    assert [t.get_text() for t in steps.get_legend().get_texts()] == ["lr=0.001 (2 runs)", "lr=0.003 (2 runs)"]
    # the run that stopped holds its last return: (10 + 30) / 2, then (20 + 30) / 2
    assert [list(line.get_ydata()) for line in steps.lines] == [[20, 25], [60, 80]]
    # rliable's IQM (of 2 runs, their mean) with a bootstrap band: at a point, from the lower run's value to the
    # higher's, the resamples of two runs holding both, one of them twice, or the other twice
    assert main(["plot", str(runs), "--aggregate", "--stat", "iqm"]) == 0
    steps = drawn[-1].axes[0]
    assert [list(line.get_ydata()) for line in steps.lines] == [[20, 25], [60, 80]]
    assert steps.get_ylabel() == "eval return (IQM, 95% bootstrap CI over runs)"
    band = steps.collections[1].get_paths()[0].vertices  # lr=0.003's: 50 to 70 at 100 steps, 70 to 90 at 200
    assert {tuple(v) for v in band} >= {(100, 50), (200, 70), (100, 70), (200, 90)}
    assert main(["plot", str(runs), "--stat", "iqm"]) == 2
    assert "--stat draws a group of runs: give --aggregate too" in capsys.readouterr().err
    (runs / "lr0.001-s1" / "config.yaml").unlink()
    assert main(["plot", str(runs), "--aggregate"]) == 2
    assert "lr0.001-s1 has no config.yaml" in capsys.readouterr().err


def test_plot_metric_draws_a_column_of_either_metrics_file_and_names_the_columns_when_absent(tmp_path, monkeypatch,
                                                                                             capsys):
    import matplotlib.pyplot as plt

    from shoal import plot

    runs = tmp_path / "runs"
    for seed, scores, losses in ((0, [1, 3], [0.5, 0.25, 0.125]), (1, [3, 7], [0.75, 0.5, 0.25])):
        run = runs / f"s{seed}"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(f"algo: ppo\nenv: CartPole-v1\nseed: {seed}\n")
        (run / "progress.csv").write_text("env_steps,time/wall_s,episode/return_mean,loss/value\n"
                                          + "".join(f"{50 * (i + 1)},{i},9,{v}\n" for i, v in enumerate(losses)))
        (run / "eval.csv").write_text("env_steps,time/wall_s,eval/return_mean,eval/score\n"
                                      + "".join(f"{100 * (i + 1)},{i},9,{v}\n" for i, v in enumerate(scores)))
    drawn = []
    monkeypatch.setattr(plot, "save_figure", lambda fig, out: (drawn.append(fig), plt.close(fig), out)[-1])
    assert main(["plot", str(runs / "s0"), "--metric", "loss/value"]) == 0  # progress.csv's column
    steps = drawn[-1].axes[0]
    assert [list(line.get_ydata()) for line in steps.lines] == [[0.5, 0.25, 0.125]]
    assert steps.get_ylabel() == "loss/value"
    assert main(["plot", str(runs), "--metric", "eval/score", "--aggregate"]) == 0  # eval.csv's, over the seeds
    steps = drawn[-1].axes[0]
    assert [list(line.get_ydata()) for line in steps.lines] == [[2, 5]]
    assert steps.get_ylabel() == "eval/score (mean ± std over runs)"
    capsys.readouterr()
    for extra in ([], ["--aggregate"]):
        assert main(["plot", str(runs), "--metric", "eval/absent", *extra]) == 2
        err = capsys.readouterr().err
        assert err.strip() == ("shoal: error: no run has logged eval/absent yet; their eval.csv holds "
                               "eval/return_mean, eval/score"), err


def test_train_with_seeds_runs_each_in_turn_and_reports_them_together(capsys, tmp_path):
    runs = tmp_path / "seeds"
    code, _, err = run_cli(capsys, "train", "ppo", "--seeds", "3", "5", "--total-steps", "256", "--run-dir", str(runs),
                           *FAST)
    assert code == 0, err
    for seed in (3, 5):
        assert yaml.safe_load((runs / f"seed_{seed}" / "config.yaml").read_text())["seed"] == seed
    finals = [float(list(csv.DictReader(open(runs / f"seed_{seed}" / "eval.csv")))[-1]["eval/return_mean"])
              for seed in (3, 5)]
    line = next(line for line in err.splitlines() if line.startswith("2 seeds: final eval return"))
    assert f"± {statistics.pstdev(finals):.1f}" in line and "seed 3: " in line and "seed 5: " in line, line
    iqm_line = err.splitlines()[err.splitlines().index(line) + 1]  # of two: their mean, and the bootstrap's range
    assert iqm_line.startswith(f"  IQM {np.mean(finals):.1f}, 95% CI {min(finals):.1f} to {max(finals):.1f} "
                               "(bootstrap over the seeds"), iqm_line
    assert (runs / "curves.png").exists()
    # shoal eval of the directory evaluates each seed's run, then their mean over the runs
    code, out, err = run_cli(capsys, "eval", str(runs), "--episodes", "2")
    assert code == 0, err
    lines = (out + err).strip().splitlines()
    per_run = [float(re.search(r"return (\S+) ±", line)[1]) for line in lines[:2]]
    assert [f"seed_{seed}" in line for line, seed in zip(lines, (3, 5))] == [True, True], lines
    assert lines[2] == f"2 runs: return {np.mean(per_run):.1f} ± {np.std(per_run):.1f} over the runs' mean returns"
    assert lines[3].startswith(f"  IQM {np.mean(per_run):.1f}, 95% CI {min(per_run):.1f} to {max(per_run):.1f}")
    code, _, err = run_cli(capsys, "export", str(runs))  # it takes one run: say which the directory holds
    assert code == 2 and err.strip().endswith(f"{runs} holds 2 runs, not a run: give one of them (seed_3, "
                                              "seed_5)"), err
    for argv, message in ((["--seeds", "1", "--seed", "2"], "give --seed for one run or --seeds for several"),
                          (["--seeds", "1", "x"], "--seeds takes whole numbers"),
                          (["--seeds", "1", "1"], "--seeds takes different seeds"),
                          (["--seeds", "3", "--run-dir", str(runs)], f"{runs / 'seed_3'} already holds a run")):
        code, _, err = run_cli(capsys, "train", "ppo", *argv, "--total-steps", "64", *FAST)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_directory_of_seeds_resumes_in_one_command_begun_runs_go_on_and_the_others_start(capsys, tmp_path):
    import shutil

    runs = tmp_path / "seeds"
    code, _, err = run_cli(capsys, "train", "ppo", "--seeds", "3", "5", "7", "--total-steps", "256", "--run-dir",
                           str(runs), *FAST)
    assert code == 0, err
    assert yaml.safe_load((runs / "seeds.yaml").read_text())["seeds"] == [3, 5, 7]
    shutil.rmtree(runs / "seed_7")  # as if Ctrl-C had come before its run began
    for jobs in ("1", "2"):  # on, then nothing left; in turn, then at once
        total = "512"
        code, _, err = run_cli(capsys, "train", "--resume", str(runs), "--total-steps", total, "--n-jobs", jobs,
                               "--no-progress")
        assert code == 0, err
        for seed in (3, 5, 7):
            saved = yaml.safe_load((runs / f"seed_{seed}" / "config.yaml").read_text())
            assert saved["seed"] == seed and saved["total_steps"] == 512
            with open(runs / f"seed_{seed}" / "progress.csv") as f:
                assert int(list(csv.DictReader(f))[-1]["env_steps"]) == 512
        ended = err.count("(it had ended before: nothing left to train)")
        assert ended == (0 if jobs == "1" else 3), err
        line = next(line for line in err.splitlines() if line.startswith("3 seeds: final eval return"))
        if jobs == "1":
            first = line
    assert line == first  # the runs that had ended give the returns they ended with
    assert yaml.safe_load((runs / "seeds.yaml").read_text())["settings"]["total_steps"] == 512  # as resumed
    (runs / "other").mkdir()
    code, _, err = run_cli(capsys, "train", "ppo", "--seeds", "9", "--lr", "0.01", "--total-steps", "64",
                           "--run-dir", str(runs), *FAST)
    assert code == 2 and f"{runs} holds seeds of other settings" in err and len(err.strip().splitlines()) == 1, err
    assert not (runs / "seed_9").exists()


def test_stop_episodes_ends_a_run_after_that_many_training_episodes_and_a_resume_needs_more(capsys, tmp_path):
    """SB3's StopTrainingOnMaxEpisodes, RLlib's num_episodes_lifetime: the training episodes of every
    env together, the sessions' before a resume too; the run stops after the iteration that reached
    them, evaluates and saves."""
    run = tmp_path / "episodes"
    code, _, err = run_cli(capsys, "train", "ppo", "--stop-episodes", "30", "--total-steps", "100000000",
                           "--eval-interval", "0", "--log-interval", "1", "--run-dir", str(run), *FAST)
    assert code == 0 and "stopped at --stop-episodes (" in err, err
    rows = shoal.rundir.read_rows(run / "progress.csv")
    counts = [int(float(r["episode/count"])) for r in rows]
    assert counts[-1] >= 30 > counts[-2], counts  # the first iteration past the limit was the last
    assert f"stopped at --stop-episodes ({counts[-1]:,} training episodes): eval return" in err, err
    code, _, err = run_cli(capsys, "train", "--resume", str(run))
    assert code == 2 and (f"{run} already ended {counts[-1]:,} training episodes of stop_episodes=30: pass a larger "
                          "--stop-episodes to train on") in err, err
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--stop-episodes", str(counts[-1] + 20))
    assert code == 0 and "stopped at --stop-episodes (" in err, err
    assert int(float(shoal.rundir.read_rows(run / "progress.csv")[-1]["episode/count"])) >= counts[-1] + 20
    code, _, err = run_cli(capsys, "train", "ppo", "--stop-episodes", "0")
    assert code == 2 and "stop_episodes must be at least 1" in err


@pytest.mark.parametrize("flag, limit", [("--stop-time-s", "0.001"), ("--stop-episodes", "5")])
def test_seeds_stopped_by_a_limit_of_their_own_have_ended_for_a_resume_of_their_directory(capsys, tmp_path, flag,
                                                                                          limit):
    runs = tmp_path / "seeds"
    code, _, err = run_cli(capsys, "train", "ppo", "--seeds", "1", "2", flag, limit, "--total-steps", "100000",
                           "--run-dir", str(runs), *FAST)
    assert code == 0 and err.count(f"stopped at {flag}") == 2, err
    code, _, err = run_cli(capsys, "train", "--resume", str(runs), "--no-progress")
    assert code == 0 and err.count("(it had ended before: nothing left to train)") == 2, err
    assert err.count(f"stopped at {flag}") == 2, err


def test_seeds_run_at_once_with_n_jobs_give_the_runs_they_give_one_after_another(capsys, tmp_path):
    lines = {}
    for jobs in ("1", "2"):
        runs = tmp_path / f"jobs{jobs}"
        code, _, err = run_cli(capsys, "train", "ppo", "--seeds", "3", "5", "7", "--n-jobs", jobs, "--total-steps",
                               "512", "--run-dir", str(runs), *FAST)
        assert code == 0, err
        lines[jobs] = next(line for line in err.splitlines() if line.startswith("3 seeds: final eval return"))
        for seed in (3, 5, 7):
            assert yaml.safe_load((runs / f"seed_{seed}" / "config.yaml").read_text())["seed"] == seed
    assert err.count(" of 3): ") == 3 and err.count(" done):") == 3  # each seed as it starts and ends
    assert lines["2"] == lines["1"]  # each seed's run is its own in a process of its own: the same returns
    for argv, message in ((["--n-jobs", "2"], "--n-jobs runs --seeds' runs at once: give --seeds too"),
                          (["--seeds", "1", "2", "--n-jobs", "0"], "--n-jobs must be at least 1"),
                          (["--seeds", "1", "2", "--n-jobs", "2", "--backend", "ray"], "runs on the ray backend")):
        code, _, err = run_cli(capsys, "train", "ppo", *argv, "--total-steps", "64", "--run-dir",
                               str(tmp_path / "refused"), *FAST)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "refused").exists()


def test_plot_of_runs_with_nothing_to_draw_fails_in_one_line_and_writes_nothing(capsys, tmp_path):
    import matplotlib.pyplot as plt

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "progress.csv").write_text("iteration,env_steps,time/wall_s,episode/return_mean\n")
    (tmp_path / "other").mkdir()
    binary, garbled = tmp_path / "binary", tmp_path / "garbled"  # files shoal did not write
    binary.mkdir()
    (binary / "progress.csv").write_bytes(b"\xff\xfe\x00")
    garbled.mkdir()
    (garbled / "progress.csv").write_text("env_steps,episode/return_mean,time/elapsed_s\nabc,1,2\n")
    out = tmp_path / "curve.png"
    for runs, message in (([empty], "nothing to plot yet"), ([empty, tmp_path / "other"], "has no progress.csv"),
                          ([binary], f"{binary / 'progress.csv'} is not a metrics file shoal can read "
                                     "(UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff"),
                          ([garbled], "could not convert string to float: 'abc'")):
        if runs == [garbled]:
            for_csv = tmp_path / "huge"  # a field past the csv module's limit (131,072 characters)
            for_csv.mkdir()
            (for_csv / "progress.csv").write_text("env_steps,episode/return_mean\n1," + "9" * 200_000 + "\n")
            code, _, err = run_cli(capsys, "plot", str(for_csv), "--out", str(out))
            assert code == 2 and "(Error: field larger than field limit (131072))" in err, err
        code, _, err = run_cli(capsys, "plot", *map(str, runs), "--out", str(out))
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and plt.get_fignums() == []  # no figure left open in the process


@pytest.mark.parametrize("log", ["progress.csv", "eval.csv"])
def test_a_resume_whose_metrics_file_was_overwritten_is_refused_in_one_line_until_it_is_moved_aside(capsys, tmp_path, log):
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "64", "--run-dir", str(run), *FAST)
    assert code == 0, err
    (run / log).write_bytes(b"\x00\xff binary")  # another program's output written over it
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "128", *FAST)
    assert code == 2 and err == (f"shoal: error: {run / log} is not a metrics file shoal can read (UnicodeDecodeError: "
                                 "'utf-8' codec can't decode byte 0xff in position 1: invalid start byte); move it "
                                 "aside to go on without it\n"), err
    (run / log).rename(tmp_path / "aside.csv")
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "128", *FAST)
    assert code == 0 and (run / log).read_text().startswith("iteration,env_steps,"), err


def test_plot_writes_the_format_its_name_asks_for_into_a_new_directory(capsys, tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "64", "--run-dir", str(run), *FAST)
    assert code == 0, err
    for name, magic in (("a/b/curve.svg", b"<?xml"), ("curve.pdf", b"%PDF"), ("curve", b"\x89PNG")):
        code, out, err = run_cli(capsys, "plot", str(run), "--out", str(tmp_path / name))
        assert code == 0, err
        assert (tmp_path / name).read_bytes().startswith(magic), name
    code, _, err = run_cli(capsys, "plot", str(run), "--out", str(tmp_path / "curve.foo"))
    assert code == 2 and "cannot write" in err and ".svg" in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.glob(".*tmp*")) and not (tmp_path / "curve.foo").exists()


def test_eval_acts_as_the_runs_own_evaluations_unless_told(capsys, tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "64", "--set", "eval_deterministic=false",
                           "--run-dir", str(run), *FAST)
    assert code == 0, err
    code, out, _ = run_cli(capsys, "eval", str(run), "--episodes", "2")
    assert code == 0 and "over 2 episodes (stochastic" in out
    code, out, _ = run_cli(capsys, "eval", str(run), "--episodes", "2", "--deterministic")
    assert code == 0 and "over 2 episodes (deterministic" in out


def test_layering_preset_file_set_and_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: 0.01\ngamma: 0.9\nhidden_sizes: [32, 32]\n")
    c = build(PPOConfig, "ppo", env="CartPole-v1", file=str(f), sets={"gamma": 0.95})
    assert c.num_epochs == 20  # from the CartPole preset
    assert c.lr == 0.01 and c.hidden_sizes == (32, 32)  # from the file
    assert c.gamma == 0.95  # --set beats the file
    # a run's config.yaml names its algorithm: its own is taken, another's is refused in one line
    f.write_text("algo: ppo\nlr: 0.02\n")
    assert build(PPOConfig, "ppo", env="CartPole-v1", file=str(f)).lr == 0.02
    f.write_text("algo: sac\nlr: 0.02\n")
    with pytest.raises(ConfigError, match=r"^config file .*c.yaml is for sac \(its algo: key\), not ppo: train "
                                          r"it with `shoal train sac --config .*c.yaml`, or delete that key"):
        build(PPOConfig, "ppo", env="CartPole-v1", file=str(f))


def test_numbers_in_exponent_form_are_numbers(tmp_path):
    """YAML 1.1 reads 5e-4 as text; --set lr=5e-4 and a file's "total_steps: 1e5" must still work."""
    f = tmp_path / "c.yaml"
    f.write_text("total_steps: 1e5\n")
    c = build(PPOConfig, "ppo", env="CartPole-v1", file=str(f), sets=parse_set(["lr=5e-4", "clip=2E-1"]))
    assert (c.lr, c.clip, c.total_steps) == (5e-4, 0.2, 100_000) and isinstance(c.total_steps, int)
    with pytest.raises(ConfigError, match="total_steps expects an int, got '1e-3'"):
        build(PPOConfig, "ppo", sets=parse_set(["total_steps=1e-3"]))
    with pytest.raises(ConfigError, match="lr expects a float, got 'fast'"):
        build(PPOConfig, "ppo", sets=parse_set(["lr=fast"]))
    # and so do the flags (tyro's int() refuses 1e5)
    c = _parse(PPOConfig, ["--total-steps", "1e5", "--hidden-sizes", "1e2", "64", "--lr", "5e-4"], "shoal train ppo",
               default=PPOConfig())
    assert (c.total_steps, c.hidden_sizes, c.lr) == (100_000, (100, 64), 5e-4) and isinstance(c.total_steps, int)
    with pytest.raises(ShoalError, match=r"^Error parsing --total-steps: '2.5' is not a whole number"):
        _parse(PPOConfig, ["--total-steps", "2.5"], "shoal train ppo", default=PPOConfig())
    # optional ones too, None still taken; a mistake names the type alone (tyro listed each member of the union)
    c = _parse(PPOConfig, ["--frame-stack", "4e0", "--stop-return", "None", "--run-dir", "r"], "shoal train ppo",
               default=PPOConfig(stop_return=400.0))
    assert (c.frame_stack, c.stop_return, c.run_dir) == (4, None, "r") and isinstance(c.frame_stack, int)
    assert _parse(PPOConfig, ["--stop-return", "4e2"], "shoal train ppo", default=PPOConfig()).stop_return == 400.0
    for flag, value, message in (("--frame-stack", "2.5", "'2.5' is not a whole number"),
                                 ("--stop-return", "high", "could not convert string to float: 'high'")):
        with pytest.raises(ShoalError, match=rf"^Error parsing {flag}: {message} \(see shoal train ppo --help\)$"):
            _parse(PPOConfig, [flag, value], "shoal train ppo", default=PPOConfig())


@pytest.mark.parametrize("argv, message", [
    (["train", "ppx", "--env", "CartPole-v1"], "unknown algorithm 'ppx' (did you mean ppo?); available: a2c, appo, ars, crossq, ddpg, dqn, impala, ppo, qrdqn, sac, td3, tqc, trpo"),
    # a peer's name for what shoal runs with options (or lacks), not difflib's nearest name (ddqn: dqn,
    # double by default)
    (["train", "APEX_DQN", "--env", "CartPole-v1"], "unknown algorithm 'APEX_DQN': RLlib's APEX_DQN is "
                                                    "`shoal train dqn --apex --backend ray --num-env-runners 4`; "
                                                    "available: a2c, "),
    (["train", "ddqn"], "unknown algorithm 'ddqn': double DQN is `shoal train dqn` (double by default); available: "),
    (["train", "qmix"], "unknown algorithm 'qmix': QMIX is a multi-agent algorithm: shoal trains single-agent envs"),
    (["train", "ppo", "--env", "CartPol-v1"], "unknown environment 'CartPol-v1'; did you mean CartPole-v1"),
    # names are compared without their versions: whole ids matched on "-v3" (Humanoid-v3) and "-v0"
    (["train", "ppo", "--env", "Taxi-v3"], "unknown environment 'Taxi-v3'; did you mean Taxi-v4?"),
    (["train", "ppo", "--env", "NoSuchEnv-v0"], "unknown environment 'NoSuchEnv-v0'; `shoal envs` lists them"),
    (["train", "ppo", "--env", "MiniGrid/Empty-v0"], "no installed package registers the namespace 'MiniGrid' "
                                                      "(install the package that provides it, then --env "
                                                      "MODULE:MiniGrid/Empty-v0 to import it first)"),
    (["train", "ppo", "--set", "gamma=2"], "gamma must be in (0, 1]"),
    (["train", "ppo", "--set", "gama=0.9"], "unknown setting 'gama' (did you mean gamma?)"),
    (["train", "ppo", "--set", "gamma"], "--set expects key=value"),
    (["train", "ppo", "--minibatch-size", "100000"], "minibatch_size 100000 is larger than a batch (rollout_steps x envs = "),
    (["train", "ppo", "--address", "auto"], "--address joins a Ray cluster: add --backend ray"),
    (["train", "ppo", "--inference", "central", "--num-env-runners", "2", "--num-inference-servers", "3"],
     "num_inference_servers 3 is more than num_env_runners 2: runner i uses server i % 3, so 1 would serve no one"),
    # each was taken and did nothing: the runners acted for themselves, the run went on to total_steps
    (["train", "ppo", "--num-inference-servers", "2"], "num_inference_servers 2 sets how many central inference "
                                                        "servers act for the runners: add --inference central"),
    (["train", "ars", "--clip-rewards"], "ars scores each candidate by its episodes' returns: clip_rewards (the "
                                          "rewards' signs, for learners that fit values to them) does not apply"),
    (["train", "crossq", "--env", "Pendulum-v1", "--tau", "0.005"], "tau 0.005: crossq has no target networks"),
    (["train", "trpo", "--vf-coef", "1"], "vf_coef 1.0: trpo fits its value function apart (vf_epochs, "
                                          "vf_minibatch_size, lr), with no joint loss for vf_coef to weigh"),
    (["train", "ppo", "--no-share-encoder"], "--no-share-encoder gives the critic an encoder of its own, for image "
     "observations or --encoder: vectors go as they are to the actor's and the critic's own MLPs already"),
    (["train", "ppo", "--stop-return", "400", "--eval-interval", "0"], "stop_return and stop_patience stop a run at an "
     "evaluation, and eval_interval 0 evaluates at the end only: give --eval-interval N (env steps) too"),
    (["train", "ppo", "--config", "/nonexistent.yaml"], "cannot read config file /nonexistent.yaml"),
    (["train", "ppo", "--set", "hidden_sizes=abc"], "hidden_sizes expects a list of int, got 'abc'"),
    (["train", "ppo", "--set", "hidden_sizes=[64.5]"], "hidden_sizes expects a list of int, got [64.5]"),
    (["train", "ppo", "--set", "lr="], "lr needs a value (give lr=VALUE)"),
    # NaN passes every range check (each comparison is false): a stop return of NaN never stopped
    (["train", "ppo", "--stop-return", "nan"], "stop_return must be a number, got nan"),
    (["train", "ppo", "--env", "FrozenLake-v1", "--env-kwargs", "is_slipery=false"],
     "environment 'FrozenLake-v1' could not be made with env_kwargs {'is_slipery': False}: TypeError: "),
    (["train", "ppo", "--env-kwargs", "is_slippery"], "--env-kwargs expects key=value, got 'is_slippery'"),
    (["train", "ppo", "--env-kwargs", "render_mode=human"], "env_kwargs cannot set render_mode"),
    (["train", "ppo", "--set", "env_kwargs=3"], "env_kwargs expects a mapping of names to values"),
    (["train", "td3", "--env", "CartPole-v1"], "td3 needs continuous (Box) actions; use dqn, sac or ppo"),
    (["train", "dqn", "--env", "Pendulum-v1"], "dqn needs discrete actions; use sac, td3 or ddpg"),
    (["train", "--resume", "/nonexistent"], "/nonexistent is not a shoal run directory"),
    (["eval", "/nonexistent"], "/nonexistent does not exist"),
    (["eval", "/nonexistent", "--deterministic", "--stochastic"], "--deterministic and --stochastic exclude each other"),
    (["frobnicate"], "unknown command 'frobnicate'; choose from train, "),
    (["trian"], "unknown command 'trian' (did you mean train?); choose from train, "),
    (["ppo", "--env", "CartPole-v1"], "unknown command 'ppo': train it with `shoal train ppo --env ENV_ID`; choose"),
    (["record_video"], "unknown command 'record_video': rl-zoo's record_video is `shoal eval RUN_DIR --video DIR`; "),
])
def test_user_mistakes_get_one_clear_line(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2


def test_make_config_layers_the_preset_as_the_command_does():
    import shoal

    config = shoal.make_config("dqn", "CartPole-v1", lr=1e-3)
    assert (config.hidden_sizes, config.target_update_interval, config.lr) == ((256, 256), 128, 1e-3)  # preset, then ours
    assert shoal.DQNConfig(env="CartPole-v1").target_update_interval == 1000  # the class alone: its defaults
    with pytest.raises(ConfigError, match="make_config: unknown setting 'lrr' \\(did you mean lr\\?\\)"):
        shoal.make_config("dqn", "CartPole-v1", lrr=1e-3)


def test_a_missing_mujoco_names_the_extra_that_installs_it(monkeypatch):
    import gymnasium as gym

    from shoal.envs import make_env

    def no_mujoco(env_id, **kwargs):
        raise gym.error.DependencyNotInstalled('MuJoCo is not installed, run `pip install "gymnasium[mujoco]"`')

    monkeypatch.setattr(gym, "make", no_mujoco)
    with pytest.raises(ShoalError, match=r"'Hopper-v5' needs an extra package \(`pip install 'shoal\[mujoco\]'`\): "
                                         "MuJoCo is not installed"):
        make_env("Hopper-v5")
    with pytest.raises(ShoalError, match=r"'LunarLander-v3' needs an extra package: MuJoCo"):  # not a MuJoCo env
        make_env("LunarLander-v3")


# One env of each family a pattern key stands for
PATTERN_EXAMPLES = {"ALE/*": "ALE/Pong-v5", "MiniGrid-*": "MiniGrid-DoorKey-5x5-v0"}


@pytest.mark.parametrize("algo,env", [(a, PATTERN_EXAMPLES.get(e, e)) for a in sorted(ALGOS) for e in preset_envs(a)])
def test_every_shipped_preset_builds_its_algorithm_on_its_env(algo, env):
    """Each preset's keys are settings of its algorithm, its env id is registered, and the
    algorithm's policy accepts the env's spaces (a preset for the wrong action space fails here)."""
    import shoal

    assert preset(algo, env), f"{algo}'s preset for {env} is empty"
    config = shoal.make_config(algo, env)
    spec = ALGOS[algo]
    policy = spec.make_policy(config, *env_spaces(env))
    assert sum(p.numel() for p in policy.parameters()) > 0


def test_an_env_class_in_the_python_api_becomes_its_import_path_or_a_registration_of_its_name():
    """As RLlib takes an env class: one importable from its module is named by its import path (each
    process imports and registers it); one of a script, a notebook or a function is registered
    under its class name, as gym.register in the script would."""
    from gymnasium.envs.classic_control import CartPoleEnv
    from gymnasium.envs.classic_control.acrobot import AcrobotEnv

    assert PPOConfig(env=CartPoleEnv).env == "gymnasium.envs.classic_control.cartpole:CartPoleEnv"

    class ShoalTestLocalPole(CartPoleEnv):  # not reachable by import: its name is registered
        pass

    try:
        assert PPOConfig(env=ShoalTestLocalPole).env == "ShoalTestLocalPole"
        assert gym.registry["ShoalTestLocalPole"].entry_point is ShoalTestLocalPole
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Gymnasium warns of a registration overridden
            assert PPOConfig(env=ShoalTestLocalPole).env == "ShoalTestLocalPole"  # again: the same class, no conflict
        with shoal.make(PPOConfig(env=ShoalTestLocalPole, num_envs_per_runner=2, rollout_steps=8, minibatch_size=16,
                                  progress=False, tensorboard=False)) as algo:
            assert algo.train()["env_steps"] == 16

        class Other(AcrobotEnv):
            pass

        Other.__name__ = "ShoalTestLocalPole"  # another class by that name
        with pytest.raises(ConfigError, match="^env .*Other: the env id 'ShoalTestLocalPole' is registered already"):
            PPOConfig(env=Other)
    finally:
        gym.registry.pop("ShoalTestLocalPole", None)
    with pytest.raises(ConfigError, match="^env takes a Gymnasium env id, or a gymnasium.Env subclass; dict is not one$"):
        PPOConfig(env=dict)


def test_several_env_servers_as_a_list_in_the_python_api():
    config = PPOConfig(env=["remote://a:1/CartPole-v1", "remote://b:2"])
    assert config.env == "remote://a:1,b:2/CartPole-v1"
    with pytest.raises(ConfigError, match="env takes one env id, or several"):
        PPOConfig(env=["CartPole-v1", "Acrobot-v1"])


def test_a_config_file_that_is_not_yaml_gets_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [\n")
    code, _, err = run_cli(capsys, "train", "ppo", "--config", str(bad))
    assert code == 2 and f"config file {bad} is not valid YAML: expected the node content" in err
    assert "(line 2, column 1)" in err and len(err.strip().splitlines()) == 1
    binary = tmp_path / "saved.yaml"  # a file that is not text at all (a checkpoint's state.pt, say)
    binary.write_bytes(b"PK\x03\x04\xff\xfe")
    code, _, err = run_cli(capsys, "train", "ppo", "--config", str(binary))
    assert code == 2 and err == f"shoal: error: config file {binary} is not UTF-8 text (byte 0xff at offset 4): give a YAML file\n"


def test_unwritable_run_dir(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli(capsys, "train", "ppo", "--run-dir", str(blocker / "run"), *FAST)
    assert code == 2 and "cannot write the run directory" in err


def test_resume_of_another_algorithms_run_is_refused(capsys, tmp_path):
    (tmp_path / "config.yaml").write_text("algo: dqn\nenv: CartPole-v1\n")
    code, _, err = run_cli(capsys, "train", "ppo", "--resume", str(tmp_path))
    assert code == 2 and "is a 'dqn' run, not 'ppo'" in err


def test_a_run_killed_before_its_first_periodic_checkpoint_resumes_from_its_best_or_says_to_start_afresh(
        capsys, tmp_path):
    import shutil

    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "128", "--eval-interval", "64",
                           "--run-dir", str(run), *FAST)
    assert code == 0, err
    for periodic in (run / "checkpoints").glob("ckpt_*"):  # as if killed before the first was written
        shutil.rmtree(periodic)
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "192", *FAST)
    assert code == 0 and "ckpt_" in err, err
    shutil.rmtree(run / "checkpoints")
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "256", *FAST)
    assert code == 2 and "holds no complete checkpoint" in err and "train afresh with another --run-dir" in err


def test_the_shoal_script_imports_an_env_module_from_the_working_directory(tmp_path):
    """`shoal train --env my_envs:Corridor-v0` run where my_envs.py is, as `python -m shoal` would
    find it (the script's own directory is what Python searches first); eval too."""
    from pathlib import Path

    (tmp_path / "my_envs.py").write_text(
        "import gymnasium as gym\n"
        "from gymnasium.envs.classic_control import CartPoleEnv\n"
        "gym.register('Corridor-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv', max_episode_steps=20)\n"
        "class Hall(CartPoleEnv):  # an Env class no registration names: --env my_envs:Hall\n"
        "    pass\n"
        "helper = CartPoleEnv.__init__\n")
    script = str(Path(sys.executable).parent / "shoal")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for env_id, run in (("my_envs:Corridor-v0", "run"), ("my_envs:Hall", "hall")):
        done = subprocess.run([script, "train", "ppo", "--env", env_id, "--total-steps", "256", *FAST,
                               "--run-dir", run], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "Overriding environment" not in done.stderr, done.stderr  # registered once
    done = subprocess.run([script, "eval", "hall", "--episodes", "1"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # a new process: it registers Hall again, as a Ray worker does
    assert done.returncode == 0 and "my_envs:Hall: return" in done.stdout, done.stderr
    done = subprocess.run([script, "train", "ppo", "--env", "my_envs:helper"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # not an Env class: not registered
    assert done.returncode == 2 and "unknown environment 'helper'" in done.stderr, done.stderr
    done = subprocess.run([script, "eval", str(tmp_path / "run"), "--episodes", "1"], cwd=tmp_path.parent, env=env,
                          capture_output=True, text=True, timeout=120)  # elsewhere, the module is not there
    assert done.returncode == 2 and "cannot import 'my_envs' for environment 'my_envs:Corridor-v0'" in done.stderr


def test_returns_print_with_three_significant_digits_and_one_decimal_at_least(capsys):
    """MiniGrid's best return, 0.955, printed as 1.0 read as solved beyond the maximum."""
    from shoal.cli import _print_summary
    from shoal.evaluator import format_returns

    assert format_returns(500.0, 0.0) == ["500.0", "0.0"]
    assert format_returns(-4.236, 1.444) == ["-4.24", "1.44"]
    assert format_returns(0.955, 1e-16) == ["0.955", "0.000"]
    assert format_returns(-1234.56, 99.0) == ["-1234.6", "99.0"]
    _print_summary({"solved": True, "eval_return_mean": 0.955, "eval_return_std": 0.0, "best_eval_return": 0.955,
                    "env_steps": 1000, "elapsed_s": 1.0, "run_dir": "r", "checkpoint": "c", "plot": "p"},
                   shoal.cli.Console(width=200))
    assert capsys.readouterr().out.startswith("solved: eval return 0.955 ± 0.000 after 1,000 env steps in 1.0 s "
                                              "(best 0.955)")


def test_eval_render_plays_the_episodes_in_a_window_and_needs_a_display(capsys, tmp_path, monkeypatch):
    """`shoal eval RUN --render`, as rl-zoo's enjoy: the env's 'human' mode draws every step at its
    frame rate. SDL's dummy driver stands in for a display here (the same pygame calls, no window).
    The episodes are the ones `shoal eval` plays without it: same seeds, same returns."""
    import re

    from gymnasium.envs.classic_control import CartPoleEnv

    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--env", "CartPole-v1", "--total-steps", "256", "--run-dir",
                           str(run), *FAST)
    assert code == 0, err
    code, plain, err = run_cli(capsys, "eval", str(run), "--episodes", "2")
    assert code == 0, err
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    drawn, render = [], CartPoleEnv.render
    monkeypatch.setattr(CartPoleEnv, "render", lambda env: drawn.append(env.render_mode) or render(env))
    code, out, err = run_cli(capsys, "eval", str(run), "--episodes", "2", "--render")
    assert code == 0 and out.split(" (")[0] == plain.split(" (")[0], (out, plain, err)
    length = float(re.search(r"length ([0-9.]+)", out)[1])
    assert set(drawn) == {"human"} and len(drawn) == 2 * (1 + length)  # each reset and step, as the env draws them

    class NoWindow(gym.Wrapper):  # frames for videos, and no window
        def __init__(self):
            super().__init__(gym.make("CartPole-v1"))
            self.metadata = {"render_modes": ["rgb_array"]}

    gym.register("NoWindow-v0", entry_point=NoWindow, max_episode_steps=50)
    for argv, message in (
            (["--render", "--video", str(tmp_path / "v")], "--video and --render exclude each other"),
            (["--render", "--env", "remote://127.0.0.1:1"], "--render shows a local env: add --env ENV_ID"),
            (["--video", str(tmp_path / "v"), "--env", "remote://127.0.0.1:1"],
             "videos are rendered from a local env: add --env ENV_ID"),
            (["--render", "--env", "NoWindow-v0"], "NoWindow-v0 cannot be shown: --render needs an env that renders "
                                                   "in 'human' mode, and its metadata's render_modes are ['rgb_array'] "
                                                   "(--video DIR records 'rgb_array' frames)")):
        code, _, err = run_cli(capsys, "eval", str(run), "--episodes", "1", *argv)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.delenv("DISPLAY")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    code, _, err = run_cli(capsys, "eval", str(run), "--episodes", "1", "--render")
    assert code == 2 and "this process has no display" in err and "--video DIR" in err, err
    assert not (tmp_path / "v").exists()


def test_a_run_directory_takes_one_trainer_at_a_time(capsys, tmp_path):
    from shoal.rundir import RunDir

    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "64", "--run-dir", str(run), *FAST)
    assert code == 0, err
    holder = RunDir(run)  # a trainer still writing it (the lock is an flock: per open file, in one process too)
    rows = (run / "progress.csv").read_text()
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "128", *FAST)
    assert code == 2 and f"{run} is in use by another shoal trainer (pid {os.getpid()})" in err, err
    assert (run / "progress.csv").read_text() == rows
    holder.release()
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "128", *FAST)
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "192", *FAST)
    assert code == 0, err  # each trainer let the directory go when it finished


def test_a_resume_whose_settings_reshape_the_network_is_refused_and_leaves_the_run_as_it_was(capsys, tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--env", "CartPole-v1", "--total-steps", "64",
                           "--run-dir", str(run), *FAST)
    assert code == 0, err
    saved = (run / "config.yaml").read_text()
    for change, named in ((["--set", "hidden_sizes=[32, 32]"], "hidden_sizes [64, 64] -> [32, 32]"),
                          (["--normalize-obs"], "normalize_obs False -> True"),
                          (["--env", "Acrobot-v1"], "env CartPole-v1 -> Acrobot-v1")):
        code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "128", *change, *FAST)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "holds a network these settings do not build" in err and f"written: {named}." in err, err
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "32", *FAST)
    assert code == 2 and "already reached total_steps=32" in err
    assert (run / "config.yaml").read_text() == saved  # no refused resume rewrote the run's settings
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--total-steps", "128", *FAST)
    assert code == 0, err


@pytest.mark.parametrize("argv, message", [
    (["train", "ppo", "--num-env-runners", "many"], "Error parsing --num-env-runners: 'many' is not a whole number"),
    (["train", "ppo", "--lrr", "3"], "Unrecognized options: --lrr, 3; did you mean --lr? (see shoal train ppo --help)"),
    (["train", "ppo", "--clip-range", "0.1"],  # a peer's name for a setting: shoal's is named
     "Unrecognized options: --clip-range, 0.1; SB3's clip_range: shoal calls it --clip (see shoal train ppo --help)"),
    (["train", "dqn", "--double-q", "--train-batch-size=32"],
     "RLlib's double_q: shoal calls it --double; RLlib's train_batch_size: shoal calls it --batch-size (see "),
    (["train", "qrdqn", "--sigma0", "0.3"], "RLlib's sigma0: shoal calls it --noisy-sigma0 (see shoal train qrdqn"),
    (["train", "ppo", "--train-batch-size", "4000"], "shoal calls it --rollout-steps, counted per env (train_batch_size "
                                                     "/ (--num-env-runners x --num-envs-per-runner))"),
    (["train", "sac", "--ent-coef", "0.1"], "SB3's SAC ent_coef: shoal calls it --alpha (a fixed value; unset, it is "
                                            "tuned from --alpha-init"),
    (["train", "ppo", "--set", "clip_range=0.1"], "--set: unknown setting 'clip_range' (SB3's clip_range: shoal calls it clip)"),
    # another algorithm's setting: which have it
    (["train", "ppo", "--init-replay", "runs/x"], "Unrecognized options: --init-replay, runs/x; --init-replay is a "
     "setting of crossq, ddpg, dqn, qrdqn, sac, td3 and tqc, not of ppo (see shoal train ppo --help)"),
    (["train", "dqn", "--vtrace-rho-bar", "1"], "--vtrace-rho-bar is a setting of appo and impala, not of dqn (see"),
    (["train", "ppo", "--set", "buffer_size=100"], "--set: unknown setting 'buffer_size' (buffer_size is a setting of "
                                                   "crossq, ddpg, dqn, qrdqn, sac, td3 and tqc, not of ppo)"),
    (["eval", ".", "--lr", "1e-3"], "Unrecognized options: --lr, 1e-3 (see shoal eval --help)"),  # not a setting here
    (["train", "sac", "--q-lr", "1e-3"], "CleanRL's q_lr: shoal calls it --critic-lr (see shoal train sac"),
    (["train", "ppo", "--anneal-lr", "--num-minibatches", "4"], "CleanRL's anneal_lr: shoal calls it --lr-schedule "
     "linear; CleanRL's num_minibatches: shoal calls it --minibatch-size, in transitions (--rollout-steps x "),
    (["train", "ppo", "--normalize"], "rl-zoo's normalize: shoal calls it --normalize-obs and --normalize-rewards (see "),
    (["eval", ".", "--load-best", "--eval-episodes", "3"], "rl-zoo's load_best: shoal calls it --best; shoal train's "
                                                           "eval_episodes: shoal calls it --episodes here (see shoal eval"),
    (["train", "ars", "--normalize"],  # a note about a setting the algorithm lacks is left out
     "Unrecognized options: --normalize; rl-zoo's normalize: shoal calls it --normalize-obs (see shoal train ars"),
    (["train", "ppo", "--backend", "slurm"], "invalid choice 'slurm' for argument '--backend'. Expected one of ('local', 'ray')"),
    (["train", "ppo", "--gamma"], "Missing value for argument '--gamma'"),
    (["train", "ppo", "--set"], "argument --set: expected at least one argument (see shoal train ppo --help)"),
    (["eval"], "Missing from shoal eval: RUN_DIR_OR_CHECKPOINT (see shoal eval --help)"),
    (["train", "ppo", "--seed", "-1"], "seed must be from 0 to 4294967295 (Gymnasium and NumPy take no negative seeds"),
    (["train", "ppo", "--seed", "4294967296"], "seed must be from 0 to 4294967295 "),
    (["train", "ppo", "--set", "seed=1e30"], "torch none past 64 bits, and shoal adds offsets to it), got 1000000000000000019884624838656"),
    (["train", "ppo", "--set", "hidden_sizes=[64,"], "--set hidden_sizes=[64,: the value is not valid YAML"),
    (["eval", ".", "--seed", "-1"], "--seed must be from 0 to 4294967295 (Gymnasium takes no negative seeds"),
    (["eval", ".", "--seed", "1e30"], "torch none past 64 bits), got 1000000000000000019884624838656"),
    (["eval", ".", "--max-steps", "0"], "--max-steps must be at least 1, got 0"),
    (["eval", ".", "--episodes", "-2"], "--episodes must be at least 1, got -2"),
    (["serve-env", "CartPole-v1", "--session-timeout-s", "0"], "--session-timeout-s must be positive, got 0"),
    (["serve-env", "CartPole-v1", "--max-sessions", "0"], "--max-sessions must be at least 1, got 0"),
    (["serve-env", "CartPole-v1", "--max-sessions-per-client", "0"], "--max-sessions-per-client must be at least 1, "
                                                                     "got 0"),
    (["serve-policy", ".", "--max-wait-ms", "-1"], "--max-wait-ms must be at least 0, got -1"),
    (["serve-policy", ".", "--max-message-mb", "nan"], "--max-message-mb must be positive, got nan"),
    (["serve-env", "CartPole-v1", "--port", "http"], "Error parsing --port"),
    # a bool's pair of flags suggested: the first, without tyro's comma
    (["train", "ppo", "--tensorboar"], "Unrecognized options: --tensorboar; did you mean --tensorboard? (see"),
    (["train", "sac", "--training-intensity", "256"], "RLlib's training_intensity: shoal calls it --updates-per-step, "
                                                      "in updates per env step (training_intensity / --batch-size)"),
])
@pytest.mark.parametrize("utf8_boxes", [False, True])  # tyro draws its box in ASCII unless stdout is UTF-8
def test_a_command_line_the_parser_rejects_is_one_line(capsys, monkeypatch, argv, message, utf8_boxes):
    import tyro._fmtlib

    monkeypatch.setattr(tyro._fmtlib, "_FORCE_UTF8_BOXES", utf8_boxes)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and err.startswith("shoal: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and not out, err  # not tyro's box, nor argparse's usage


def test_every_peer_name_is_one_some_algorithm_lacks_and_names_settings_it_has():
    """The table of SB3's and RLlib's names (``--clip-range``: shoal calls it --clip): each shoal
    setting it names exists, and each peer name is one shoal does not use everywhere."""
    import re

    from shoal.config import PEER_NAMES, field_names, peer_hint

    everywhere = {name for spec in ALGOS.values() for name in field_names(spec.config_cls)}
    for peer, (whose, ours) in PEER_NAMES.items():
        assert whose.split("'s")[0] in ("SB3", "SB3 Monitor", "SB3 CheckpointCallback", "sb3-contrib", "rl-zoo",
                                          "RLlib", "RLlib Ape-X", "Ray Tune", "Reverb", "CleanRL",
                                          "the ARS paper"), peer
        assert set(ours) <= everywhere, (peer, set(ours) - everywhere)
        named = {m for note in ours.values() for m in re.findall(r"\{(\w+)\}", note)}
        assert named <= everywhere, (peer, named - everywhere)
        hinted = [spec.name for spec in ALGOS.values() if peer_hint(spec.config_cls, peer)]
        assert hinted, f"{peer}: no algorithm lacks it and has {list(ours)}"
    assert peer_hint(PPOConfig, "--target-kl") is None  # PPO has its own target_kl: nothing to say

    @dataclasses.dataclass
    class Both:  # a config with a peer's name as a setting of its own, beside the one it maps to
        batch_size: int = 1
        minibatch_size: int = 1

    assert peer_hint(Both, "--batch-size") is None and peer_hint(Both, "n_epochs") is None
    assert peer_hint(PPOConfig, "gama") is None


def test_every_command_the_peer_algorithm_names_suggest_is_one_shoal_takes():
    """The table of peers' algorithm names (rainbow: `shoal train dqn --num-atoms 51 ...`): each
    command it suggests parses, its algorithm and flags shoal's own, and no key hides one of shoal's."""
    import re
    import shlex

    from shoal.algos import PEER_ALGOS
    from shoal.cli import _parse

    checked = []
    for text in PEER_ALGOS.values():
        for command in re.findall(r"`shoal train ([^`]+)`", text):
            algo, *flags = shlex.split(command)
            # "(qrdqn, ddpg, td3, sac, tqc and crossq take --apex too)": each of them takes the same command
            others = re.findall(r"\(([a-z0-9, ]+) take --[-\w]+ too", text)
            for name in [algo, *(re.split(r", | and ", others[0]) if others else [])]:
                cls = ALGOS[name].config_cls
                _parse(cls, flags, f"shoal train {name}", default=cls())
                checked.append(name)
    assert not set(PEER_ALGOS) & set(ALGOS)
    assert all(key == key.lower() and not re.search(r"[-_]", key) for key in PEER_ALGOS)  # as get() compares them
    assert len(checked) >= 25, checked


def test_every_command_the_peer_command_names_suggest_is_one_of_shoals():
    import re

    from shoal.cli import COMMANDS, PEER_COMMANDS

    named = [c for text in PEER_COMMANDS.values() for c in re.findall(r"`shoal ([-a-z]+)", text)]
    assert len(named) >= 8 and set(named) <= set(COMMANDS), set(named) - set(COMMANDS)
    assert not set(PEER_COMMANDS) & set(COMMANDS)


def test_the_algorithms_names_are_known_without_importing_them():
    from shoal.cli import algorithm_names

    assert algorithm_names() == set(ALGOS)


def test_the_listing_commands_take_no_arguments_but_envs_takes_words_to_look_for(capsys, monkeypatch):
    code, _, err = run_cli(capsys, "algos", "CartPole-v1")
    assert code == 2 and err == "shoal: error: shoal algos takes no arguments, got CartPole-v1\n"
    for command in ("algos", "envs"):
        code, out, _ = run_cli(capsys, command, "--help")
        assert code == 0 and out.startswith(f"usage: shoal {command}") and "\n\nlist " in out
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli(capsys, "envs", "cartpole", "ACROBOT")  # any word, in any case
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines() if "│" in line}
    assert code == 0 and "CartPole-v0" in rows and "Acrobot-v1" in rows and "Pendulum-v1" not in rows, out
    assert rows["CartPole-v1"] == "a2c, appo, ars, dqn, impala, ppo, qrdqn, sac, trpo" and rows["CartPole-v0"] == ""
    code, out, _ = run_cli(capsys, "envs", "Breakout-v5")
    assert code == 0 and "ALE/Breakout-v5 │ dqn, ppo" in out  # a preset for a pattern (ALE/*)
    code, _, err = run_cli(capsys, "envs", "no-such-env")
    assert code == 2 and err == ("shoal: error: no installed environment id contains 'no-such-env': "
                                 "shoal envs lists them all\n")
    code, _, err = run_cli(capsys, "envs", "--preset")
    assert code == 2 and "shoal envs takes words to look for in env ids, not options: got --preset" in err


def test_a_rejection_in_a_form_not_seen_before_is_still_one_line():
    from shoal.cli import _one_line

    assert _one_line("", "shoal eval") == "the command line was rejected (see shoal eval --help)"
    assert _one_line("bad value\nfor --x\n", "shoal eval") == "bad value for --x (see shoal eval --help)"


def test_config_errors_raise_in_the_python_api_too():
    with pytest.raises(ConfigError, match="num_env_runners must be at least 1"):
        PPOConfig(num_env_runners=0)
    # a value of the wrong type is named, as --set names it (not a TypeError from deep inside)
    with pytest.raises(ConfigError, match="^lr expects a float, got 'fast'$"):
        PPOConfig(lr="fast")
    with pytest.raises(ConfigError, match="^normalize_obs expects a bool, got 'yes'$"):
        PPOConfig(normalize_obs="yes")
    with pytest.raises(ConfigError, match=r"^total_steps expects an int, got 2.5$"):
        PPOConfig(total_steps=2.5)
    with pytest.raises(ConfigError, match=r"^ent_coef must be a number, got nan$"):
        PPOConfig(ent_coef=float("nan"))
    # an env object, as stable-baselines3 takes one: shoal needs the id its roles make copies from
    with pytest.raises(ConfigError, match="^env takes a Gymnasium env id .* not an object of type TimeLimit: "):
        PPOConfig(env=gym.make("CartPole-v1"))
    # what is unambiguous is taken: whole floats and NumPy numbers, one width or a list of them
    import numpy as np

    config = PPOConfig(total_steps=1e5, seed=np.int64(3), gamma=np.float32(0.5), lr=1, hidden_sizes=[32, 32])
    values = (config.total_steps, config.seed, config.gamma, config.lr, config.hidden_sizes)
    assert values == (100_000, 3, 0.5, 1.0, (32, 32))
    assert [type(v) for v in (config.total_steps, config.seed, config.gamma, config.lr)] == [int, int, float, float]


def test_help_lists_every_field_and_the_listing_commands(capsys):
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--help"])
    out = capsys.readouterr().out
    for flag in ("--env", "--backend", "--address", "--num-env-runners", "--num-envs-per-runner", "--seed",
                 "--total-steps", "--stop-return", "--run-dir", "--gae-lambda", "--vf-clip", "--set", "--resume",
                 "--env-kwargs"):
        assert flag in out, flag
    assert "Discount factor" in out  # field docstrings become help text
    # an optional flag shows its type, not tyro's {None}|FLOAT (as if None were the value to give)
    assert "--stop-return FLOAT" in out and "--frame-stack INT" in out and "{None}" not in out
    assert "--critic-hidden-sizes [INT [INT ...]]" in out  # and an optional list, its items' type
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = capsys.readouterr().out
    assert "--env-kwargs [STR [STR ...]]" in out and "{None}" not in out
    code, out, _ = run_cli(capsys, "algos")
    assert code == 0 and "ppo" in out and "CartPole-v1" in out
    code, out, _ = run_cli(capsys, "envs")
    assert code == 0 and "Pendulum-v1" in out


def test_a_docstring_wrapped_in_the_source_is_one_paragraph_of_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # wide enough that rich wraps nothing
    with pytest.raises(SystemExit):
        main(["train", "sac", "--help"])
    out = capsys.readouterr().out
    assert "is cut there (an env with no time limit, such as CliffWalking-v1, would never end" in out
    with pytest.raises(SystemExit):
        main(["serve-env", "--help"])
    assert "usage: shoal serve-env [-h] [OPTIONS] ENV_ID" in capsys.readouterr().out


def test_help_says_a_default_once(capsys):
    """tyro's ``(default: X)`` is dropped where a flag's own help says its default, or the default
    is an empty list; it stays everywhere else."""
    def help_of(*argv: str) -> str:
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        return " ".join(capsys.readouterr().out.replace("│", " ").split())

    out = help_of("train", "ppo")
    assert "(default: runs/ALGO-ENV-TIME). --" in out and "(default: runs/ALGO-ENV-TIME). (default" not in out
    assert "else none (1). --" in out  # --frame-stack's help says "Default: 4 for Atari games"
    assert "Stop early once the mean evaluation return reaches this value. (default: None)" in out  # no own
    assert "rl-zoo's gSDE settings use). (default: True)" in out  # "torch's default" is not its own
    for command in ("plot", "serve-env", "serve-policy"):
        out = help_of(command)
        assert "(default: )" not in out and "(default:" in out, out


def test_help_into_a_pipe_whose_reader_left_ends_quietly():
    """`shoal train ppo --help | head -1`: head exits first; shoal's writes then fail with EPIPE."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before shoal writes anything
    try:
        p = subprocess.run([sys.executable, "-m", "shoal", "train", "ppo", "--help"], stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert p.returncode == 141 and p.stderr == ""


@pytest.mark.parametrize("how", ["--address", "RAY_ADDRESS"])
def test_unreachable_ray_address_fails_fast_without_a_traceback(how):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    flags = ["--address", "127.0.0.1:9"] if how == "--address" else []
    if how == "RAY_ADDRESS":  # as a Ray Job's entrypoint gets it
        env["RAY_ADDRESS"] = "127.0.0.1:9"
    p = subprocess.run([sys.executable, "-m", "shoal.cli", "train", "ppo", "--backend", "ray", *flags,
                        "--no-progress"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2
    assert "cannot reach a Ray cluster at 127.0.0.1:9" in p.stderr and "Traceback" not in p.stderr


def test_an_address_where_something_else_listens_fails_fast_naming_the_gcs_port():
    """The dashboard's port (8265) given for the GCS's: ray.init would retry for minutes."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        started = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "shoal.cli", "train", "ppo", "--backend", "ray",
                            "--address", address, "--no-progress"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONWARNINGS": "ignore"})
        elapsed = time.perf_counter() - started
    finally:
        server.shutdown()
        server.server_close()
    assert p.returncode == 2 and "Traceback" not in p.stderr
    [line] = p.stderr.strip().splitlines()  # no Ray warnings before it
    assert line.startswith(f"shoal: error: {address} answers, but not as a Ray cluster (UNAVAILABLE: ")
    assert line.endswith("give the head node's GCS port, 6379 unless `ray start --port` chose another "
                         "(8265 is the dashboard's)")
    assert elapsed < 30


def test_a_run_directory_is_never_reused_or_left_empty(capsys, tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "64", "--run-dir", str(run), *FAST)
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "64", "--run-dir", str(run), *FAST)
    assert code == 2 and "already holds a run" in err and "--resume" in err
    failed = tmp_path / "new" / "never-started"
    code, _, err = run_cli(capsys, "train", "ppo", "--backend", "ray", "--address", "127.0.0.1:9",
                           "--run-dir", str(failed), *FAST)
    assert code == 2 and not (tmp_path / "new").exists()  # nor the parent it made for it


def test_resume_of_a_checkpoint_inside_a_run_names_the_run_directory(capsys, tmp_path):
    from shoal import checkpoint as ckpt

    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "ppo", "--total-steps", "64", "--run-dir", str(run), *FAST)
    assert code == 0, err
    for inside in (run / "checkpoints", ckpt.checkpoints_in(run)[-1]):
        code, _, err = run_cli(capsys, "train", "--resume", str(inside), "--total-steps", "128", *FAST)
        assert code == 2 and err.strip().endswith(
            f"{inside} is not a shoal run directory (no config.yaml): it is inside the run directory {run}; "
            "give that"), err
    code, _, err = run_cli(capsys, "train", "--resume", str(tmp_path), "--total-steps", "128", *FAST)
    assert code == 2 and err.strip().endswith(f"{tmp_path} holds 1 run, not a run: give one of them (run)"), err
    code, _, err = run_cli(capsys, "train", "--resume", str(tmp_path / "none"), "--total-steps", "128", *FAST)
    assert code == 2 and err.strip().endswith(f"{tmp_path / 'none'} is not a shoal run directory (no config.yaml)"), err


def test_a_run_that_fails_to_start_leaves_no_runs_directory_behind(capsys, tmp_path, monkeypatch):
    """The default run directory is runs/NAME: a run that fails in a new working directory takes
    runs/ away again, and leaves a runs/ that holds another run as it was."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "train", "td3", "--env", "CartPole-v1")
    assert code == 2 and "td3 needs continuous (Box) actions" in err and list(tmp_path.iterdir()) == [], err
    (tmp_path / "runs" / "earlier").mkdir(parents=True)
    code, _, err = run_cli(capsys, "train", "td3", "--env", "CartPole-v1")
    assert code == 2 and [p.name for p in (tmp_path / "runs").iterdir()] == ["earlier"], err


@pytest.mark.parametrize("argv, message", [
    (["serve-env", "Nope-v9"], "unknown environment 'Nope-v9'"),
    (["serve-env", "CartPole-v1", "--host", "0.0.0.0"], "give it a token"),
    (["serve-env", "CartPole-v1", "--token-file", "/nonexistent"], "cannot read token file /nonexistent"),
    (["serve-env", "CartPole-v1", "--tls-cert", "x.pem"], "TLS needs both --tls-cert and --tls-key"),
    (["serve-policy", "/nonexistent"], "/nonexistent does not exist"),
    (["serve-env", "CartPole-v1", "--port", "99999"], "port 99999 is not a TCP port"),
    (["train", "ppo", "--env", "remote://127.0.0.1:1"], "env server 127.0.0.1:1: unreachable"),
    (["train", "ppo", "--env", "remote://nohost"], "bad env server address 'nohost'"),
    (["train", "ppo", "--env", "remote://127.0.0.1:99999"], "bad env server address '127.0.0.1:99999' in "
                                                             "'remote://127.0.0.1:99999': expected HOST:PORT (a port in 1-65535)"),
    (["train", "ppo", "--env", "remote://127.0.0.1:1", "--env-kwargs", "is_slippery=false"],
     "env_kwargs apply to envs made in this process; an env server makes its own: give them to `shoal serve-env"),
    (["serve-env", "FrozenLake-v1", "--env-kwargs", "is_slipery=false"], "could not be made with env_kwargs"),
    (["train", "ppo", "--env", "CartPole-v1", "--env", "remote://127.0.0.1:1"], "env takes one env id, or several"),
    (["train", "ppo", "--env", "remote://127.0.0.1:1/Acrobot-v1", "--env", "remote://127.0.0.1:2/CartPole-v1"],
     "the env servers name different env ids"),
    # a list flag given once per value takes them all: the paths are checked, not the count of ids
    (["serve-policy", "/nonexistent", "/elsewhere", "--policy-id", "a", "--policy-id", "b"],
     "/nonexistent does not exist"),
    (["serve-policy", "/nonexistent", "/elsewhere", "--policy-id", "a"], "give one --policy-id per path (2), got 1"),
])
def test_server_mistakes_get_one_clear_line(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and message in err, err


def test_a_port_in_use_gets_one_line(capsys, tmp_path):
    import socket

    import shoal

    with shoal.make(PPOConfig(env="CartPole-v1", progress=False, tensorboard=False)) as algo:
        algo.save(tmp_path / "ckpt")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for argv in (["serve-env", "CartPole-v1"], ["serve-policy", str(tmp_path / "ckpt")]):
            code, _, err = run_cli(capsys, *argv, "--port", port)
            assert code == 2 and err.strip() == f"shoal: error: cannot listen on 127.0.0.1:{port}: Address already in use"


@pytest.mark.parametrize("argv, gathered", [
    (["r1", "r2", "--policy-id", "a", "--port", "0", "--policy-id", "b"], ["r1", "r2", "--port", "0", "--policy-id", "a", "b"]),
    (["r1", "--policy-id=a", "--policy-id=b"], ["r1", "--policy-id", "a", "b"]),
    (["r1", "r2", "--policy-id", "a", "b"], ["r1", "r2", "--policy-id", "a", "b"]),  # once: left to the parser
])
def test_a_list_flag_given_once_per_value_takes_them_all(argv, gathered):
    from shoal.cli import _gather

    assert _gather(argv, "--policy-id") == gathered


def test_a_replay_larger_than_memory_is_refused_before_the_run_starts(capsys, tmp_path):
    """NumPy reserves a replay buffer lazily: without the check, the run would die when it filled."""
    import shoal
    from shoal.envs import env_spaces
    from shoal.offpolicy import check_replay_fits

    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    size = have // 48 + 1  # CartPole's transition: two 16-byte observations, an action, a reward, a discount
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "CartPole-v1", "--buffer-size", str(size),
                           "--run-dir", str(run))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"a replay of {size:,} transitions of CartPole-v1 needs" in err and "(48 bytes each)" in err
    assert "lower --buffer-size, or add --compress-observations" in err and not run.exists()
    spaces = env_spaces("CartPole-v1")
    for fits in ({"buffer_size": size // 2}, {"buffer_size": size, "compress_observations": True}):
        check_replay_fits(shoal.make_config("dqn", "CartPole-v1", **fits), *spaces)  # compressed rows: not counted ahead


def test_every_algorithms_config_class_is_shoals_by_its_name():
    """`shoal.TQCConfig(...)`, as `shoal.PPOConfig(...)`: each algorithm's class at the top level."""
    from shoal.algos import ALGOS

    for spec in ALGOS.values():
        assert getattr(shoal, spec.config_cls.__name__) is spec.config_cls
        assert spec.config_cls.__name__ in shoal.__all__


def test_serve_env_says_how_to_check_the_server_and_train_on_it(capsys, tmp_path):
    """Its first lines: where it listens, then the commands that check it and train on it, which
    work as printed (a server bound to every address names this machine's for the user to fill in)."""
    import contextlib
    import shlex

    @contextlib.contextmanager
    def serving(*extra):
        """`shoal serve-env` started in a process of its own, and its first three lines."""
        server = subprocess.Popen([sys.executable, "-c", "import sys; from shoal.cli import main; sys.exit(main())",
                                   "serve-env", "CartPole-v1", "--num-envs", "2", "--port", "0", *extra],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            yield [server.stdout.readline() for _ in range(3)]
        finally:
            server.terminate()
            server.wait(timeout=30)

    with serving() as lines:
        address = lines[0].split(" on ")[1].split()[0]
        assert lines[1:] == [f"  check it:    shoal check-env remote://{address}\n",
                             f"  train on it: shoal train ppo --env remote://{address}/CartPole-v1\n"], lines
        assert main(shlex.split(lines[1].partition(":")[2])[1:]) == 0  # shoal check-env remote://...
        assert "proto/shoal.proto's checks: passed" in capsys.readouterr().out
    token = tmp_path / "token"
    token.write_text("a-token-of-sixteen-or-more\n")
    with serving("--host", "0.0.0.0", "--token-file", str(token)) as lines:
        port = lines[0].split(" on 0.0.0.0:")[1].split()[0]
        assert lines[2] == (f"  train on it: SHOAL_TOKEN_FILE={token} shoal train ppo --env "
                            f"remote://THIS_HOST:{port}/CartPole-v1\n"), lines


@pytest.mark.parametrize("argv, message", [
    # torch scales gradients by max_grad_norm / norm: -1 trained DQN up its loss, 0 not at all
    (["dqn", "--max-grad-norm", "-1"], "max_grad_norm must be positive"),
    (["qrdqn", "--max-grad-norm", "0"], "max_grad_norm must be positive"),
    (["td3", "--env", "Pendulum-v1", "--target-noise-clip", "-1"], "noise settings must be 0 or more"),
    (["ppo", "--target-kl", "-0.01"], "target_kl must be positive or None (no early stop)"),
    (["a2c", "--vf-coef", "-0.5"], "vf_coef must be 0 or more"),
])
def test_settings_that_would_train_the_wrong_way_are_refused_in_one_line(capsys, tmp_path, argv, message):
    code, _, err = run_cli(capsys, "train", *argv, "--run-dir", str(tmp_path / "run"), "--no-progress")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()
