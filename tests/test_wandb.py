"""``--wandb-project`` (rl-zoo's and CleanRL's --track): a run's settings, its rows of progress.csv
and eval.csv, and its videos, in one Weights & Biases run that a resume goes on with.

W&B runs offline here (WANDB_MODE=offline, as on a machine with no W&B account); what a run sent
is read back from its offline file (``RUN_DIR/wandb/offline-run-*/run-ID.wandb``: LevelDB's log
format of W&B's own protobuf records), which `wandb sync` uploads as it is."""

from __future__ import annotations

import csv
import json
import struct
import sys

import pytest

import shoal
from shoal.cli import main
from shoal.errors import ConfigError, ShoalError

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

FAST = ["--no-progress", "--no-tensorboard", "--num-envs-per-runner", "4", "--rollout-steps", "64",
        "--minibatch-size", "64", "--num-epochs", "2", "--eval-episodes", "2"]


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing written outside tmp_path
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    import wandb

    yield
    wandb.teardown()  # W&B reads its environment once a process: the next test's is read afresh


def records(path):
    """The protobuf records of a W&B run file: a 7-byte header, then LevelDB log blocks of 32 KiB
    whose chunks (checksum, length, type: 1 whole, 2 first, 3 middle, 4 last) hold the records."""
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_pb.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def sent(run_dir):
    """Per W&B session of the run (one per train or resume, in order): its run record, config,
    history rows, metric definitions and exit code. W&B's service process writes the files and may
    hold the last of them until it ends, as it does with the command's process: it is ended first."""
    import wandb

    wandb.teardown()
    sessions = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        s = {"run": None, "config": {}, "rows": [], "metrics": [], "exit_code": None}
        for r in records(path):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                s["run"] = r.run
            elif kind == "config":
                s["config"].update({u.key: json.loads(u.value_json) for u in r.config.update})
            elif kind == "history":
                row = {}
                for item in r.history.item:
                    row["/".join(item.nested_key) if item.nested_key else item.key] = json.loads(item.value_json)
                s["rows"].append(row)
            elif kind == "metric":
                s["metrics"].append(r.metric)
            elif kind == "exit":
                s["exit_code"] = r.exit.exit_code
        sessions.append(s)
    return sessions


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_a_tracked_run_sends_its_settings_every_row_and_its_videos(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "ppo", "--total-steps", "768", "--eval-interval", "512", "--video-interval", "512",
                 "--wandb-project", "shoal-tests", "--wandb-group", "mine", "--wandb-tags", "baseline", "v2",
                 "--run-dir", str(run), *FAST]) == 0
    err = capsys.readouterr().err
    [s] = sent(run)
    where = next(line for line in err.splitlines() if line.startswith("W&B (offline): "))  # at the start, and
    assert "offline-run-" in where and where.endswith(f"(upload with `wandb sync {where.split()[2]}`)")
    assert f"  {where}" in err.splitlines()  # in the summary at the end
    assert (s["run"].project, s["run"].run_group, s["run"].display_name) == ("shoal-tests", "mine", "run")
    assert s["run"].run_id == (run / "wandb_id").read_text() and list(s["run"].tags) == ["baseline", "v2"]
    assert s["config"]["algo"] == "ppo" and s["config"]["total_steps"] == 768
    assert s["config"]["num_envs_per_runner"] == 4 and s["config"]["wandb_project"] == "shoal-tests"
    # every metric is charted against env_steps
    assert any(m.glob_name == "*" and m.step_metric == "env_steps" for m in s["metrics"])
    history = s["rows"]
    progress = [r for r in history if "episode/count" in r or "loss/policy" in r]
    assert [(r["env_steps"], r["loss/policy"]) for r in progress] == [
        (int(r["env_steps"]), pytest.approx(float(r["loss/policy"]))) for r in rows(run / "progress.csv")]
    evals = [r for r in history if "eval/return_mean" in r]
    assert [(r["env_steps"], r["eval/return_mean"]) for r in evals] == [
        (int(r["env_steps"]), pytest.approx(float(r["eval/return_mean"]))) for r in rows(run / "eval.csv")]
    assert len(evals) == 2  # at 512 and at the end
    videos = [r for r in history if "video/path" in r]
    assert [r["env_steps"] for r in videos] == [512, 768]
    assert len(videos) == len(list((run / "videos").iterdir()))
    media = sorted(run.glob("wandb/offline-run-*/files/media/videos/*.mp4"))
    assert [p.read_bytes() for p in media] == [p.read_bytes() for p in sorted((run / "videos").iterdir())]
    assert s["exit_code"] == 0


def test_a_resume_goes_on_with_the_same_wandb_run(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "ppo", "--total-steps", "512", "--eval-interval", "0", "--wandb-project", "shoal-tests",
                 "--run-dir", str(run), *FAST]) == 0
    run_id = (run / "wandb_id").read_text()
    assert main(["train", "--resume", str(run), "--total-steps", "1024", "--no-progress"]) == 0
    first, second = sent(run)
    assert first["run"].run_id == second["run"].run_id == run_id == (run / "wandb_id").read_text()
    steps = [[r["env_steps"] for r in s["rows"] if "loss/policy" in r] for s in (first, second)]
    assert steps == [[256, 512], [768, 1024]]
    assert second["config"]["total_steps"] == 1024  # the resume's settings


def test_a_run_that_fails_is_marked_failed_and_one_stopped_by_ctrl_c_is_not(tmp_path):
    config = shoal.PPOConfig(env="CartPole-v1", total_steps=2048, num_envs_per_runner=4, rollout_steps=64,
                             minibatch_size=64, num_epochs=2, progress=False, tensorboard=False,
                             wandb_project="shoal-tests")

    def breaks(algo, metrics):
        raise RuntimeError("the callback broke")

    def interrupts(algo, metrics):
        raise KeyboardInterrupt

    with pytest.raises(RuntimeError):
        shoal.train(config, run_dir=tmp_path / "broken", callback=breaks)
    with pytest.raises(ShoalError, match="interrupted"):
        shoal.train(config, run_dir=tmp_path / "stopped", callback=interrupts)
    assert [s["exit_code"] for s in sent(tmp_path / "broken")] == [1]
    assert [s["exit_code"] for s in sent(tmp_path / "stopped")] == [0]


def test_the_runs_of_seeds_are_grouped_by_their_directory(tmp_path):
    config = shoal.PPOConfig(env="CartPole-v1", total_steps=256, num_envs_per_runner=4, rollout_steps=64,
                             minibatch_size=64, num_epochs=1, eval_episodes=1, progress=False, tensorboard=False,
                             wandb_project="shoal-tests")
    shoal.train_seeds(config, [0, 1], run_dir=tmp_path / "sweep")
    runs = [sent(tmp_path / "sweep" / f"seed_{s}")[0]["run"] for s in (0, 1)]
    assert [(r.run_group, r.display_name) for r in runs] == [("sweep", "seed_0"), ("sweep", "seed_1")]
    assert runs[0].run_id != runs[1].run_id


def test_wandb_that_cannot_start_ends_the_command_in_one_line_and_leaves_no_run(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    monkeypatch.setenv("WANDB_MODE", "online")  # and no API key: W&B refuses before it reaches the network
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert main(["train", "ppo", "--total-steps", "256", "--wandb-project", "shoal-tests", "--run-dir", str(run),
                 *FAST]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shoal: error: Weights & Biases could not start the run (") and "WANDB_MODE=offline" in err
    assert len(err.strip().splitlines()) == 1 and not run.exists()
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed: its import fails
    assert main(["train", "ppo", "--total-steps", "256", "--wandb-project", "shoal-tests", "--run-dir", str(run),
                 *FAST]) == 2
    assert "pip install 'shoal[wandb]'" in capsys.readouterr().err and not run.exists()
    assert main(["tune", "ppo", "--env", "CartPole-v1", "--set", "wandb_project=shoal-tests", "--study-dir",
                 str(tmp_path / "study")]) == 2  # before any trial
    err = capsys.readouterr().err
    assert "pip install 'shoal[wandb]'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "study").exists()
    for place in ({"wandb_group": "g"}, {"wandb_tags": ("t",)}):
        with pytest.raises(ConfigError, match="give --wandb-project too"):
            shoal.PPOConfig(env="CartPole-v1", **place)


def test_the_trials_of_a_study_are_grouped_by_its_directory(tmp_path):
    pytest.importorskip("optuna")
    shoal.tune("ppo", "CartPole-v1", trials=2, total_steps=256, evaluations=1, params={"lr": "log(1e-4, 1e-2)"},
               sets={"wandb_project": "shoal-tests", "num_envs_per_runner": 4, "rollout_steps": 64,
                     "minibatch_size": 64, "eval_episodes": 1}, study_dir=tmp_path / "study", prune=False)
    runs = [sent(tmp_path / "study" / f"trial_{n:04d}")[0] for n in (0, 1)]
    assert [(s["run"].run_group, s["run"].display_name) for s in runs] == [("study", "trial_0000"),
                                                                           ("study", "trial_0001")]
    assert runs[0]["config"]["lr"] != runs[1]["config"]["lr"]  # each trial's drawn settings


def test_a_run_with_wandb_disabled_says_that_nothing_is_sent(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert main(["train", "ppo", "--total-steps", "256", "--wandb-project", "shoal-tests",
                 "--run-dir", str(tmp_path / "run"), *FAST]) == 0
    assert "W&B: disabled (WANDB_MODE=disabled): nothing is sent" in capsys.readouterr().err
