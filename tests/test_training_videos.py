"""``--video-interval N`` (CleanRL's capture_video, RLlib's evaluation render_env): an episode of
the current policy, played as the run's evaluations play their first, written to
RUN_DIR/videos/step_N.mp4 every N env steps and at the end."""

from __future__ import annotations

import csv
import re

import av
import gymnasium as gym
import pytest

import shoal
from shoal.algorithm import EVAL_SEED_OFFSET
from shoal.cli import main

FAST = ["--no-progress", "--no-tensorboard", "--num-envs-per-runner", "4", "--rollout-steps", "64",
        "--minibatch-size", "64", "--num-epochs", "2", "--eval-episodes", "2", "--eval-interval", "0"]


def frames(path) -> int:
    with av.open(str(path)) as video:
        return sum(1 for _ in video.decode(video=0))


def test_videos_are_recorded_at_each_interval_and_at_the_end_as_the_evaluations_play(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "ppo", "--video-interval", "512", "--total-steps", "1300", "--seed", "3",
                 "--run-dir", str(run), *FAST]) == 0
    err = capsys.readouterr().err
    assert f"  videos:      {run / 'videos'}" in err
    with open(run / "progress.csv") as f:
        steps = [int(row["env_steps"]) for row in csv.DictReader(f)]
    # the first iteration at or past each multiple of 512 (256 steps an iteration), then the last
    assert [p.name for p in sorted((run / "videos").iterdir())] == [
        f"step_{s:09d}.mp4" for s in (512, 1024, steps[-1])]
    assert steps[-1] == 1536
    # the last one is the final policy's episode from the evaluations' first seed: its reset's frame and a
    # frame per step, as many as `shoal eval` plays with that seed
    assert main(["eval", str(run), "--episodes", "1", "--seed", str(3 + EVAL_SEED_OFFSET)]) == 0
    length = float(capsys.readouterr().out.split("length ")[1].split(";")[0])
    assert frames(run / "videos" / f"step_{steps[-1]:09d}.mp4") == length + 1


def test_a_resumed_run_adds_its_videos_and_none_are_recorded_without_the_setting(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "ppo", "--total-steps", "256", "--run-dir", str(run), *FAST]) == 0
    assert not (run / "videos").exists() and "videos:" not in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--total-steps", "512", "--video-interval", "256",
                 "--no-progress"]) == 0
    assert [p.name for p in (run / "videos").iterdir()] == ["step_000000512.mp4"]


class NoFrames(gym.Wrapper):  # CartPole's spaces, and no render mode (a custom env's __init__ takes none)
    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.metadata = {"render_modes": []}


def test_tensorboard_shows_each_video_as_a_gif_of_its_frames(tmp_path):
    import io

    import numpy as np
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert main(["train", "ppo", "--video-interval", "512", "--total-steps", "1024", "--run-dir", str(run),
                 *[f for f in FAST if f != "--no-tensorboard"]]) == 0
    tb = EventAccumulator(str(run / "tb"), size_guidance={"images": 0})
    tb.Reload()
    gifs = tb.Images("video")
    assert [g.step for g in gifs] == [512, 1024]  # the videos' steps
    for g in gifs:
        mp4 = run / "videos" / f"step_{g.step:09d}.mp4"
        gif = Image.open(io.BytesIO(g.encoded_image_string))
        assert gif.format == "GIF" and (g.width, g.height) == gif.size == (320, 213)  # CartPole's 600x400, scaled
        assert gif.n_frames == frames(mp4) and gif.info["duration"] == 20  # every frame, at CartPole's 50 fps
        with av.open(str(mp4)) as video:
            first = next(video.decode(video=0)).reformat(width=320, height=213, format="rgb24").to_ndarray()
        assert np.abs(np.asarray(gif.convert("RGB"), dtype=float) - first).mean() < 3  # its palette's error


def test_a_long_video_s_gif_keeps_every_kth_frame_for_as_long(tmp_path):
    import io

    import numpy as np
    from PIL import Image

    from shoal.evaluator import gif_of, write_mp4

    write_mp4(tmp_path / "long.mp4", [np.full((40, 64, 3), i % 256, np.uint8) for i in range(650)], fps=50)
    gif, width, height = gif_of(tmp_path / "long.mp4", max_width=32, max_frames=300)
    image = Image.open(io.BytesIO(gif))
    assert (width, height) == image.size == (32, 20)
    assert image.n_frames == 217 and image.info["duration"] == 60  # every 3rd frame, each 3 frames' time


def test_an_env_with_no_frames_is_refused_in_one_line_before_training_and_leaves_no_run(tmp_path, capsys):
    gym.register("NoFramesVideo-v0", entry_point=NoFrames, max_episode_steps=50)
    run = tmp_path / "run"
    assert main(["train", "ppo", "--env", "NoFramesVideo-v0", "--video-interval", "256", "--run-dir", str(run),
                 *FAST]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("shoal: error: video_interval: NoFramesVideo-v0 cannot be recorded: its metadata's "
                           "render_modes are [], and videos need 'rgb_array' frames"), err
    assert not run.exists()


@pytest.mark.parametrize("settings, message", [
    ({"video_interval": -1}, "video_interval must be 0 (no videos) or positive"),
    ({"env": "remote://127.0.0.1:50051", "video_interval": 100}, "video_interval records a local env")])
def test_video_settings_that_cannot_work_are_refused(settings, message):
    with pytest.raises(shoal.ConfigError, match=re.escape(message)):
        shoal.make_config("ppo", **settings)


class BreaksOnRender(gym.Wrapper):
    """Pendulum (no early end) of 60 steps whose renderer fails at the 50th frame of its second
    episode: far enough in that the encoder has begun writing that episode's file."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode=None):
        super().__init__(gym.make("Pendulum-v1", render_mode=render_mode, max_episode_steps=60))
        self.episodes = self.frames = 0

    def reset(self, **kwargs):
        self.episodes, self.frames = self.episodes + 1, 0
        return self.env.reset(**kwargs)

    def render(self):
        self.frames += 1
        if self.episodes == 2 and self.frames == 50:
            raise RuntimeError("the renderer lost its context")
        return self.env.render()


def test_frames_are_encoded_as_they_come_and_a_video_that_breaks_leaves_no_file(tmp_path, capsys, monkeypatch):
    from shoal import evaluator

    gym.register("BreaksOnRender-v0", entry_point=BreaksOnRender)
    run = tmp_path / "run"
    assert main(["train", "ppo", "--env", "BreaksOnRender-v0", "--total-steps", "256", "--run-dir", str(run),
                 *FAST]) == 0
    added, steps = [], []
    add = evaluator.EpisodeVideo.add
    monkeypatch.setattr(evaluator.EpisodeVideo, "add", lambda self, frame: (added.append(len(steps)),
                                                                           add(self, frame))[-1])
    step = BreaksOnRender.step
    monkeypatch.setattr(BreaksOnRender, "step", lambda self, action: (steps.append(1), step(self, action))[-1])
    videos = tmp_path / "videos"
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "2", "--video", str(videos)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shoal: error: BreaksOnRender-v0 could not render a frame (RuntimeError: the renderer "
                          "lost its context") and len(err.strip().splitlines()) == 1, err
    assert [p.name for p in videos.iterdir()] == ["BreaksOnRender-v0-episode-0.mp4"]  # the broken one left nothing
    assert frames(videos / "BreaksOnRender-v0-episode-0.mp4") == 61  # the reset's frame and one per step
    assert added[:61] == list(range(61))  # each frame reached the encoder right after its step
