"""Evaluator: runs whole episodes with the newest weights; optionally records them to mp4."""

from __future__ import annotations

import io
import math
import os
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv

from shoal.config import eval_env_kwargs
from shoal.envs import NO_OPTIONS, EnvOptions, error_line, file_name, headless, make_env, make_vector_env
from shoal.errors import ShoalError
from shoal.policy import PolicyModule, set_up_torch, set_weights
from shoal.runner import final_info_value, info_number


@torch.no_grad()
def run_episodes(module: PolicyModule, env: VectorEnv, deterministic: bool, seed: int,
                 max_steps: int, episodes: int | None = None, info_keys: tuple[str, ...] = ()) -> dict[str, float]:
    """Play ``episodes`` episodes (default: one in each of ``env``'s copies) and return their
    statistics; an episode still going after ``max_steps`` steps is cut there. Each of
    ``info_keys`` that episodes' last steps give as a number is reported as ``eval/KEY``, the mean
    over those episodes.

    Episodes run one per copy, in parallel, in rounds: each round resets every copy (round r with
    seed ``seed + r * copies``, so no two episodes share a seed) and keeps the first episodes it
    still needs. A remote env's copies are the server's count, not ours: 2 copies play 5 episodes
    in 3 rounds, 64 copies give their first 5.
    """
    copies = env.num_envs
    episodes = episodes or copies
    generator = torch.Generator().manual_seed(seed)
    returns, lengths = np.zeros(episodes), np.zeros(episodes, np.int64)
    successes = np.zeros(episodes)  # info["is_success"] at each episode's end
    reports = False  # whether the env says whether episodes succeed at all
    infos: dict[str, list[float]] = {key: [] for key in info_keys}
    for first in range(0, episodes, copies):
        wanted = min(copies, episodes - first)
        obs, _ = env.reset(seed=seed + first)
        module.reset_memory(copies)
        running = np.arange(copies) < wanted
        ret, length = returns[first: first + wanted], lengths[first: first + wanted]  # views
        success = successes[first: first + wanted]
        for _ in range(max_steps):
            if not running.any():
                break
            a = module.act(module.normalize(torch.as_tensor(obs)), deterministic, generator)
            obs, r, term, trunc, info = env.step(module.to_env(a))
            ret += r[:wanted] * running[:wanted]
            length += running[:wanted]
            ended = (running & (term | trunc))[:wanted]
            final = info.get("final_info", info)  # shoal's vector envs reset an ended env in the same step
            reports = reports or "is_success" in info or "is_success" in final
            if ended.any() and "is_success" in final:
                said = ended & final.get("_is_success", np.ones(copies, bool))[:wanted]
                success[said] = np.asarray(final["is_success"], np.float64)[:wanted][said]
            for b in np.flatnonzero(ended) if infos else ():
                for key, values in infos.items():
                    if (value := final_info_value(info, key, b)) is not None:
                        values.append(value)
            running &= ~(term | trunc)
    return episode_stats(returns, lengths, successes if reports else None, infos)


def episode_stats(returns: np.ndarray, lengths: np.ndarray, successes: np.ndarray | None = None,
                  infos: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Mean and std of episode returns, mean length and count, as evaluations report them; and
    the success rate, given ``successes`` (1 or 0 per episode) from an env that says whether an
    episode succeeded (``info["is_success"]``, as Gymnasium-Robotics' goal envs do and
    stable-baselines3 reads; an episode cut at the step limit counts as a failure); and the mean
    of each of ``infos``' keys that has values, as ``eval/KEY``."""
    stats = {"eval/return_mean": float(np.mean(returns)), "eval/return_std": float(np.std(returns)),
             "eval/length_mean": float(np.mean(lengths)), "eval/episodes": float(len(returns))}
    if successes is not None:
        stats["eval/success_rate"] = float(np.mean(np.asarray(successes) > 0))
    stats.update({f"eval/{key}": float(np.mean(values)) for key, values in (infos or {}).items() if values})
    return stats


def format_returns(*values: float) -> list[str]:
    """Returns as the command line prints them, with one number of decimals for all: three
    significant digits for the largest, and at least one decimal (500.0, -4.24, 0.955; MiniGrid's
    0.955 is not a 1.0, nor FrozenLake's 0.7 a 1)."""
    largest = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    decimals = max(1, 3 - (len(str(int(largest))) if largest >= 1 else 0))
    return [f"{v:.{decimals}f}" for v in values]


@torch.no_grad()
def record_episodes(module: PolicyModule, env_id: str, episodes: int, deterministic: bool, seed: int,
                    video_dir: str | Path, max_steps: int,
                    env_kwargs: dict[str, Any] | None = None,
                    options: EnvOptions = NO_OPTIONS,
                    info_keys: tuple[str, ...] = ()) -> tuple[list[Path], dict[str, float]]:
    """Play ``episodes`` episodes one after another, writing each to ``video_dir`` as an mp4
    (each cut after ``max_steps`` steps if it has not ended); returns the paths and the
    statistics of these very episodes (so a stochastic evaluation reports what the videos show)."""
    modes = _render_modes(env_id, env_kwargs, options)
    if "rgb_array" not in modes:
        raise ShoalError(f"{env_id} cannot be recorded: --video needs an env that renders 'rgb_array' frames, and "
                         f"its metadata's render_modes are {modes}")
    out = Path(video_dir)
    if out.exists() and not out.is_dir():
        raise ShoalError(f"--video takes a directory to write the episodes into; {out} is a file")
    made = [p for p in (out, *out.parents) if not p.exists()]  # removed again if no video comes of it
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ShoalError(f"cannot write videos into {out}: {e.strerror}") from None
    try:
        env = make_env(env_id, render_mode="rgb_array", kwargs=env_kwargs, options=options)
        try:
            return _play_and_write(env, module, env_id, episodes, deterministic, seed, out, max_steps, info_keys)
        finally:
            env.close()
    except BaseException:
        for directory in made:
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
        raise


def _render_modes(env_id: str, env_kwargs: dict[str, Any] | None, options: EnvOptions) -> list[str]:
    """The render modes an env's metadata names."""
    probe = make_env(env_id, kwargs=env_kwargs, options=options)
    modes = list(probe.metadata.get("render_modes") or [])
    probe.close()
    return modes


def _render(env: gym.Env, env_id: str) -> np.ndarray:
    try:
        return env.render()
    except Exception as e:
        advice = ""
        if headless() and "mujoco" in sys.modules:
            advice = (f": with no display (MUJOCO_GL={os.environ.get('MUJOCO_GL', '')}) MuJoCo renders with "
                      "MUJOCO_GL=egl, shoal's default there, which needs the system's libEGL (Debian/Ubuntu: "
                      "apt install libegl1), or MUJOCO_GL=osmesa, in software (apt install libosmesa6)")
        raise ShoalError(f"{env_id} could not render a frame ({error_line(e)}){advice}") from e


def _play(env: gym.Env, module: PolicyModule, env_id: str, episodes: int, deterministic: bool, seed: int,
          max_steps: int, video: Callable[[int], EpisodeVideo] | None = None,
          info_keys: tuple[str, ...] = ()) -> dict[str, float]:
    """Play ``episodes`` episodes one after another (episode i from seed ``seed + i``, each cut
    after ``max_steps`` steps) and return their statistics. With ``video``, every step's frame is
    rendered into ``video(i)``'s file as it comes (an Atari episode's frames held until its end
    would take a gigabyte)."""
    generator = torch.Generator().manual_seed(seed)
    returns, lengths = np.zeros(episodes), np.zeros(episodes, np.int64)
    successes, reports = np.zeros(episodes), False
    infos: dict[str, list[float]] = {key: [] for key in info_keys}
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        module.reset_memory(1)
        recording, done = video(i) if video else None, False
        try:
            if recording:
                recording.add(_render(env, env_id))
            while not done and lengths[i] < max_steps:
                a = module.act(module.normalize(torch.as_tensor(obs[None])), deterministic, generator)
                obs, r, term, trunc, info = env.step(module.to_env(a)[0])
                returns[i] += r
                lengths[i] += 1
                if recording:
                    recording.add(_render(env, env_id))
                done = term or trunc
                reports = reports or "is_success" in info
                if done and "is_success" in info:
                    successes[i] = float(info["is_success"])
            if recording:
                recording.finish()
        except BaseException:
            if recording:
                recording.abort()
            raise
        for key, values in infos.items() if done else ():  # an episode cut at max_steps gave no last step
            if key in info and (value := info_number(info[key])) is not None:
                values.append(value)
    return episode_stats(returns, lengths, successes if reports else None, infos)


def _play_and_write(env: gym.Env, module: PolicyModule, env_id: str, episodes: int, deterministic: bool, seed: int,
                    out: Path, max_steps: int, info_keys: tuple[str, ...] = ()) -> tuple[list[Path], dict[str, float]]:
    """:func:`record_episodes`' episodes, each written to ``out`` as it ends."""
    fps = env.metadata.get("render_fps", 30)
    paths: list[Path] = []
    stats = _play(env, module, env_id, episodes, deterministic, seed, max_steps,
                  lambda i: EpisodeVideo(out / f"{file_name(env_id)}-episode-{i}.mp4", fps, paths), info_keys)
    return paths, stats


class EpisodeVideo:
    """One episode's mp4, its frames encoded as they come, under a temporary name until
    :meth:`finish` renames it to ``path`` (and appends that to ``written``); :meth:`abort` leaves
    nothing."""

    def __init__(self, path: Path, fps: float, written: list[Path] | None = None):
        self.path, self.tmp, self.written = path, path.with_suffix(".tmp.mp4"), written
        self.writer = Mp4Writer(self.tmp, fps)

    def add(self, frame: np.ndarray) -> None:
        self._guard(self.writer.add, frame)

    def finish(self) -> Path:
        self._guard(self.writer.close)
        self.tmp.replace(self.path)
        if self.written is not None:
            self.written.append(self.path)
        return self.path

    def abort(self) -> None:
        try:
            self.writer.close()
        except Exception:  # the file is going: what it holds no longer matters
            pass
        self.tmp.unlink(missing_ok=True)

    def _guard(self, call: Callable[..., None], *args: Any) -> None:
        try:
            call(*args)
        except OSError as e:  # PyAV's file errors are OSErrors too
            self.abort()
            raise ShoalError(f"cannot write {self.path}: {e.strerror or e}") from None


class VideoRecorder:
    """``video_interval``: one episode of a policy at a time, played as the run's evaluations play
    their first (its seed, deterministic or not, eval_max_steps), written to ``out/step_N.mp4``.
    Its env is made once, with 'rgb_array' frames, in the process that trains."""

    def __init__(self, config: Any, out: Path, seed: int):
        self.config, self.out, self.seed = config, Path(out), seed
        options, kwargs = EnvOptions.of(config), eval_env_kwargs(config)
        modes = _render_modes(config.env, kwargs, options)
        if "rgb_array" not in modes:
            raise ShoalError(f"video_interval: {config.env} cannot be recorded: its metadata's render_modes are "
                             f"{modes}, and videos need 'rgb_array' frames")
        self.env = make_env(config.env, render_mode="rgb_array", kwargs=kwargs, options=options)

    def record(self, module: PolicyModule, env_steps: int) -> Path:
        """Play one episode with ``module`` and write it as ``step_{env_steps}.mp4``."""
        self.out.mkdir(exist_ok=True)
        path, fps = self.out / f"step_{env_steps:09d}.mp4", self.env.metadata.get("render_fps", 30)
        c = self.config
        with torch.no_grad():
            _play(self.env, module, c.env, 1, c.eval_deterministic, self.seed, c.eval_max_steps,
                  lambda i: EpisodeVideo(path, fps))
        return path

    def close(self) -> None:
        self.env.close()


@torch.no_grad()
def watch_episodes(module: PolicyModule, env_id: str, episodes: int, deterministic: bool, seed: int, max_steps: int,
                   env_kwargs: dict[str, Any] | None = None, options: EnvOptions = NO_OPTIONS,
                   info_keys: tuple[str, ...] = ()) -> dict[str, float]:
    """Play ``episodes`` episodes in a window, as rl-zoo's enjoy does: the env's 'human' render
    mode, which draws each step at the env's own frame rate. Returns their statistics."""
    if headless():
        raise ShoalError("--render shows the episodes in a window, and this process has no display (neither DISPLAY "
                         "nor WAYLAND_DISPLAY is set): record them with --video DIR instead")
    modes = _render_modes(env_id, env_kwargs, options)
    if "human" not in modes:
        raise ShoalError(f"{env_id} cannot be shown: --render needs an env that renders in 'human' mode, and its "
                         f"metadata's render_modes are {modes} (--video DIR records 'rgb_array' frames)")
    env = make_env(env_id, render_mode="human", kwargs=env_kwargs, options=options)
    try:
        return _play(env, module, env_id, episodes, deterministic, seed, max_steps, info_keys=info_keys)
    except ShoalError:
        raise
    except Exception as e:  # the window: a display that refuses it, a renderer that cannot start
        raise ShoalError(f"{env_id} could not show its episodes ({error_line(e)})") from e
    finally:
        env.close()


class Mp4Writer:
    """RGB frames (height, width, 3) encoded into an H.264 mp4 in this process as they come, with
    PyAV; the size is the first frame's.

    In-process, not by piping to an ffmpeg child: forking a process that holds gRPC, Ray and torch
    threads is what the fork-based writers (imageio-ffmpeg) risk, and one CI run lost a video so.
    H.264's 4:2:0 colour needs even sides: an odd one is padded by repeating its last row or column.
    """

    def __init__(self, path: str | Path, fps: float):
        import av

        self.av, self.path, self.fps = av, str(path), fps
        self.container = self.stream = None

    def add(self, frame: np.ndarray) -> None:
        av = self.av
        h, w = frame.shape[:2]
        if self.container is None:
            self.container = av.open(self.path, mode="w", format="mp4")
            self.stream = self.container.add_stream("libx264", rate=Fraction(self.fps).limit_denominator(1001))
            self.stream.width, self.stream.height, self.stream.pix_fmt = w + w % 2, h + h % 2, "yuv420p"
        rgb = np.ascontiguousarray(np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
                                   if h % 2 or w % 2 else frame)
        self.container.mux(self.stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))

    def close(self) -> None:
        """Flush the encoder's delayed frames and close the file (once; a writer given no frame
        writes none)."""
        container, self.container = self.container, None
        if container is not None:
            try:
                container.mux(self.stream.encode())
            finally:
                container.close()


def gif_of(path: str | Path, max_width: int = 320, max_frames: int = 300) -> tuple[bytes, int, int]:
    """An mp4 as an animated GIF (bytes, width, height) for TensorBoard's images, which play GIFs:
    scaled to at most ``max_width`` pixels wide, and every k-th frame kept where it has more than
    ``max_frames`` (each shown k times as long, so it plays in the episode's time)."""
    import av
    from PIL import Image

    with av.open(str(path)) as video:
        stream = video.streams.video[0]
        fps = float(stream.average_rate or 30)
        scale = min(1.0, max_width / stream.width)
        width, height = max(2, round(stream.width * scale)), max(2, round(stream.height * scale))
        frames = [f.reformat(width=width, height=height, format="rgb24").to_ndarray() for f in video.decode(stream)]
    step = -(-len(frames) // max_frames)  # ceil
    # fast octree palettes: a sixth of the time of Pillow's default median cut, half the bytes
    images = [Image.fromarray(f).quantize(colors=256, method=Image.Quantize.FASTOCTREE) for f in frames[::step]]
    out = io.BytesIO()
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:], loop=0,
                   duration=max(20, round(1000 * step / fps)))
    return out.getvalue(), width, height


def write_mp4(path: str | Path, frames: list[np.ndarray], fps: float) -> None:
    """Encode RGB frames (height, width, 3) to an H.264 mp4 (see :class:`Mp4Writer`)."""
    writer = Mp4Writer(path, fps)
    try:
        for frame in frames:
            writer.add(frame)
    finally:
        writer.close()


class Evaluator:
    """The evaluation role: a policy copy following the WeightStore, and eval envs."""

    def __init__(self, config, store, policy_id: str = "default"):
        from shoal.algos import spec_for
        from shoal.envs import env_spaces

        set_up_torch(config.torch_threads)
        self.config, self.store, self.policy_id = config, store, policy_id
        self.options = EnvOptions.of(config)  # the run's frame stack and mask source: its policy's observations
        self.policy = spec_for(config).make_policy(config, *env_spaces(config.env, config.env_kwargs,
                                                                       self.options)).eval()  # as a runner's
        self.version = -1
        self.envs: dict[int, VectorEnv] = {}  # by episode count, built once: Box2D envs are slow to make

    def evaluate(self, episodes: int, deterministic: bool, seed: int) -> dict[str, Any]:
        """Evaluate the newest published weights; the result names the version it used."""
        got = self.store.latest(self.policy_id, newer_than=self.version)
        if got is not None:
            self.version, weights = got
            set_weights(self.policy, weights)
        if episodes not in self.envs:
            self.envs[episodes] = make_vector_env(self.config.env, episodes, eval_env_kwargs(self.config), self.options)
        result: dict[str, Any] = run_episodes(self.policy, self.envs[episodes], deterministic, seed,
                                              self.config.eval_max_steps, episodes, self.config.episode_info)
        result["eval/policy_version"] = self.version
        return result
