"""What each of Rainbow's parts costs an update: DQN's and QR-DQN's gradient updates per second on
CartPole-v1 with their presets' networks and batches (rl-zoo's: 256x256, batch 64), plain and
with dueling, noisy nets, C51 (51 atoms) and all of Rainbow, as ratios to plain DQN's in the
same run (stable-baselines3 has no noisy nets or C51 to race).

Each figure: a fresh process (`common.isolated`) fills a replay with 2,000 random-action steps,
makes 100 untimed updates, then times 600 (prioritised replay's sampling and priority updates
included where it is on); the median of --repeats processes.

    .venv/bin/python benchmarks/bench_rainbow.py [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

from common import isolated, machine, median, save

C51 = {"num_atoms": 51, "v_min": 0.0, "v_max": 100.0}
RAINBOW = {"dueling": True, "n_step": 3, "prioritized": True, "noisy": True}
VARIANTS = {
    "dqn": ("dqn", {}),
    "dqn --dueling": ("dqn", {"dueling": True}),
    "dqn --noisy": ("dqn", {"noisy": True}),
    "dqn --num-atoms 51 (C51)": ("dqn", C51),
    "dqn, every option (Rainbow)": ("dqn", {**C51, **RAINBOW}),
    "qrdqn": ("qrdqn", {}),
    "qrdqn, every option (Rainbow with quantiles)": ("qrdqn", RAINBOW),
}


def updates_per_s(algo: str, settings: dict, threads: int, warmup: int = 100, n: int = 600) -> float:
    from shoal.algos import get, make_config
    from shoal.envs import env_spaces
    from shoal.runner import EnvRunner
    from shoal.weights import WeightStore

    config = make_config(algo, "CartPole-v1", torch_threads=threads, learning_starts=0, **settings)
    store = WeightStore()
    learner = get(algo).learner_cls(config, *env_spaces("CartPole-v1"), store)
    learner.replay.add_rollout(EnvRunner(config, 0, store).sample(2000))  # random actions

    def update() -> None:
        shard, batch = learner.replay.sample(config.batch_size, 0.4)
        _, priorities = learner.train_batch(batch.to(learner.device))
        if priorities is not None:
            learner.replay.update_priorities(shard, batch.indices, priorities.cpu().numpy())
        learner.updates += 1

    for _ in range(warmup):
        update()
    start = time.perf_counter()
    for _ in range(n):
        update()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine()}; torch threads: {args.threads}")
    rates = {}
    for _ in range(args.repeats):  # each variant's processes in turn, so drift spreads over all of them
        for name, (algo, settings) in VARIANTS.items():
            rates.setdefault(name, []).append(isolated(updates_per_s, algo, settings, args.threads))
    base = median(rates["dqn"])
    result = {}
    for name, got in rates.items():
        rate = median(got)
        result[name] = {"updates_per_s": rate, "ratio_to_dqn": rate / base, "runs": got}
        print(f"{name:46s} {rate:6.0f} updates/s  {rate / base:4.2f}x plain DQN's  (runs {', '.join(f'{r:.0f}' for r in got)})")
    print(f"results: {save('rainbow', result)}")


if __name__ == "__main__":
    main()
