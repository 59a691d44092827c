"""The driver: builds the roles on a backend and runs ``sample -> update -> sync weights``.

``shoal.make(config)`` returns an :class:`Algorithm`; ``train()`` runs one iteration and returns
flat metrics. Nothing here depends on where the roles run.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import time
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from shoal import checkpoint as ckpt
from shoal.algos import get, spec_for
from shoal.backends import make_backend
from shoal.config import eval_env_kwargs, merge, to_dict
from shoal.envs import EnvOptions, all_spaces, describe_space, env_spaces, policy_misfit, space_from_description
from shoal.errors import Diverged, RoleFailed, SharedObjectLost, ShoalError
from shoal.evaluator import Evaluator
from shoal.learner import UpdateResult, network_shapes
from shoal.policy import ONE_HOT_SPACES, Policy, UnsupportedActions, UnsupportedMasks, set_up_torch, set_weights
from shoal.runner import EnvRunner, merge_infos

EVAL_SEED_OFFSET = 1_000_000  # eval episodes use seeds disjoint from the training envs'
# A runner that fails this many times in a row, each incarnation (new env seeds) before its first
# rollout, fails the run: an env that breaks every time is not a fault that restarts recover from.
RUNNER_CRASH_LOOP = 3


class Algorithm:
    """A training run's roles and counters. Use as a context manager, or call ``stop()``."""

    def __init__(self, config: Any):
        self.started = time.perf_counter()
        self.stopped = False
        self.config, self.spec = config, spec_for(config)
        set_up_torch(config.torch_threads)  # before this process's first torch op (the policy below)
        self.obs_space, self.action_space, own = all_spaces(config.env, config.env_kwargs, EnvOptions.of(config))
        # the env's own observations, where shoal flattens them and a checkpoint can describe them:
        # deployments (the policy server) take those too, without making the env
        self.env_obs_space = own if isinstance(own, ONE_HOT_SPACES) else None
        if config.eval_env_kwargs:  # evaluations act with this policy on those envs
            misfit = policy_misfit((self.obs_space, self.action_space),
                                   env_spaces(config.env, eval_env_kwargs(config), EnvOptions.of(config)))
            if misfit:
                raise ShoalError(f"eval_env_kwargs {config.eval_env_kwargs} make envs the policy cannot act in: "
                                 f"{misfit}")
        # Build the policy once here: a space the algorithm cannot handle fails with one line in
        # the driver, before any backend starts (on Ray it would fail inside an actor).
        try:
            self.spec.make_policy(config, self.obs_space, self.action_space)
        except UnsupportedActions as e:
            raise ShoalError(f"{self.spec.name} does not support action space {e.space}: {e.hint}") from None
        except UnsupportedMasks:
            raise ShoalError(f"{self.spec.name} does not take action masks, which {config.env} gives: ppo, a2c, "
                             "trpo, impala, appo, dqn and sac (discrete actions) do") from None
        if getattr(config, "her_goals", 0):  # not a goal env: one line here, not an actor's failure on Ray
            from shoal.offpolicy import hindsight

            hindsight(config)
        if hasattr(config, "compress_observations"):  # a replay too large for memory: one line now, not hours later
            from shoal.offpolicy import check_replay_fits

            check_replay_fits(config, self.obs_space, self.action_space)
        self.backend = make_backend(config)
        self.apex = bool(getattr(config, "apex", False))
        if config.inference == "central" and self.apex:
            self.backend.shutdown()
            raise ShoalError("--inference central cannot be combined with --apex (Ape-X runners explore at "
                             "their own rates, so each needs its own policy copy)")
        try:
            self.store = self.backend.weight_store()
            shards = self.shards = self._replay_shards() if self.apex else None
            extra = {"replay_shards": shards} if shards else {}
            self.learner = self.backend.make(self.spec.learner_cls, config, self.obs_space,
                                             self.action_space, self.store, name="learner",
                                             num_gpus=self.backend.learner_gpus(), **extra)
            self.inference = self._inference_servers() if config.inference == "central" else []
            self.runners = [self.backend.make(self.spec.runner_cls or EnvRunner, self.runner_config, i, self.store,
                                              "default", shards[i % len(shards)] if shards else None,
                                              self.inference[i % len(self.inference)] if self.inference else None,
                                              name=f"runner-{i}", num_cpus=self.backend.runner_cpus(),
                                              num_gpus=self.backend.runner_gpus())
                            for i in range(config.num_env_runners)]
            self._evaluator: Any = None  # made at the first evaluation (start_evaluator)
            self.backend.get(self.learner.call("publish"))
            # Wait for the runners to start, so that --runner-timeout-s bounds sampling only.
            self.backend.wait_for_runners([r.call("ping") for r in self.runners])
        except BaseException:
            self.backend.shutdown()
            raise
        self.iteration = 0
        self.env_steps = 0
        self.num_episodes = 0
        self.policy_version = 0
        self.replay_loaded = 0  # transitions --init-replay put in replay (they count towards learning_starts)
        self.elapsed_s = 0.0  # time spent in train(), carried across resumes
        self.wall_offset_s = 0.0  # wall time of earlier sessions of this run (resume)
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.recent_lengths: deque[int] = deque(maxlen=100)
        self.recent_infos: dict[str, deque[float]] = {key: deque(maxlen=100) for key in config.episode_info}
        self.inflight: dict[int, Any] = {}  # asynchronous loops on Ray: each runner's running sample call
        self.learner_future: Any = None
        self.queue: deque[Any] = deque()  # IMPALA/APPO on Ray: finished rollouts (ObjectRefs) for the learner
        self.held: deque[tuple[int, Any]] = deque()  # finished while the queue was full: runner waits
        self.queue_depths: list[int] = []  # queue length each time the learner took a batch
        self.runner_restarts = 0
        self.sample_s_per_step: float | None = None  # the last synchronous rollouts' pace, per step of an env
        self.incarnations = [0] * config.num_env_runners
        self.failures_in_a_row = [0] * config.num_env_runners  # restarts of each runner since its last rollout
        self.runner_health: dict[int, dict[str, int]] = {}  # each runner's last reported counters
        self.retired = {"env_restarts": 0, "dropped_episodes": 0}  # counters of replaced runners

    @functools.cached_property
    def runner_config(self) -> Any:
        """The settings runners are made with: on the ray backend, each in a process of its own,
        their torch ops run on runner_torch_threads threads (in-process, on the driver's)."""
        c = self.config
        if self.backend.name != "ray" or c.runner_torch_threads == c.torch_threads:
            return c
        return dataclasses.replace(c, torch_threads=c.runner_torch_threads)

    def _inference_servers(self) -> list[Any]:
        """--inference central: servers that batch the runners' requests (threaded actors on Ray)."""
        from shoal.inference import InferenceServer

        n, c = self.config.num_inference_servers, self.config
        per_server = -(-c.num_env_runners // n)
        wait_ms = 1.0 if self.backend.name == "ray" else 0.0  # in-process, runners take turns: never wait
        return [self.backend.make(InferenceServer, c, self.store, self.obs_space, self.action_space, i,
                                  name=f"inference-{i}", concurrency=per_server + 2, max_batch=per_server,
                                  max_wait_ms=wait_ms, num_gpus=self.backend.inference_gpus()) for i in range(n)]

    def _replay_shards(self) -> list[Any]:
        from shoal.offpolicy import replay_args
        from shoal.replay import ReplayBuffer

        n = self.config.num_replay_shards
        args, kwargs = replay_args(self.config, self.obs_space, self.action_space, n)
        return [self.backend.make(ReplayBuffer, *args, name=f"replay-{i}", **{**kwargs, "seed": kwargs["seed"] + i})
                for i in range(n)]

    # -- the loop -------------------------------------------------------------------------
    def train(self) -> dict[str, float]:
        """One iteration: every runner samples, the learner updates and publishes.

        In Ape-X mode on Ray it is asynchronous instead: runners keep sampling into the replay
        shards, and an iteration ends when the learner finishes a call of updates_per_call updates.
        """
        self._check_running()
        start = time.perf_counter()
        if self.apex:
            result = self._train_async() if self.backend.name == "ray" else self._train_apex_in_process()
        elif self.spec.loop == "async" and self.backend.name == "ray":
            result = self._train_queued()
        else:
            result = self._train_sync()
        seconds = time.perf_counter() - start
        self.iteration += 1
        self.env_steps += result.env_steps
        self.policy_version = result.version
        self.elapsed_s += seconds
        self.num_episodes += len(result.episode_returns)
        self.recent_returns.extend(result.episode_returns)
        self.recent_lengths.extend(result.episode_lengths)
        for key, values in result.episode_infos.items():
            self.recent_infos[key].extend(values)
        metrics = {"iteration": self.iteration, "env_steps": self.env_steps,
                   "time/elapsed_s": self.elapsed_s, "time/wall_s": self.wall_s, "time/iteration_s": seconds,
                   "time/env_steps_per_s": result.env_steps / seconds,
                   "episode/count": self.num_episodes,
                   "learner/policy_version": result.version}
        if self.recent_returns:
            metrics["episode/return_mean"] = float(np.mean(self.recent_returns))
            metrics["episode/length_mean"] = float(np.mean(self.recent_lengths))
        metrics.update({f"episode/{key}": float(np.mean(values))
                        for key, values in self.recent_infos.items() if values})
        metrics.update(result.metrics)
        return metrics

    def _train_sync(self) -> UpdateResult:
        """Every runner samples, the learner updates on what came back. A runner that fails (its
        actor died, its envs failed past --max-env-restarts, or it hung past --runner-timeout-s)
        is replaced under the same id, and the iteration completes with the others' rollouts."""
        c = self.config
        while True:
            steps, start = self._sync_rollout_steps(), time.perf_counter()
            calls = {i: r.call_checked("sample_checked", steps) for i, r in enumerate(self.runners)}
            ok, failed = self.backend.collect({i: status for i, (status, _) in calls.items()}, c.runner_timeout_s)
            if ok:
                self.sample_s_per_step = (time.perf_counter() - start) / steps
            for i in sorted(failed):
                self.backend.discard(calls[i][1])
                self._restart_runner(i, failed[i])
            for i, health in ok.items():
                self.runner_health[i] = health
                self.failures_in_a_row[i] = 0
            if ok:
                break  # else every runner failed: sample again with the replacements
        result = self.backend.get(self.learner.call("update", *[calls[i][1] for i in sorted(ok)]))
        return result._replace(metrics={**result.metrics, **self.fault_metrics()})

    def _sync_rollout_steps(self) -> int:
        """Steps per env of the next synchronous rollouts: ``steps_per_rollout``, except before an
        off-policy run's ``learning_starts``. There the actions are random, no update comes, and the
        weights stay as they are, so up to ``WARMUP_ROLLOUT_STEPS`` steps come in one rollout
        instead of paying an iteration's calls every step (TD3's 10k random steps on Pendulum
        took 10 s in 1-step rollouts). The rollouts are whole numbers of iterations' worth and stop
        where the short ones would (at learning_starts, or at total_steps if it comes first): with
        one runner, training is the same step for step; with several, the replay holds the same
        transitions in another order (each runner's in one run). Each rollout is kept to a tenth
        of --runner-timeout-s at the last iteration's pace, so that a slow env is not taken for a
        hung one."""
        c = self.config
        per_iteration = c.steps_per_rollout * c.num_envs_per_runner * len(self.runners)
        left = min(getattr(c, "learning_starts", 0) - self.replay_loaded, c.total_steps) - self.env_steps
        if left <= per_iteration or self.sample_s_per_step is None:
            return c.steps_per_rollout
        most = min(EnvRunner.WARMUP_ROLLOUT_STEPS, int(c.runner_timeout_s / 10 / self.sample_s_per_step))
        iterations = min(-(-left // per_iteration), most // c.steps_per_rollout)
        return max(1, iterations) * c.steps_per_rollout

    def _restart_runner(self, i: int, reason: str) -> None:
        """Replace runner ``i`` (after a backoff): a new incarnation, same id, new env seeds; it
        pulls the newest weights on its first rollout. Its episodes in progress are lost."""
        import logging

        c = self.config
        self.runner_restarts += 1
        if self.runner_restarts > c.max_runner_restarts:
            raise ShoalError(f"runner {i} failed ({reason}), and runners have been restarted "
                             f"{self.runner_restarts - 1} times already (--max-runner-restarts {c.max_runner_restarts})")
        self.failures_in_a_row[i] += 1
        if self.failures_in_a_row[i] >= RUNNER_CRASH_LOOP:
            raise ShoalError(f"runner {i} failed {self.failures_in_a_row[i]} times in a row, each time before "
                             f"finishing a rollout and each time with new env seeds, so restarting it does not "
                             f"help: fix {c.env} (or the settings it is trained with); the last failure: {reason}")
        logging.getLogger("shoal").warning("runner %d failed (%s); restarting it", i, reason)
        last = self.runner_health.pop(i, {})
        self.retired["env_restarts"] += last.get("env_restarts", 0)
        self.retired["dropped_episodes"] += last.get("dropped_episodes", 0) + c.num_envs_per_runner
        self.incarnations[i] += 1
        time.sleep(min(5.0, 0.1 * 2 ** min(self.incarnations[i], 6)))  # back off a runner that keeps failing
        self.runners[i] = self.backend.replace(
            self.runners[i], self.spec.runner_cls or EnvRunner, self.runner_config, i, self.store, "default",
            self.shards[i % len(self.shards)] if self.shards else None,
            self.inference[i % len(self.inference)] if self.inference else None, self.incarnations[i],
            name=f"runner-{i}", num_cpus=self.backend.runner_cpus(), num_gpus=self.backend.runner_gpus())
        self.backend.get(self.runners[i].call("ping"))  # started (start-up is not sampling time)

    def fault_metrics(self) -> dict[str, float]:
        """Counters of what failed and was recovered, over the whole run."""
        current = {k: sum(h.get(k, 0) for h in self.runner_health.values()) for k in self.retired}
        return {"faults/runner_restarts": float(self.runner_restarts),
                "faults/env_restarts": float(self.retired["env_restarts"] + current["env_restarts"]),
                "faults/dropped_episodes": float(self.retired["dropped_episodes"] + current["dropped_episodes"])}

    def _train_apex_in_process(self) -> UpdateResult:
        """Ape-X's roles, one after another: each runner inserts a rollout (when the rate limiter
        lets it), then the learner updates while the limiter allows and publishes."""
        c, get = self.config, self.backend.get
        summaries = get([r.call("sample_into_replay", c.steps_per_rollout, 0.0) for r in self.runners])
        steps = sum(s.env_steps for s in summaries)
        result = get(self.learner.call("train_for", None, self.env_steps + steps, summaries))  # their statistics
        return UpdateResult(result.metrics, result.version, steps,
                            [x for s in summaries for x in s.episode_returns],
                            [x for s in summaries for x in s.episode_lengths],
                            merge_infos(s.episode_infos for s in summaries))

    def _train_async(self) -> UpdateResult:
        """Ape-X: keep every runner sampling into replay; return when the learner's call ends."""
        c, get = self.config, self.backend.get
        for i, runner in enumerate(self.runners):
            if i not in self.inflight:
                self.inflight[i] = runner.call("sample_into_replay", c.steps_per_rollout)
        if self.learner_future is None:
            self.learner_future = self.learner.call("train_for", c.updates_per_call, self.env_steps)
        steps, returns, lengths, lags, infos, summaries = 0, [], [], [], [], []
        while True:
            ids = list(self.inflight)
            k = self.backend.wait_any([self.inflight[i] for i in ids] + [self.learner_future])
            if k < len(ids):  # a runner finished a rollout: count it and send it off again
                try:
                    summary = get(self.inflight[ids[k]])
                except SharedObjectLost:
                    raise  # the learner's weights died with it: restart the run, not this runner
                except RoleFailed as e:  # the runner died or its envs failed too often: replace it
                    self._restart_runner(ids[k], str(e))
                    self.inflight[ids[k]] = self.runners[ids[k]].call("sample_into_replay", c.steps_per_rollout)
                    continue
                self.failures_in_a_row[ids[k]] = 0
                steps += summary.env_steps
                returns += summary.episode_returns
                lengths += summary.episode_lengths
                infos.append(summary.episode_infos)
                summaries.append(summary)
                if summary.env_steps:
                    lags.append(self.policy_version - summary.policy_version)
                self.inflight[ids[k]] = self.runners[ids[k]].call("sample_into_replay", c.steps_per_rollout)
                continue
            result = get(self.learner_future)
            self.learner_future = self.learner.call("train_for", c.updates_per_call, self.env_steps + steps,
                                                    summaries)  # with their normalisers' statistics
            metrics = {**result.metrics, "learner/policy_lag_mean": float(np.mean(lags)) if lags else 0.0}
            return UpdateResult(metrics, result.version, steps, returns, lengths, merge_infos(infos))

    def _train_queued(self) -> UpdateResult:
        """IMPALA/APPO on Ray: runners sample back to back with the weights they hold; each
        finished rollout joins a bounded queue (as an ObjectRef: the data goes from runner to
        learner through the object store, not through the driver) and the learner takes up to
        ``batch_rollouts`` of them per update. A runner whose rollout finds the queue full waits
        until there is room; a runner that fails is replaced and samples again. An iteration
        ends when a learner update ends."""
        c = self.config

        def sample(i: int) -> None:  # (small status, rollout) refs; the driver only reads the status
            self.inflight[i] = self.runners[i].call_checked("sample_checked", c.steps_per_rollout)

        def start_learner() -> None:
            if self.learner_future is None and self.queue:
                self.queue_depths.append(len(self.queue))
                batch = [self.queue.popleft() for _ in range(min(c.batch_rollouts, len(self.queue)))]
                self.learner_future = self.learner.call("update", *batch)
            while self.held and len(self.queue) < c.queue_size:  # room again: release waiting runners
                i, ref = self.held.popleft()
                self.queue.append(ref)
                sample(i)

        waiting = {i for i, _ in self.held}
        for i in range(len(self.runners)):
            if i not in self.inflight and i not in waiting:
                sample(i)
        while True:
            start_learner()
            ids = list(self.inflight)
            futures = [self.inflight[i][0] for i in ids]
            k = self.backend.wait_any(futures + ([self.learner_future] if self.learner_future is not None else []))
            if k < len(ids):  # a rollout is finished: queue it, and sample the next if there is room
                i = ids[k]
                status, ref = self.inflight.pop(i)
                ok, failed = self.backend.collect({i: status}, 0.0)
                if failed:
                    self.backend.discard(ref)
                    self._restart_runner(i, failed[i])
                    sample(i)
                    continue
                self.runner_health[i] = ok[i]
                self.failures_in_a_row[i] = 0
                if len(self.queue) < c.queue_size:
                    self.queue.append(ref)
                    sample(i)
                else:
                    self.held.append((i, ref))
                continue
            result = self.backend.get(self.learner_future)
            self.learner_future = None
            start_learner()  # the learner never waits for the driver's bookkeeping
            depth = float(np.mean(self.queue_depths)) if self.queue_depths else 0.0
            self.queue_depths.clear()
            metrics = {**result.metrics, **self.fault_metrics(), "learner/queue_depth": depth,
                       "learner/queue_waiting_runners": float(len(self.held))}
            return UpdateResult(metrics, result.version, result.env_steps, result.episode_returns,
                                result.episode_lengths, result.episode_infos)

    def evaluate(self, episodes: int | None = None, deterministic: bool | None = None) -> dict[str, float]:
        """Evaluate the newest weights on fresh envs (the same seeds every time, for comparability)."""
        self._check_running()
        c = self.config
        if episodes is not None and (isinstance(episodes, bool) or not isinstance(episodes, numbers.Integral)
                                     or episodes < 1):
            raise ShoalError(f"episodes must be a whole number of at least 1, got {episodes!r}")
        out = self.backend.get(self.start_evaluator().call(
            "evaluate", c.eval_episodes if episodes is None else int(episodes),
            c.eval_deterministic if deterministic is None else deterministic,
            c.seed + EVAL_SEED_OFFSET))
        return {"iteration": self.iteration, "env_steps": self.env_steps, "time/elapsed_s": self.elapsed_s,
                **out, "time/wall_s": self.wall_s}

    def start_evaluator(self) -> Any:
        """The evaluation role, made at its first use: an Algorithm that a script trains and never
        evaluates makes none (on Ray, a process less: RLlib makes its evaluation workers only where
        evaluation is configured). :func:`shoal.train` starts it with the run, beside the others."""
        self._check_running()
        if self._evaluator is None:
            self._evaluator = self.backend.make(Evaluator, self.config, self.store, name="evaluator")
        return self._evaluator

    @property
    def wall_s(self) -> float:
        """Wall time of the run so far: start-up, sampling, learning, evaluation, checkpoints."""
        return self.wall_offset_s + time.perf_counter() - self.started

    # -- deployment -----------------------------------------------------------------------
    def get_policy(self) -> Policy:
        """The current policy, in this process, for ``policy.act(obs)``."""
        self._check_running()
        module = self.spec.make_policy(self.config, self.obs_space, self.action_space)
        set_weights(module, self.backend.get(self.learner.call("get_weights")))
        return Policy(module, self.policy_version, self.config, self.env_obs_space)

    # -- checkpoints ----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write a complete checkpoint directory at ``path`` (atomically)."""
        self._check_running()
        learner_state = self.backend.get(self.learner.call("get_state"))
        ruined = [k for k, v in learner_state["weights"].items() if v.dtype.kind == "f" and not np.isfinite(v).all()]
        if ruined:  # an update whose reported losses were finite can still leave them so
            raise Diverged(f"training diverged: policy version {learner_state['version']} holds NaN or inf (in "
                           f"{ruined[0]}), so no checkpoint was written: {Diverged.advice(self.config)}")
        runner_states = self.backend.get([r.call("get_state") for r in self.runners])
        policy = {"format": 1, "algo": self.spec.name, "config": to_dict(self.config),
                  "obs_space": describe_space(self.obs_space), "action_space": describe_space(self.action_space),
                  **({"env_obs_space": describe_space(self.env_obs_space)} if self.env_obs_space is not None else {}),
                  "weights": {k: torch.tensor(v) for k, v in learner_state["weights"].items()},
                  "version": learner_state["version"]}
        driver = {"faults": {"runner_restarts": self.runner_restarts, "incarnations": self.incarnations,
                             "retired": self.retired, "runner_health": self.runner_health},
                  "iteration": self.iteration, "env_steps": self.env_steps, "num_episodes": self.num_episodes,
                  "elapsed_s": self.elapsed_s, "wall_s": self.wall_s, "recent_returns": list(self.recent_returns),
                  "recent_lengths": list(self.recent_lengths),
                  "recent_infos": {key: list(values) for key, values in self.recent_infos.items()}}
        meta = {"algo": self.spec.name, "env": self.config.env, "iteration": self.iteration,
                "env_steps": self.env_steps, "policy_version": learner_state["version"], "time": time.time()}
        return ckpt.write_checkpoint(Path(path), policy,
                                     {"learner": learner_state, "runners": runner_states, "driver": driver}, meta)

    def restore(self, path: str | Path) -> None:
        """Continue from a checkpoint of the same algorithm: weights, optimiser, counters, RNG, envs."""
        path = ckpt.resolve(path)
        meta = ckpt.read_meta(path)
        if meta["algo"] != self.spec.name:
            raise ShoalError(f"checkpoint {path} is from algorithm {meta['algo']!r}, not {self.spec.name!r}")
        state = ckpt.read_state(path)
        self._check_network_fits(path, extra=state["learner"]["extra"])
        self._check_spaces(path)
        if state["learner"].get("replay") is not None:
            saved = ckpt.read_policy(path)["config"]
            self._check_replay_fits(saved, path, "resume")
            self._prepare_saved_replay(saved, state["learner"]["replay"])
        self.backend.get(self.learner.call("set_state", state["learner"]))
        self.replay_loaded = state["learner"].get("replay_loaded", 0)
        if "replay" in state["learner"] and state["learner"]["replay"] is None:
            import logging

            from shoal.offpolicy import min_size_to_sample

            shards = self.config.num_replay_shards  # 1 unless --apex
            refill = min_size_to_sample(self.config, shards) * shards
            logging.getLogger("shoal").warning(
                "checkpoint %s holds no replay buffer (the run did not set --save-replay): updates "
                "resume once %s new transitions refill it", path, f"{refill:,}")
        runners = state["runners"]
        if len(runners) == len(self.runners):
            self.backend.get([r.call("set_state", s) for r, s in zip(self.runners, runners)])
        d = state["driver"]
        self.iteration, self.env_steps, self.num_episodes = d["iteration"], d["env_steps"], d["num_episodes"]
        self.elapsed_s, self.policy_version = d["elapsed_s"], state["learner"]["version"]
        self.wall_offset_s, self.started = d["wall_s"], time.perf_counter()
        self.recent_returns.extend(d["recent_returns"])
        self.recent_lengths.extend(d["recent_lengths"])
        for key, values in d.get("recent_infos", {}).items():
            if key in self.recent_infos:
                self.recent_infos[key].extend(values)
        faults = d.get("faults")
        if faults is not None:
            self.runner_restarts, self.retired = faults["runner_restarts"], faults["retired"]
            self.runner_health = faults["runner_health"]
            if len(faults["incarnations"]) == len(self.incarnations):
                self.incarnations = faults["incarnations"]

    def init_from(self, path: str | Path) -> Path:
        """Start this new run's networks from a checkpoint (or run directory) of the same algorithm
        (``--init-from``, rl-zoo's ``--trained-agent``): its policy and the algorithm's other networks
        (critics, targets), with this run's settings, fresh optimisers, counters, random state and
        an empty replay buffer (:meth:`init_replay` fills it). The env may differ where its spaces
        are the checkpoint's. Returns the checkpoint used."""
        self._check_running()
        try:
            path = ckpt.resolve(path)
        except ShoalError as e:
            raise ShoalError(f"--init-from: {e}") from None
        meta = ckpt.read_meta(path)
        if meta["algo"] != self.spec.name:
            raise ShoalError(f"--init-from {path} is a checkpoint of {meta['algo']}, not {self.spec.name}: start "
                             f"from it with `shoal train {meta['algo']} --init-from {path}`")
        self._check_spaces(path)  # first: another env's spaces say more than the network shapes they make
        # the critics and targets are in the pickled training state: read as a resume reads it
        extra = ckpt.read_state(path)["learner"]["extra"] if self.spec.learner_cls.EXTRA_NETWORKS else {}
        self._check_network_fits(path, "start from it", extra)
        weights = {k: v.numpy() for k, v in ckpt.read_policy(path)["weights"].items()}  # read without pickle
        self.policy_version = self.backend.get(self.learner.call("load_networks", weights, extra))
        return path

    def init_replay(self, path: str | Path) -> int:
        """Fill this new run's replay buffer with the transitions a checkpoint (or run directory)
        saved with --save-replay (``--init-replay``, SB3's ``load_replay_buffer``): of any replay
        algorithm on an env with these spaces, with this run's gamma, n_step and clip_rewards (its
        stored returns were summed with them). The newest that fit --buffer-size are kept; they
        count towards learning_starts. Returns how many were loaded."""
        self._check_running()
        if not hasattr(self.config, "save_replay"):
            raise ShoalError(f"--init-replay: {self.spec.name} keeps no replay buffer (it learns from each rollout "
                             "once): start a replay algorithm from one (dqn, sac, td3, ...)")
        try:
            path = ckpt.resolve(path)
        except ShoalError as e:
            raise ShoalError(f"--init-replay: {e}") from None
        self._check_spaces(path)
        saved = ckpt.read_policy(path)["config"]
        if "save_replay" not in saved:
            raise ShoalError(f"--init-replay: {path} is a checkpoint of {ckpt.read_meta(path)['algo']}, which keeps "
                             "no replay buffer")
        self._check_replay_fits(saved, path, "start from it", "--init-replay: ")
        replay = ckpt.read_state(path)["learner"].get("replay")
        if replay is None:
            raise ShoalError(f"--init-replay: {path} holds no replay buffer: its run did not set --save-replay "
                             "(a run of yours that sets it saves its replay in every checkpoint)")
        loaded, self.policy_version = self.backend.get(self.learner.call("load_replay", replay))
        self.replay_loaded += loaded
        return loaded

    def _check_replay_fits(self, saved: dict[str, Any], path: Path, doing: str, prefix: str = "") -> None:
        """Refuse a replay saved at ``path`` by a run of config ``saved`` whose transitions these
        settings would read otherwise: its n-step returns and discounts were summed with that
        run's gamma and n_step, and its rewards clipped (or not) as its clip_rewards said."""
        changed = {key: saved.get(key, default) for key, default in (("gamma", 0.99), ("n_step", 1),
                                                                      ("clip_rewards", False))
                   if saved.get(key, default) != getattr(self.config, key)}
        if changed:
            differ = "; ".join(f"{key} {value} there, {getattr(self.config, key)} here"
                               for key, value in changed.items())
            sets = " ".join(f"--set {key}={str(value).lower()}" for key, value in changed.items())
            raise ShoalError(f"{prefix}the replay saved in {path} holds returns these settings would read otherwise "
                             f"({differ}): {doing} with its values ({sets})")

    def _prepare_saved_replay(self, saved: dict[str, Any], replay: list[dict[str, Any]]) -> None:
        """Mark each shard of a replay saved by a run of config ``saved`` with its capacity (the
        learner restores a replay exactly where they are its own), and warn where a resume with
        another --buffer-size or --num-replay-shards loads the saved transitions into the new
        replay instead."""
        import logging

        from shoal.offpolicy import replay_fits

        c = self.config
        before = (saved["buffer_size"], saved.get("num_replay_shards", 1))
        for shard in replay:  # checkpoints written before shards recorded their capacity
            shard.setdefault("capacity", before[0] // len(replay))
        if replay_fits(replay, c):
            return
        held = sum(shard["size"] for shard in replay)

        def sizes(buffer_size: int, shards: int) -> str:
            return f"buffer_size {buffer_size:,}" + (f" in {shards} shards" if shards > 1 else "")

        logging.getLogger("shoal").warning(
            "resuming with %s where the checkpoint's replay had %s: the newest of its %s transitions that fit were "
            "loaded, and the rate limiter and unfinished n-step windows start afresh (resume with its sizes to "
            "continue exactly)", sizes(c.buffer_size, c.num_replay_shards), sizes(*before), f"{held:,}")

    def _check_spaces(self, path: Path) -> None:
        """Refuse a checkpoint written for other observations or actions than the env's now, though
        its network has the shapes these settings build: it would act on inputs laid out otherwise
        (a checkpoint written before shoal read an env's action mask, say, which it then flattened
        as one more entry)."""
        payload = ckpt.read_policy(path)
        saved = (space_from_description(payload["obs_space"]), space_from_description(payload["action_space"]))
        misfit = policy_misfit(saved, (self.obs_space, self.action_space))
        if misfit:
            raise ShoalError(f"checkpoint {path} does not fit {self.config.env}: {misfit}")

    def _check_network_fits(self, path: Path, doing: str = "resume", extra: dict[str, Any] | None = None) -> None:
        """Refuse, in one line and before any role loads it, a checkpoint whose networks these
        settings do not build (``hidden_sizes``, ``critic_hidden_sizes``, ``dueling``,
        ``normalize_obs`` or the env's spaces changed since it was written), or one of another
        ``--encoder`` class (whose parameters may have the same names and shapes, and mean
        something else). ``extra``: the checkpoint's learner state beyond the policy, whose
        networks (critics, targets) are checked against the learner's where the algorithm has them."""
        payload = ckpt.read_policy(path)
        encoder = payload["config"].get("encoder")
        if encoder != self.config.encoder:
            raise ShoalError(f"checkpoint {path} holds a network with --encoder {encoder or '(none)'}, "
                             f"and these settings build one with --encoder {self.config.encoder or '(none)'}: "
                             f"{doing} with the run's own encoder")
        policy = self.spec.make_policy(self.config, self.obs_space, self.action_space).state_dict()
        here = {k: list(v.shape) for k, v in policy.items()}
        there = {k: list(v.shape) for k, v in payload["weights"].items()}
        if extra and self.spec.learner_cls.EXTRA_NETWORKS:
            mine, saved_extra = self.backend.get(self.learner.call("extra_shapes")), network_shapes(extra)
            entries = {k.split(".")[0] for k in mine} & {k.split(".")[0] for k in saved_extra}
            here.update((k, v) for k, v in mine.items() if k.split(".")[0] in entries)
            there.update((k, v) for k, v in saved_extra.items() if k.split(".")[0] in entries)

        def shape(shapes: dict[str, list[int]], key: str) -> list[int] | str:
            return shapes.get(key, "absent")

        wrong = [k for k in sorted(here.keys() | there.keys()) if shape(here, k) != shape(there, k)]
        if not wrong:
            return
        saved, now = to_dict(config_from_dict(self.spec.name, payload["config"])), to_dict(self.config)
        beside = ("total_steps", "stop_return", "run_dir", "init_from", "init_replay")  # not the network's shapes
        changed = [f"{k} {saved.get(k)} -> {v}" for k, v in now.items() if saved.get(k) != v and k not in beside]
        raise ShoalError(
            f"checkpoint {path} holds a network these settings do not build ({wrong[0]}: "
            f"{shape(there, wrong[0])} in the checkpoint, {shape(here, wrong[0])} now); changed since it was "
            f"written: {', '.join(changed) or 'none of the settings'}. {doing.capitalize()} with the run's own values "
            "for the settings that shape the network")

    def stop(self) -> None:
        """Release the roles (and Ray, if this run started it)."""
        self.stopped = True
        self.backend.shutdown()

    def _check_running(self) -> None:
        if self.stopped:
            raise ShoalError("this Algorithm was stopped (its `with` block ended, or stop() was called), and its "
                             "roles are gone: shoal.load(CHECKPOINT) makes a new one from a checkpoint it saved")

    def __enter__(self) -> "Algorithm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def config_from_dict(algo: str, values: dict[str, Any], source: str = "checkpoint") -> Any:
    """Rebuild a config of algorithm ``algo`` from a plain dict."""
    cls = get(algo).config_cls
    return cls(**merge(cls, {}, values, source))


def make(config: Any) -> Algorithm:
    """Build an algorithm's roles from its config: ``algo = shoal.make(PPOConfig(env=...))``; its
    networks start from ``config.init_from``'s checkpoint where it names one, and its replay holds
    ``config.init_replay``'s transitions where it names one."""
    algo = Algorithm(config)
    try:
        if config.init_from:
            algo.init_from(config.init_from)
        if getattr(config, "init_replay", None):
            algo.init_replay(config.init_replay)
    except BaseException:
        algo.stop()
        raise
    return algo


def load(path: str | Path, **overrides: Any) -> Algorithm:
    """An Algorithm restored from a checkpoint or run directory, ready to train on or evaluate.

    ``overrides`` replace config fields (e.g. ``backend="local"``, ``total_steps=...``).
    """
    path = ckpt.resolve(path)
    payload = ckpt.read_policy(path)
    config = config_from_dict(payload["algo"], {**payload["config"], **overrides})
    algo = Algorithm(config)
    try:
        algo.restore(path)
    except BaseException:
        algo.stop()
        raise
    return algo


def load_policy(path: str | Path, env_observation_space: gym.Space | None = None) -> Policy:
    """The policy of a checkpoint for deployment; reads no pickled code and starts no roles.

    ``env_observation_space``: the env's own observation space (a Dict, a Tuple, a Discrete),
    so that :meth:`Policy.act` takes the env's own observations where the checkpoint recorded
    none (a run on remote envs, which send flat vectors); it must flatten to the policy's."""
    path = ckpt.resolve(path)
    payload = ckpt.read_policy(path)
    config = config_from_dict(payload["algo"], payload["config"])
    module = get(payload["algo"]).make_policy(config, space_from_description(payload["obs_space"]),
                                              space_from_description(payload["action_space"]))
    module.load_state_dict(payload["weights"])
    own = payload.get("env_obs_space")
    policy = Policy(module, payload["version"], config, space_from_description(own) if own is not None else None)
    if env_observation_space is not None:
        policy.use_env_observation_space(env_observation_space)
    return policy
