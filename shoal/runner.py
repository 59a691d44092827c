"""EnvRunner: steps a vector of envs with a policy copy and returns whole rollouts.

A runner never makes a remote call per env step (an actor call costs ~0.75 ms, MEASURED.md):
it pulls newer weights once per rollout and hands back a typed batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import cloudpickle
import numpy as np
import torch
from torch import Tensor, nn

from shoal import devices
from shoal.errors import Diverged, ShoalError
from shoal.policy import Moments, non_finite_rows, set_up_torch, set_weights


@dataclass
class Rollout:
    """T steps of B envs, as the behaviour policy saw them. Shapes in brackets."""

    obs: np.ndarray  # [T, B, *input_shape] PolicyModule.inputs (normalised, unless the learner normalises)
    actions: np.ndarray  # [T, B] or [T, B, act_dim]: as sampled, before clipping
    logp: np.ndarray  # [T, B] behaviour log-probability of ``actions``
    rewards: np.ndarray  # [T, B]
    terminated: np.ndarray  # [T, B] bool: the episode ended in a terminal state (no bootstrap)
    truncated: np.ndarray  # [T, B] bool: the episode was cut (time limit): bootstrap from final_obs
    last_obs: np.ndarray  # [B, *input_shape] network input after the last step
    final_idx: np.ndarray  # [K, 2] (t, b) of every step that ended an episode
    final_obs: np.ndarray  # [K, *input_shape] network input of the last observation of those episodes
    policy_id: str
    policy_version: int
    runner_id: int
    obs_moments: Moments | None  # raw-observation moments, merged into the normaliser by the learner
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    episode_infos: dict[str, list[float]] = field(default_factory=dict)  # --episode-info keys at episodes' ends
    return_moments: Moments | None = None  # of the discounted returns so far, each step (normalize_rewards)
    memory: tuple[np.ndarray, np.ndarray] | None = None  # recurrent policies: (h, c) [B, 2 * lstm_size] at step 0

    @property
    def env_steps(self) -> int:
        """Environment steps in this rollout."""
        return self.rewards.size


class RolloutSummary(NamedTuple):
    """What a runner reports after inserting a rollout into replay itself (Ape-X)."""

    env_steps: int
    episode_returns: list[float]
    episode_lengths: list[int]
    policy_version: int
    episode_infos: dict[str, list[float]] = {}
    obs_moments: Moments | None = None  # raw-observation moments, for the learner's normaliser
    return_moments: Moments | None = None  # of the discounted returns, for its reward normaliser


def merge_infos(parts: Any) -> dict[str, list[float]]:
    """Several rollouts' ``episode_infos`` as one: each key's values, in order."""
    merged: dict[str, list[float]] = {}
    for part in parts:
        for key, values in part.items():
            merged.setdefault(key, []).extend(values)
    return merged


def final_info_value(info: dict[str, Any], key: str, b: int) -> float | None:
    """``key`` of the info env ``b`` gave at the step that ended its episode (same-step autoreset
    keeps it in ``info["final_info"]``), as a float; None where that env gave none, or no number."""
    final = info.get("final_info") or {}
    mask = final.get(f"_{key}")
    if key not in final or (mask is not None and not mask[b]):
        return None
    return info_number(final[key][b])


def info_number(value: Any) -> float | None:
    """An info entry as a finite float, or None where it is none (text, an array, NaN)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


class EnvRunner:
    """Owns a vector env and a policy copy; ``sample(T)`` returns one Rollout of T steps per env."""

    WARMUP_ROLLOUT_STEPS = 256  # the longest rollout while the replay fills to learning_starts (Ape-X: its shard)

    def __init__(self, config, runner_id: int, store, policy_id: str = "default", replay=None, inference=None,
                 incarnation: int = 0):
        from shoal.algos import spec_for
        from shoal.envs import EnvOptions, make_vector_env

        set_up_torch(config.torch_threads)
        self.config, self.runner_id, self.store, self.policy_id = config, runner_id, store, policy_id
        self.replay = replay  # Ape-X: the replay shard this runner inserts into
        self.inference = inference  # --inference central: the server that computes our actions
        self.nstep = None
        if replay is not None:  # Ape-X: transitions are built here, to compute their priorities
            from shoal.replay import NStep

            self.nstep = NStep(config.gamma, config.n_step)
        self.env = make_vector_env(config.env, config.num_envs_per_runner, config.env_kwargs,
                                   EnvOptions.of(config))
        self.device = devices.resolve(config.runner_device, "--runner-device")  # where the policy copy acts
        # in eval mode, as every copy that acts (SB3's rollouts too): an --encoder's dropout is off and
        # its batch norm reads the statistics the learner publishes, whatever the number of envs
        self.policy = spec_for(config).make_policy(
            config, self.env.single_observation_space, self.env.single_action_space).to(self.device).eval()
        self.policy.reset_memory(self.env.num_envs)
        self.version = -1
        # Distinct streams per runner, fixed per seed; a restarted runner (incarnation > 0) draws
        # new ones, so an env that failed deterministically does not fail the same way again.
        seed = config.seed + 1000 * (runner_id + 1) + 1_000_003 * incarnation
        self.dropped_episodes = 0  # episodes lost to env failures (and, remotely, to server restarts)
        self.seed = seed
        self.generator = devices.generator(self.device, seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.env.action_space.seed(seed)
        self.ep_return = np.zeros(self.env.num_envs)
        self.ep_length = np.zeros(self.env.num_envs, dtype=np.int64)
        # normalize_rewards: each env's discounted return so far, whose spread scales the rewards
        # the learner sees (stable-baselines3's VecNormalize(norm_reward=True) keeps the same)
        self.discounted = np.zeros(self.env.num_envs) if getattr(config, "normalize_rewards", False) else None

    def sync_weights(self) -> int:
        """Load the newest published weights, if newer than ours; return our version."""
        got = self.store.latest(self.policy_id, newer_than=self.version)
        if got is not None:
            self.version, weights = got
            set_weights(self.policy, weights)
            if getattr(self.config, "apex", False):  # each runner explores at its own rate
                self.policy.apply_ladder(self.runner_id, self.config.num_env_runners)
        return self.version

    def sample(self, num_steps: int) -> Rollout:
        """Step every env ``num_steps`` times with the newest weights; return the rollout."""
        if self.inference is None:
            self.sync_weights()
        return self._rollout(num_steps)

    @torch.no_grad()
    def _rollout(self, num_steps: int) -> Rollout:
        """Step every env ``num_steps`` times with the weights held now (or the inference server's)."""
        central = self.inference is not None
        versions: list[int] = []
        m, env, B = self.policy, self.env, self.env.num_envs
        obs_dim = int(np.prod(env.single_observation_space.shape))
        obs = np.empty((num_steps, B, *m.input_shape), m.input_dtype)
        raw = np.empty((num_steps, B, obs_dim - m.norm_from), np.float32) if m.obs_norm is not None else None
        actions = None
        logp = np.empty((num_steps, B), np.float32)
        rewards = np.empty((num_steps, B), np.float32)
        terminated = np.empty((num_steps, B), bool)
        truncated = np.empty((num_steps, B), bool)
        final_idx: list[tuple[int, int]] = []
        final_raw: list[np.ndarray] = []
        returns: list[float] = []
        lengths: list[int] = []
        infos: dict[str, list[float]] = {key: [] for key in getattr(self.config, "episode_info", ())}
        floats = self.obs.dtype.kind == "f"  # images (uint8) cannot hold NaN
        discounted = np.empty((num_steps, B)) if self.discounted is not None else None
        memory = tuple(x.cpu().numpy().copy() for x in m.memory) if m.recurrent else None
        m.start_rollout()
        for t in range(num_steps):
            if raw is not None:
                raw[t] = self.obs.reshape(B, obs_dim)[:, m.norm_from:]
            if m.mask_dim:
                self._check_mask(self.obs, m.mask_dim)
            if central:  # one request per step; the server batches it with other runners'
                held = tuple(x.numpy() for x in m.memory) if m.recurrent else None  # the envs' memory: ours
                xn_np, a_np, logp_np, version, *stepped = self.inference.resolve(
                    self.inference.call("explore", self.obs, held))
                if m.recurrent:
                    m.memory = tuple(torch.tensor(x) for x in stepped[0])  # copies: Ray's arrays are read-only
                versions.append(version)
                a = torch.tensor(a_np)  # a copy: Ray hands back read-only arrays
                env_a = m.to_env(a)
                obs[t], logp[t] = xn_np, logp_np
            else:
                xn = m.inputs(self._upload(self.obs))
                try:
                    a, logp_t = m.explore(m.network_inputs(xn), self.generator)
                except Exception as e:  # a NaN in the weights fails sampling (torch.multinomial) here
                    self._raise_if_diverged(self.obs, error=e)
                    raise
                env_a = m.to_env(a)  # (on a GPU: the one wait for its queue a step; the copies after it are ready)
                a = a.cpu()
                obs[t] = xn.cpu().numpy()
                logp[t] = logp_t.cpu().numpy()
            if actions is None:
                actions = np.empty((num_steps, *a.shape), a.numpy().dtype)
            actions[t] = a.numpy()
            before, (self.obs, r, term, trunc, info) = self.obs, env.step(env_a)
            if not np.isfinite(r).all() or (floats and not np.isfinite(self.obs).all()):
                self._check_actions(actions[t], before)  # NaN actions give NaN rewards: the policy's fault
                self._non_finite(r, self.obs)  # one NaN would reach every weight through the learner
            rewards[t], terminated[t], truncated[t] = np.sign(r) if self.config.clip_rewards else r, term, trunc
            self.ep_return += r
            self.ep_length += 1
            done = term | trunc
            m.forget(done)  # a recurrent policy starts the next episodes with an empty memory
            if discounted is not None:
                self.discounted = self.discounted * self.config.gamma + r
                discounted[t] = self.discounted
                self.discounted[done] = 0.0
            if done.any():
                errors = info.get("_env_error")
                for b in np.flatnonzero(done):
                    final_idx.append((t, b))
                    final_raw.append(info["final_obs"][b])
                    if errors is not None and errors[b]:  # the env failed: its episode is lost
                        self.dropped_episodes += 1
                        continue
                    returns.append(float(self.ep_return[b]))
                    lengths.append(int(self.ep_length[b]))
                    for key, values in infos.items():
                        if (value := final_info_value(info, key, b)) is not None:
                            values.append(value)
                if errors is not None:
                    self._check_actions(actions[t], before)  # an env that raised on NaN actions
                    self._check_env_restarts()
                self.ep_return[done] = 0.0
                self.ep_length[done] = 0
        final = np.asarray(final_raw, self.obs.dtype).reshape(len(final_raw), *env.single_observation_space.shape)
        if floats and not np.isfinite(final).all():
            self._non_finite(np.zeros(len(final)), final, [b for _, b in final_idx])
        if central:  # the server holds the normaliser too
            last_obs, final_obs = self._central_normalize(final, B)
            self.version = min(versions)
        else:
            last_obs = m.inputs(self._upload(self.obs)).cpu().numpy()
            final_obs = (m.inputs(self._upload(final)).cpu().numpy() if len(final)
                         else np.empty((0, *m.input_shape), m.input_dtype))
        return Rollout(
            obs=obs, actions=actions, logp=logp, rewards=rewards,
            terminated=terminated, truncated=truncated, last_obs=last_obs,
            final_idx=np.asarray(final_idx, np.int64).reshape(-1, 2), final_obs=final_obs,
            policy_id=self.policy_id, policy_version=self.version, runner_id=self.runner_id,
            obs_moments=Moments.of(raw.reshape(-1, obs_dim - m.norm_from)) if raw is not None else None,
            episode_returns=returns, episode_lengths=lengths, episode_infos=infos,
            return_moments=Moments.of(discounted.reshape(-1)) if discounted is not None else None,
            memory=memory,
        )

    def _non_finite(self, rewards: np.ndarray, obs: np.ndarray, envs: list[int] | None = None) -> None:
        """Raise for an env that returned a NaN or an infinity (row k is env ``envs[k]``): the
        runner fails (and is replaced) before the value reaches the learner."""
        bad_reward = np.flatnonzero(~np.isfinite(rewards))
        row = bad_reward[0] if bad_reward.size else non_finite_rows(obs)[0]
        if bad_reward.size:  # the value, and where a NaN may come from: the vector env stores None as NaN
            none = " (a reward of None is stored as NaN)" if np.isnan(rewards[row]) else ""
            what = f"a reward of {rewards[row]}{none}"
        else:
            what = "an observation holding NaN or inf"
        env = row if envs is None else envs[row]
        raise ShoalError(f"runner {self.runner_id}: env {env} of {self.config.env} returned {what}, which training "
                         "would spread to every weight of the network")

    def _check_actions(self, actions: np.ndarray, obs: np.ndarray) -> None:
        """After an env failed or gave NaN: raise :class:`Diverged` if the policy chose NaN or inf
        actions from finite observations ``obs`` (the env only passed them on). An env that takes
        NaN actions quietly passes them to replay instead, and the learner's losses name them."""
        if actions.dtype.kind == "f" and not np.isfinite(actions).all():
            self._raise_if_diverged(obs, "chose NaN or inf actions")

    def _upload(self, x: np.ndarray) -> Tensor:
        """Observations (or other arrays) as a tensor where the policy acts (sharing ``x``'s memory on the CPU)."""
        return devices.upload(x, self.device)

    def _raise_if_diverged(self, obs: np.ndarray, symptom: str | None = None, error: Exception | None = None) -> None:
        """Raise :class:`Diverged` if the policy, not the env, is at fault: its weights hold NaN or
        inf, or it computes them (``symptom``, or in a layer's output) from a finite observation
        ``obs`` (raw). Only called after something failed, so the normal path pays nothing for it."""
        raw_obs = self._upload(obs)
        if not all(t.isfinite().all() for t in self.policy.state_dict().values() if t.is_floating_point()):
            what = "holds NaN or inf in its weights"
        elif not raw_obs.isfinite().all():
            return  # the env's observation: the checks after each step name it
        elif (layer := self._layer_computing_nan(raw_obs)) is not None:
            what = f"computes NaN or inf from a finite observation (in a {type(layer).__name__} layer)"
        elif symptom is not None:
            what = f"{symptom} from a finite observation"
        else:
            return
        raise Diverged(f"training diverged: runner {self.runner_id} ({self.config.env}) acts with policy version "
                       f"{self.version}, which {what}: {Diverged.advice(self.config)}") from error

    def _layer_computing_nan(self, raw_obs: Tensor) -> nn.Module | None:
        """The first of the policy's layers whose output holds NaN or inf when it acts on ``raw_obs``."""
        bad: list[nn.Module] = []

        def look(module: nn.Module, inputs: Any, out: Any) -> None:
            if isinstance(out, Tensor) and out.is_floating_point() and not out.isfinite().all():
                bad.append(module)

        hooks = [module.register_forward_hook(look) for module in self.policy.modules()]
        try:
            with torch.no_grad():
                self.policy.explore(self.policy.normalize(raw_obs), devices.generator(self.device, 0))
        except Exception:
            pass  # sampling from NaN fails: the layers before it have spoken
        finally:
            for hook in hooks:
                hook.remove()
        return bad[0] if bad else None

    def _check_mask(self, obs: np.ndarray, k: int) -> None:
        """Raise for an env whose action mask allows no action where the policy must choose one."""
        empty = ~(obs[:, -k:] > 0.5).any(1)
        if empty.any():
            raise ShoalError(f"runner {self.runner_id}: env {int(np.flatnonzero(empty)[0])} of {self.config.env} gave "
                             "an action mask that allows no action, in a state the episode goes on from")

    def sample_checked(self, num_steps: int) -> tuple[dict[str, int], Rollout]:
        """:meth:`sample` with this runner's health counters first, for drivers that check it."""
        rollout = self.sample(num_steps)
        return self.health(), rollout

    def env_restarts(self) -> int:
        """Envs this runner replaced after they raised (local envs) or reconnected (remote)."""
        return int(getattr(self.env, "env_restarts", 0) + getattr(self.env, "reconnects", 0))

    def _check_env_restarts(self) -> None:
        limit = self.config.max_env_restarts
        if self.env_restarts() > limit:
            last = getattr(self.env, "last_error", "")
            n = self.env_restarts()
            raise ShoalError(f"runner {self.runner_id}: its envs failed {n} time{'s' if n != 1 else ''} "
                             f"(more than --max-env-restarts {limit})" + (f"; the last said {last}" if last else ""))

    def health(self) -> dict[str, int]:
        """Counters for the driver: env restarts and episodes dropped, this incarnation."""
        return {"env_restarts": self.env_restarts(), "dropped_episodes": self.dropped_episodes}

    def _central_normalize(self, final: np.ndarray, B: int) -> tuple[np.ndarray, np.ndarray]:
        """Network inputs of the last and the final observations, from the inference server."""
        x = self.inference.resolve(self.inference.call("normalize", np.concatenate([self.obs, final])))
        return x[:B], x[B:]

    def sample_into_replay(self, num_steps: int, max_wait_s: float = 0.05) -> RolloutSummary:
        """Ape-X: sample a rollout and insert it into this runner's replay shard directly, once the
        shard's rate limiter lets writers in (so runners cannot outrun the learner).

        Waits at most ``max_wait_s`` and then returns an empty summary, to be called again: a call
        that blocked until the learner catches up could deadlock with a driver that is waiting
        on this runner (a checkpoint asks for its state) while the learner waits on the driver.
        Each look at the limiter is a call to the shard, so the pauses between looks grow from
        2 ms to 16 ms (polling every 2 ms cost the runners and the shard ~25% of a core more).

        While the shard is still filling to the size the learner starts sampling it at (before
        ``learning_starts``, when the policy acts at random, or after a resume without the
        replay's contents), no update waits on what this runner inserts: the rollout then fills
        as much of the limiter's room as it may, up to ``WARMUP_ROLLOUT_STEPS`` steps, instead of
        paying these calls every ``num_steps`` steps (SAC's 10k random steps on
        LunarLanderContinuous took 88 s in 1-step rollouts).
        """
        B = self.env.num_envs
        deadline, pause = time.monotonic() + max_wait_s, 0.002
        while (admission := self.replay.resolve(self.replay.call("admission"))).room < num_steps * B:
            if time.monotonic() > deadline:
                return RolloutSummary(0, [], [], self.version)
            time.sleep(pause)
            pause = min(2 * pause, 0.016)
        self.sync_weights()
        if admission.filling:
            num_steps = max(num_steps, min(self.WARMUP_ROLLOUT_STEPS, admission.room // B))
        r = self._rollout(num_steps)
        batch = self.nstep(r)
        priorities = None
        if self.config.prioritized:
            m = self.policy
            obs, actions, rewards, next_obs, discounts = (self._upload(x) for x in batch)
            p = m.initial_priorities(m.network_inputs(obs), actions, rewards, m.network_inputs(next_obs), discounts)
            priorities = None if p is None else p.cpu().numpy()
        if getattr(self.config, "compress_observations", False):  # here, not in the shard all runners share
            from shoal.replay import compress_rows

            obs, actions, rewards, next_obs, discounts = batch
            batch = (compress_rows(obs), actions, rewards, compress_rows(next_obs), discounts)
        self.replay.resolve(self.replay.call("add", *batch, priorities))
        return RolloutSummary(r.env_steps, r.episode_returns, r.episode_lengths, r.policy_version, r.episode_infos,
                              r.obs_moments, r.return_moments)

    def get_state(self) -> bytes:
        """Everything needed to continue exactly: envs mid-episode, RNG, episode accumulators."""
        return cloudpickle.dumps({
            "env": self.env, "obs": self.obs, "generator": self.generator.get_state(),
            "ep_return": self.ep_return, "ep_length": self.ep_length,
            "nstep": None if self.nstep is None else self.nstep.get_state(),
            "dropped_episodes": self.dropped_episodes, "discounted": self.discounted,
            "memory": devices.to_cpu(getattr(self.policy, "memory", None)),
        })

    def set_state(self, state: bytes) -> None:
        """Restore what :meth:`get_state` saved (a checkpoint written by this machine's user)."""
        s = cloudpickle.loads(state)
        self.env.close()
        self.env, self.obs = s["env"], s["obs"]
        try:
            self.generator.set_state(s["generator"])
        except RuntimeError:  # saved by another device's generator (resumed with another --runner-device)
            self.generator.manual_seed(self.seed)
        self.ep_return, self.ep_length = s["ep_return"], s["ep_length"]
        self.dropped_episodes = s.get("dropped_episodes", 0)
        if self.discounted is not None and s.get("discounted") is not None:
            self.discounted = s["discounted"]
        if self.policy.recurrent and s.get("memory") is not None:
            self.policy.memory = tuple(x.to(self.device) for x in s["memory"])
        if self.nstep is not None and s.get("nstep") is not None:
            self.nstep.set_state(s["nstep"])
        self.version = -1  # pull the restored weights on the next sample

    def ping(self) -> int:
        """Cheap liveness check for the driver; returns the runner id."""
        return self.runner_id
