"""Replay memory for Atari: shoal's compressed observations vs stable-baselines3's ReplayBuffer,
in one run, on the same transitions.

Each game's transitions come from its preprocessed env (84x84 grayscale frames, 4 stacked, 4
frames a step: shoal's Atari envs) under random actions. The same transitions go into:

- shoal's ReplayBuffer with ``compress_observations`` (LZ4 rows, the DQN ``ALE/*`` preset) and
  without it;
- stable-baselines3's ReplayBuffer with ``optimize_memory_usage`` off (rl-zoo's Atari setting)
  and on (next observations read from the following slot: half the frames).

Printed per game: bytes per transition held (shoal: :meth:`ReplayBuffer.nbytes`; SB3: its
arrays' sizes over the capacity, which NumPy takes as the buffer fills) and their ratio to
SB3's optimised buffer; microseconds per transition added (shoal in rollouts of 4 steps, as
its DQN runners insert; SB3 one at a time, as its DQN does) and per batch of 32 sampled; and
the bytes of an Ape-X runner's insert of 8 transitions, with and without the runner compressing.

    .venv/bin/python benchmarks/bench_replay_memory.py [--transitions 5000] [--games Pong Breakout SpaceInvaders]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from common import machine, median, save


def transitions(game: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` + 1 observations of random play [n + 1, 4, 84, 84], the n actions and the n done flags."""
    from shoal.envs import make_env

    env = make_env(f"ALE/{game}-v5")
    env.action_space.seed(0)
    obs, _ = env.reset(seed=0)
    frames, actions, dones = [np.asarray(obs)], [], []
    for _ in range(n):
        a = env.action_space.sample()
        obs, _, terminated, truncated, _ = env.step(a)
        frames.append(np.asarray(obs)), actions.append(a), dones.append(terminated or truncated)
        if terminated or truncated:  # the next episode starts in the next slot: fine for memory and speed
            obs, _ = env.reset()
            frames[-1] = np.asarray(obs)
    env.close()
    return np.stack(frames), np.array(actions), np.array(dones)


def per_call_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times) * 1e6


def shoal_figures(frames, actions, compress: bool) -> dict[str, float]:
    from shoal.replay import ReplayBuffer

    n = len(actions)
    buf = ReplayBuffer(n, frames.shape[1:], np.uint8, (), np.int64, gamma=0.99, compress=compress, seed=0)
    rewards, discounts = np.zeros(n, np.float32), np.full(n, 0.99, np.float32)
    adds = []
    for i in range(0, n, 4):
        j = min(n, i + 4)
        start = time.perf_counter()
        buf.add(frames[i:j], actions[i:j], rewards[i:j], frames[i + 1:j + 1], discounts[i:j])
        adds.append((time.perf_counter() - start) / (j - i))
    sample = per_call_us(lambda: buf.sample(32), 300)
    return {"bytes_per_transition": buf.nbytes() / n, "add_us": median(adds) * 1e6, "sample_us": sample}


def sb3_figures(frames, actions, dones, optimize: bool) -> dict[str, float]:
    import gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer

    n = len(actions)
    hwc = frames.transpose(0, 2, 3, 1).copy()  # SB3's VecFrameStack stacks on the last axis
    space = gym.spaces.Box(0, 255, hwc.shape[1:], np.uint8)
    buf = ReplayBuffer(n, space, gym.spaces.Discrete(18), device="cpu", optimize_memory_usage=optimize,
                       handle_timeout_termination=not optimize)
    adds = []
    for i in range(n):
        start = time.perf_counter()
        buf.add(hwc[i:i + 1], hwc[i + 1:i + 2], actions[i:i + 1], np.zeros(1, np.float32), dones[i:i + 1], [{}])
        adds.append(time.perf_counter() - start)
    held = sum(getattr(buf, name).nbytes for name in ("observations", "next_observations", "actions", "rewards",
                                                      "dones", "timeouts") if getattr(buf, name, None) is not None)
    sample = per_call_us(lambda: buf.sample(32), 300)
    return {"bytes_per_transition": held / n, "add_us": median(adds) * 1e6, "sample_us": sample}


def insert_bytes(frames, actions) -> dict[str, int]:
    """Pickled bytes of one Ape-X insert of 8 one-step transitions (the ``add`` call's arguments),
    as arrays and with the observations compressed by the runner (``compress_observations``)."""
    import pickle

    from shoal.replay import compress_rows

    obs, nxt = frames[100:108], frames[101:109]
    rest = (actions[100:108].astype(np.int64), np.zeros(8, np.float32), np.full(8, 0.99, np.float32))
    plain = (obs, rest[0], rest[1], nxt, rest[2])
    packed = (compress_rows(obs), rest[0], rest[1], compress_rows(nxt), rest[2])
    return {name: len(pickle.dumps(args, protocol=5)) for name, args in (("plain", plain), ("compressed", packed))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=5000)
    parser.add_argument("--games", nargs="*", default=["Pong", "Breakout", "SpaceInvaders"])
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"machine: {machine()}")
    result = {}
    for game in args.games:
        frames, actions, dones = transitions(game, args.transitions)
        rows = {"shoal compressed": shoal_figures(frames, actions, True),
                "shoal uncompressed": shoal_figures(frames, actions, False),
                "SB3": sb3_figures(frames, actions, dones, False),
                "SB3 optimize_memory_usage": sb3_figures(frames, actions, dones, True)}
        best = rows["SB3 optimize_memory_usage"]
        print(f"{game} ({args.transitions:,} transitions of random play):")
        for name, r in rows.items():
            gb = r["bytes_per_transition"] * 1e6 / 2**30
            print(f"  {name:26s} {r['bytes_per_transition']:9,.0f} B/transition ({gb:5.1f} GiB per 1M; "
                  f"{r['bytes_per_transition'] / best['bytes_per_transition']:.3f} of SB3's optimised); "
                  f"add {r['add_us']:6.1f} us, sample(32) {r['sample_us']:7.1f} us", flush=True)
        sent = insert_bytes(frames, actions)
        print(f"  an Ape-X runner's insert of 8 transitions, pickled as Ray sends it: {sent['plain']:,} B as arrays, "
              f"{sent['compressed']:,} B compressed by the runner ({sent['compressed'] / sent['plain']:.3f})")
        result[game] = {**rows, "apex_insert_bytes": sent}
    print(f"wrote {save('replay_memory', result)}")


if __name__ == "__main__":
    main()
