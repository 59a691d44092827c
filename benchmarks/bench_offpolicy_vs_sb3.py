"""Off-policy speed against stable-baselines3, as ratios measured in one run.

Every figure is taken in a fresh process of its own (`common.isolated`).

1. SAC gradient updates per second, same networks (256x256), batch 256, same torch threads: 300
   updates timed after 100 untimed ones, on a buffer of 2,000 random-action steps; five fresh
   processes per framework, alternating with the other's; medians.
2. SAC time to a mean eval return of -200 on Pendulum-v1 (rl-zoo settings: lr 1e-3).
3. DQN time to a mean eval return of 475 on CartPole-v1 (rl-zoo settings, shoal's preset), with
   the same algorithm on both sides: SB3's DQN has no double Q-learning, so shoal runs with
   double=False for the ratio. shoal's default (double DQN) is timed too and printed beside it.

With ``--algo crossq``, CrossQ against sb3-contrib's CrossQ instead: figure 1 with the same widths
for actor and critics on both sides and policy delay 3 (300 updates: 100 of the actor); figure 2
with rl-zoo's Pendulum-v1 CrossQ settings (256-wide critics, policy delay 2; shoal's preset); no
figure 3. With ``--algo tqc``, TQC against sb3-contrib's TQC: figure 1 with both sides' defaults
(2 critics of 25 quantiles, 2 dropped per critic), figure 2 with rl-zoo's Pendulum-v1 settings (lr
1e-3; shoal's preset); no figure 3. With ``--algo qrdqn``, QR-DQN against sb3-contrib's QRDQN:
figure 1 on CartPole-v1 with rl-zoo's network (256x256, 10 quantiles) and batch (64), figure 2
its time to 475 on CartPole-v1 with rl-zoo's settings (shoal's preset), evaluated every 2,048
steps; no figure 3.

shoal runs first for the first seed, SB3 for the second, and so on in turn. Evaluation is the
same for both: every --eval-every steps, 10 deterministic episodes on a 10-env vector env; time
runs from building the algorithm to the end of the evaluation that reaches the target (shoal:
`time/wall_s` in eval.csv; SB3: until `learn` returns).

With ``--device cuda``, both sides' networks are on the GPU, and the race is the algorithm's own
(no DQN); ``--cuda-graph`` (sac, tqc) adds shoal with its update replayed from a CUDA graph to the
updates/s figure, each pair's third process, and runs shoal's race with it.

    .venv/bin/python benchmarks/bench_offpolicy_vs_sb3.py [--seeds 0] [--threads 2] [--pairs 5] [--only-updates]
        [--hidden-sizes 256 256] [--algo sac|crossq|tqc|qrdqn] [--device cuda [--cuda-graph]]
"""

from __future__ import annotations

import argparse
import time

# the peers: stable-baselines3's SAC, sb3-contrib's CrossQ, TQC and QRDQN
NAMES = {"sac": "SAC", "crossq": "CrossQ", "tqc": "TQC", "qrdqn": "QR-DQN"}


def probe(algo: str) -> tuple[str, int]:
    """The env and batch size of the updates/s figure."""
    return ("CartPole-v1", 64) if algo == "qrdqn" else ("Pendulum-v1", 256)

import numpy as np
import torch

from common import isolated, machine, median, save, sb3_time_to, shoal_time_to


def shoal_updates_per_s(algo: str, threads: int, hidden: tuple[int, ...] = (256, 256), warmup: int = 100,
                        n: int = 300, device: str = "cpu", cuda_graph: bool = False) -> float:
    from shoal.algos import get
    from shoal.envs import env_spaces
    from shoal.runner import EnvRunner
    from shoal.weights import WeightStore

    env, batch = probe(algo)
    widths = ({"critic_hidden_sizes": tuple(hidden), "policy_delay": 3} if algo == "crossq" else
              {"n_quantiles": 10} if algo == "qrdqn" else {})
    if cuda_graph:
        widths["cuda_graph"] = True
    config = get(algo).config_cls(env=env, torch_threads=threads, learning_starts=0, hidden_sizes=tuple(hidden),
                                  device=device, **widths)
    store = WeightStore()
    learner = get(algo).learner_cls(config, *env_spaces(env), store)
    learner.replay.add_rollout(EnvRunner(config, 0, store).sample(2000))  # random actions

    def update() -> None:  # the batch's upload (none on the CPU) and the update, as the learner's loop does them
        learner.update_batch(learner.replay.sample(batch, 0.4)[1].to(learner.device))
        learner.updates += 1  # (CrossQ's actor waits its turn by this count)

    for _ in range(warmup):
        update()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(n):
        update()
    synchronize(device)
    return n / (time.perf_counter() - start)


def synchronize(device: str) -> None:
    """Wait for the GPU's queue (the time of updates queued there counts)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def sb3_updates_per_s(algo: str, threads: int, hidden: tuple[int, ...] = (256, 256), warmup: int = 100,
                      n: int = 300, device: str = "cpu") -> float:
    from stable_baselines3 import SAC

    torch.set_num_threads(threads)
    if algo == "crossq":
        from sb3_contrib import CrossQ

        model = CrossQ("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, batch_size=256, learning_starts=2000,
                       policy_delay=3, device=device, policy_kwargs={"net_arch": list(hidden)})
    elif algo == "tqc":
        from sb3_contrib import TQC

        model = TQC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, batch_size=256, learning_starts=2000,
                    device=device, policy_kwargs={"net_arch": list(hidden)})
    elif algo == "qrdqn":
        from sb3_contrib import QRDQN

        model = QRDQN("MlpPolicy", "CartPole-v1", learning_rate=2.3e-3, batch_size=64, learning_starts=2000,
                      device=device, policy_kwargs={"net_arch": list(hidden), "n_quantiles": 10})
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, batch_size=256, learning_starts=2000,
                    device=device, policy_kwargs={"net_arch": list(hidden)})
    model.learn(2000)  # fills the buffer with random actions, without training (learning_starts)
    batch = probe(algo)[1]
    model.train(gradient_steps=warmup, batch_size=batch)
    synchronize(device)
    start = time.perf_counter()
    model.train(gradient_steps=n, batch_size=batch)
    synchronize(device)
    return n / (time.perf_counter() - start)


def in_turn(i: int) -> tuple[str, str]:
    """Which framework runs first in the i-th pair or seed: shoal in even ones, SB3 in odd ones,
    so that a machine whose speed drifts over the minute (the AMD EPYC machine's does, by up to
    40%) slows both alike."""
    return ("shoal", "sb3") if i % 2 == 0 else ("sb3", "shoal")


def updates_per_s(threads: int, pairs: int, hidden: tuple[int, ...] = (256, 256), algo: str = "sac",
                  device: str = "cpu", cuda_graph: bool = False) -> dict[str, list[float]]:
    """Each framework's updates/s in ``pairs`` fresh processes each, taken in turn; with
    ``cuda_graph``, shoal's with --cuda-graph too ("shoal_graph"), after shoal's."""
    calls = {"shoal": (shoal_updates_per_s, algo, threads, tuple(hidden), 100, 300, device),
             "sb3": (sb3_updates_per_s, algo, threads, tuple(hidden), 100, 300, device)}
    got: dict[str, list[float]] = {name: [] for name in calls}
    if cuda_graph:
        got["shoal_graph"] = []
    for i in range(pairs):
        for name in in_turn(i):
            got[name].append(isolated(*calls[name]))
            if name == "shoal" and cuda_graph:
                got["shoal_graph"].append(isolated(*calls[name], True))
    return got


def shoal_time(algo: str, env: str, target: float, seed: int, eval_every: int, threads: int,
               settings: dict | None = None) -> tuple[float, int]:
    import shoal

    return shoal_time_to(shoal.make_config(
        algo, env, seed=seed, stop_return=target, eval_interval=eval_every, eval_episodes=10,
        progress=False, tensorboard=False, torch_threads=threads, **(settings or {})), target)[:2]


def sb3_time(algo: str, env_id: str, target: float, seed: int, eval_every: int, budget: int,
             threads: int, device: str = "cpu") -> tuple[float, int]:
    from stable_baselines3 import DQN, SAC

    torch.set_num_threads(threads)
    if algo == "crossq":  # rl-zoo's Pendulum-v1 CrossQ
        from sb3_contrib import CrossQ

        def build():
            return CrossQ("MlpPolicy", env_id, policy_delay=2, policy_kwargs={"net_arch": [256, 256]}, seed=seed,
                          device=device)
    elif algo == "tqc":  # rl-zoo's Pendulum-v1 TQC
        from sb3_contrib import TQC

        build = lambda: TQC("MlpPolicy", env_id, learning_rate=1e-3, seed=seed, device=device)  # noqa: E731
    elif algo == "qrdqn":  # rl-zoo's CartPole-v1 QR-DQN
        from sb3_contrib import QRDQN

        build = lambda: QRDQN("MlpPolicy", env_id, learning_rate=2.3e-3, batch_size=64,  # noqa: E731
                              buffer_size=100_000, learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                              gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
                              policy_kwargs={"net_arch": [256, 256], "n_quantiles": 10}, seed=seed, device=device)
    elif algo == "sac":
        build = lambda: SAC("MlpPolicy", env_id, learning_rate=1e-3, seed=seed, device=device)  # noqa: E731
    else:  # rl-zoo's CartPole-v1 DQN
        build = lambda: DQN("MlpPolicy", env_id, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,  # noqa: E731
                            learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                            gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
                            policy_kwargs={"net_arch": [256, 256]}, seed=seed, device=device)
    return sb3_time_to(build, env_id, target, seed, eval_every, budget)[:2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=5, help="alternating processes per framework for updates/s")
    parser.add_argument("--only-updates", action="store_true", help="measure updates/s only (2 minutes)")
    parser.add_argument("--hidden-sizes", type=int, nargs="+", default=[256, 256],
                        help="both sides' hidden layers for updates/s (SB3's default: 256 256)")
    parser.add_argument("--algo", choices=list(NAMES), default="sac",
                        help="crossq, tqc: against sb3-contrib's CrossQ, TQC")
    parser.add_argument("--device", default="cpu",
                        help="both sides' networks on this device (cuda: the GPU's figures; DQN's race is left out)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="with --device cuda, sac or tqc: shoal's --cuda-graph too, beside shoal without it")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict = {"threads": args.threads, "hidden_sizes": args.hidden_sizes, "device": args.device}
    print(f"machine: {machine()}; torch threads: {args.threads}; device: {args.device}")
    got = updates_per_s(args.threads, args.pairs, tuple(args.hidden_sizes), args.algo, args.device, args.cuda_graph)
    size = "x".join(map(str, args.hidden_sizes))
    name, suffix = NAMES[args.algo], "" if args.algo == "sac" else f"_{args.algo}"
    suffix += "" if args.device == "cpu" else "_" + args.device.replace(":", "")
    theirs = float(np.median(got["sb3"]))
    for side in [k for k in got if k != "sb3"]:
        ours = float(np.median(got[side]))
        pair_ratios = [a / b for a, b in zip(got[side], got["sb3"])]
        label = "shoal --cuda-graph" if side == "shoal_graph" else "shoal"
        print(f"{name} updates/s ({size}, batch {probe(args.algo)[1]}; median of {args.pairs} alternating processes "
              f"each): {label} {ours:.0f}, SB3 {theirs:.0f}; ratio {ours / theirs:.2f} "
              f"({'target >= 2' if args.algo == 'sac' else 'no target'}); pairs' ratios "
              f"{min(pair_ratios):.2f}-{max(pair_ratios):.2f}")
        result[f"{args.algo}_updates_per_s" + ("_graph" if side == "shoal_graph" else "")] = {
            "shoal": ours, "sb3": theirs, "ratio": ours / theirs, "shoal_runs": got[side], "sb3_runs": got["sb3"]}
    if args.only_updates:
        prefix = "offpolicy_updates" + suffix
        save(prefix if args.hidden_sizes == [256, 256] else f"{prefix}_{size}", result)
        return
    races = ((("qrdqn", "CartPole-v1", 475.0, 2048, 100_000),) if args.algo == "qrdqn" else
             ((args.algo, "Pendulum-v1", -200.0, 2000, 20_000),) if args.algo != "sac" or args.device != "cpu" else
             (("sac", "Pendulum-v1", -200.0, 2000, 20_000), ("dqn", "CartPole-v1", 475.0, 2048, 100_000)))
    on_device = {} if args.device == "cpu" else {"device": args.device}
    if args.cuda_graph:
        on_device["cuda_graph"] = True
    for algo, env, target, every, budget in races:
        same = {"double": False} if algo == "dqn" else {}  # SB3's DQN has no double Q-learning
        rows, double = [], []
        for i, seed in enumerate(args.seeds):
            calls = {"shoal": (shoal_time, algo, env, target, seed, every, args.threads, {**same, **on_device}),
                     "sb3": (sb3_time, algo, env, target, seed, every, budget, args.threads, args.device)}
            got = {name: isolated(*calls[name]) for name in in_turn(i)}
            (s_t, s_n), (b_t, b_n) = got["shoal"], got["sb3"]
            rows.append((s_t, s_n, b_t, b_n))
            print(f"{algo} {env} seed {seed}: shoal {s_t:6.1f} s ({s_n:,} steps), SB3 {b_t:6.1f} s ({b_n:,} steps)",
                  flush=True)
            if algo == "dqn":
                double.append(isolated(shoal_time, algo, env, target, seed, every, args.threads))
                print(f"  shoal's default, double DQN: {double[-1][0]:6.1f} s ({double[-1][1]:,} steps)", flush=True)
        s_med, b_med = median([r[0] for r in rows]), median([r[2] for r in rows])
        print(f"{algo}: median time to {target:g}: shoal {s_med:.1f} s, SB3 {b_med:.1f} s; ratio {s_med / b_med:.2f} "
              f"({'target <= 0.5' if algo in ('sac', 'dqn') else 'no target'})")
        result[f"{algo}_time_to_target"] = {"rows": rows, "ratio": s_med / b_med}
        if double:
            d_med = median([t for t, _ in double])
            print(f"dqn with double Q-learning (shoal's default): median {d_med:.1f} s; ratio {d_med / b_med:.2f}")
            result["double_dqn_time_to_target"] = {"rows": double, "ratio": d_med / b_med}
    save("offpolicy_vs_sb3" + suffix, result)


if __name__ == "__main__":
    main()
