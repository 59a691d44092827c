"""``shoal check-env``: is an environment ready to train on? (stable-baselines3's ``check_env``,
RLlib's env checker.) Gymnasium's own API checker, what shoal's policies make of its spaces and
which algorithms take them, and how fast it steps with random actions. For env servers
(``remote://``, a simulator behind ``proto/shoal.proto`` in any language), the protocol's checks
in place of Gymnasium's."""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from shoal.envs import EnvOptions, check_env_id, error_line, make_env, wrap
from shoal.errors import ShoalError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class EnvReport:
    """What :func:`check_env` found."""

    env_id: str
    problem: str | None = None
    """The first violation of Gymnasium's API its checker found (None: it passed)."""
    warnings: list[str] = field(default_factory=list)
    """What Gymnasium's checker warned of."""
    spaces: tuple[gym.Space, gym.Space] | None = None
    """The observation and action spaces shoal's policies see (observations flattened, an action
    mask appended, frames preprocessed)."""
    algorithms: dict[str, str | None] = field(default_factory=dict)
    """Each algorithm: None if it trains on these spaces, else why not."""
    steps: int = 0
    steps_per_s: float = 0.0
    """Random-action steps taken, and their rate, in shoal's make of the env."""
    episodes: int = 0
    """Episodes those steps ended."""
    step_failure: str | None = None
    """What the env raised on a random action, if it did (one that takes legal actions only, say)."""
    hindsight: str | None = None
    """For a goal env (a Dict of observation, achieved_goal and desired_goal): None where
    ``--her-goals`` can relabel its transitions, else why not; "" for any other env."""
    remote: list[str] = field(default_factory=list)
    """Env servers: what the protocol's checks found, one line each (a problem is in ``problem``)."""

    @property
    def ok(self) -> bool:
        return (self.problem is None and self.step_failure is None
                and any(reason is None for reason in self.algorithms.values()))


def check_env(env_id: str, env_kwargs: dict[str, Any] | None = None, seconds: float = 1.0,
              wrappers: tuple[tuple[str, dict[str, Any]], ...] = ()) -> EnvReport:
    """Check ``env_id`` (made with ``env_kwargs``, inside ``wrappers``: see EnvOptions) as
    :class:`EnvReport` says, stepping it with random actions for about ``seconds``. An env that
    cannot be made at all raises ShoalError."""
    from gymnasium.utils.env_checker import check_env as gymnasium_check

    check_env_id(env_id)
    report = EnvReport(env_id)
    # shoal's make of it; its own error for an env that cannot be made
    env = make_env(env_id, kwargs=env_kwargs, options=EnvOptions(wrappers=wrappers))
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            raw = gym.make(env_id, disable_env_checker=True, **(env_kwargs or {}))
            try:  # the env as the user's wrappers give it to shoal, or as its own code does
                gymnasium_check(wrap(raw, wrappers) if wrappers else raw.unwrapped, skip_render_check=True)
            except Exception as e:  # the env's own code, or the checker's assertion about it
                report.problem = error_line(e)
            finally:
                raw.close()
        report.warnings = list(dict.fromkeys(_ANSI.sub("", str(w.message)).removeprefix("WARN: ") for w in said
                                             if not (wrappers and "different from the unwrapped" in str(w.message))))
        report.spaces = (env.observation_space, env.action_space)
        _algorithms(report)
        report.hindsight = _hindsight(env)
        if report.problem is None:
            _time_random_steps(report, env, seconds)
    finally:
        env.close()
    return report


def _algorithms(report: EnvReport) -> None:
    """Which algorithms take ``report.spaces``, and why the others do not."""
    from shoal.algos import ALGOS

    for name in sorted(ALGOS):
        spec = ALGOS[name]
        try:
            spec.make_policy(spec.config_cls(), *report.spaces)
            report.algorithms[name] = None
        except ShoalError as e:
            report.algorithms[name] = str(e)


def check_remote_env(url: str, seconds: float = 1.0) -> EnvReport:
    """Check the env servers of a ``remote://`` URL as a run's runners use them: the spaces their
    sessions describe (and the algorithms that take them); every reply to Reset and Step against
    ``proto/shoal.proto`` (RemoteVectorEnv's checks: an array per env, of the described shape,
    numbers or bools as the protocol has them); two resets with the same seed; actions of the
    wrong shape and outside the action space, which must be refused with INVALID_ARGUMENT while
    the session goes on; and the step rate over the wire with random actions for ``seconds``. A
    server that cannot be reached, or whose spaces make no sense, raises ShoalError."""
    from shoal.remote.client import RemoteVectorEnv

    report = EnvReport(url)
    env = RemoteVectorEnv(url, reconnect_s=0.0)
    try:
        report.spaces = (env.single_observation_space, env.single_action_space)
        _algorithms(report)
        report.hindsight = ""
        per_server = ", ".join(f"{n} on {a}" for n, a in zip(env.sizes, env.addresses))
        report.remote.append(f"sessions: {env.num_envs} envs ({per_server})")
        try:
            first, again = env.reset(seed=0)[0], env.reset(seed=0)[0]
            report.remote.append("two resets with seed 0: the same observations" if np.array_equal(first, again) else
                                 "two resets with seed 0: different observations (runs on it cannot be repeated)")
            for what, actions in _bad_actions(env.single_action_space, env.sizes[0]):
                if report.problem is None:
                    _expect_refusal(report, env, what, actions)
            if report.problem is None:
                _time_random_vector_steps(report, env, seconds)
        except ShoalError as e:
            report.problem = str(e)
    finally:
        env.close()
    return report


def _bad_actions(space: gym.Space, n: int) -> list[tuple[str, np.ndarray]]:
    """Actions an env server must refuse for a session of ``n`` envs: a row too many, and (where
    the space has bounds) a value outside them."""
    sample = np.stack([space.sample() for _ in range(n)])
    bad = [("a row more than its envs", np.concatenate([sample, sample[:1]]))]
    beyond = sample.copy()
    if isinstance(space, gym.spaces.Box) and np.isfinite(space.high.flat[0]):
        beyond.reshape(n, -1)[0, 0] = space.high.flat[0] + 1
    elif isinstance(space, gym.spaces.Discrete):
        beyond[0] = space.start + space.n
    elif isinstance(space, gym.spaces.MultiDiscrete):
        beyond.reshape(n, -1)[0, 0] = space.start.flat[0] + space.nvec.flat[0]
    elif isinstance(space, gym.spaces.MultiBinary):
        beyond.reshape(n, -1)[0, 0] = 2
    else:
        return bad
    return [*bad, ("a value outside the action space", beyond)]


def _expect_refusal(report: EnvReport, env: Any, what: str, actions: np.ndarray) -> None:
    """Send ``actions`` to the first server's session: it must answer INVALID_ARGUMENT and go on."""
    import grpc

    from shoal.remote import shoal_pb2 as pb
    from shoal.remote.wire import encode

    conn, session = env.conns[0], env.sessions[0]
    try:
        conn("Step", pb.StepRequest(session=session, actions=encode(actions)))
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
            report.problem = (f"env server {conn.address} answered actions with {what} with {e.code().name}, not "
                              f"INVALID_ARGUMENT: {e.details()}")
            return
        env.step(env.action_space.sample())  # the session goes on (a ShoalError says why not)
        report.remote.append(f"actions with {what}: refused with INVALID_ARGUMENT, and the session went on")
        return
    report.problem = (f"env server {conn.address} stepped actions with {what} ({actions.shape} {actions.dtype}), "
                      f"where it must refuse them with INVALID_ARGUMENT")


def _time_random_vector_steps(report: EnvReport, env: Any, seconds: float) -> None:
    """Random actions over the wire for ``seconds``: env steps per second, all servers together."""
    env.action_space.seed(0)
    env.reset(seed=0)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        report.steps += env.num_envs
        report.episodes += int(np.sum(terminated | truncated))
    report.steps_per_s = report.steps / (time.perf_counter() - start)


def _hindsight(env: gym.Env) -> str | None:
    """Whether --her-goals takes ``env`` (see :attr:`EnvReport.hindsight`)."""
    from shoal.hindsight import Hindsight, goal_layout, own_space

    try:
        if goal_layout(own_space(env)) is None:
            return ""
        Hindsight.for_env(env, k=4, strategy="future", gamma=0.99)
        return None
    except ShoalError as e:
        return str(e)


def _time_random_steps(report: EnvReport, env: gym.Env, seconds: float) -> None:
    """Random actions in shoal's make of the env for ``seconds``: its raw step rate, the ceiling
    of what one runner's copy of it can sample."""
    env.action_space.seed(0)
    start = time.perf_counter()
    try:
        env.reset(seed=0)
        while time.perf_counter() - start < seconds:
            for _ in range(100):
                _, _, terminated, truncated, _ = env.step(env.action_space.sample())
                report.steps += 1
                if terminated or truncated:
                    report.episodes += 1
                    env.reset()
    except Exception as e:  # the env's own code
        report.step_failure = error_line(e)
    report.steps_per_s = report.steps / (time.perf_counter() - start)
