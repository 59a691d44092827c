"""Placement: the only module that knows about Ray.

A backend creates roles and returns handles with one method, ``call(method, *args)``, which
returns a future; ``backend.get(futures)`` waits for them. Locally a call runs at once and its
future is the value; on Ray it is an actor method call and its future an ObjectRef, and
futures passed as arguments travel runner -> learner without passing through the driver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from shoal.errors import Diverged, RoleFailed, SharedObjectLost, ShoalError
from shoal.weights import WeightStore


class LocalHandle:
    """A role living in this process."""

    def __init__(self, obj: Any):
        self.obj = obj

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` now; the 'future' is its result."""
        return getattr(self.obj, method)(*args, **kwargs)

    @staticmethod
    def resolve(future: Any) -> Any:
        """The value of a future from ``call`` (already computed)."""
        return future

    def call_checked(self, method: str, *args: Any) -> tuple[Any, Any]:
        """(status, result) of a method returning that pair; if it raises, the status is a Failure."""
        try:
            return getattr(self.obj, method)(*args)
        except Diverged:
            raise  # the learner's weights are at fault, not this role: no restart would help
        except Exception as e:
            from shoal.envs import error_line

            return Failure(str(e) if isinstance(e, ShoalError) else error_line(e)), None


class Failure(str):
    """The reason a role's call failed (a string), as the local backend reports it."""


class LocalBackend:
    """Every role a plain object in the driver's process: deterministic, debuggable, no Ray."""

    name = "local"

    def __init__(self, config: Any):
        self.config = config

    def make(self, cls: type, *args: Any, name: str, num_cpus: float = 0.0, concurrency: int = 1,
             num_gpus: float = 0.0, **kwargs: Any) -> LocalHandle:
        """Create a role."""
        return LocalHandle(cls(*args, **kwargs))

    def get(self, futures: Any) -> Any:
        """Results of futures (already computed)."""
        return futures

    def wait_any(self, futures: list[Any]) -> int:
        """Index of a finished future: in-process, every future is finished."""
        return 0

    def wait_for_runners(self, pings: list[Any]) -> None:
        """Wait for the runners' first replies (in-process they have replied)."""

    def collect(self, statuses: dict[int, Any], timeout_s: float) -> tuple[dict[int, Any], dict[int, str]]:
        """Split the statuses of ``call_checked`` calls into those that came back and those that failed."""
        failed = {i: str(s) for i, s in statuses.items() if isinstance(s, Failure)}
        return {i: s for i, s in statuses.items() if i not in failed}, failed

    def discard(self, result: Any) -> None:
        """Nothing to do: a failed call's result is None here."""

    def replace(self, old: LocalHandle, cls: type, *args: Any, name: str, num_cpus: float = 0.0,
                **kwargs: Any) -> LocalHandle:
        """A new role in place of a failed one."""
        close = getattr(getattr(old.obj, "env", None), "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                pass  # a broken role may not close cleanly; it is dropped either way
        return self.make(cls, *args, name=name, num_cpus=num_cpus, **kwargs)

    def weight_store(self) -> WeightStore:
        """A store the roles share by reference."""
        return WeightStore()

    def live_store(self) -> dict[str, Any] | None:
        """Where other processes can subscribe to the weight store (none: it lives in this process)."""
        return None

    def runner_cpus(self) -> float:
        """CPUs to reserve per runner (nothing to reserve in-process)."""
        return 0.0

    def learner_gpus(self) -> float:
        """GPUs to reserve for the learner (in-process it uses the device --device names)."""
        return 0.0

    def inference_gpus(self) -> float:
        """GPUs to reserve for each central inference server (none in-process)."""
        return 0.0

    def runner_gpus(self) -> float:
        """GPUs to reserve per runner (none in-process: they use the device --runner-device names)."""
        return 0.0

    def shutdown(self) -> None:
        """Nothing to release."""


class RayHandle:
    """A role living in a Ray actor."""

    def __init__(self, actor: Any):
        self.actor = actor

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on the actor; returns an ObjectRef."""
        return getattr(self.actor, method).remote(*args, **kwargs)

    def call_checked(self, method: str, *args: Any) -> tuple[Any, Any]:
        """Two ObjectRefs for a method returning (status, result): the driver reads the small
        status to learn whether the call worked, and hands the result on unread."""
        return getattr(self.actor, method).options(num_returns=2).remote(*args)

    @staticmethod
    def resolve(future: Any) -> Any:
        """Wait for an ObjectRef from ``call`` (roles use this to wait on each other)."""
        import ray

        return ray.get(future)


STORE_NAMESPACE = "shoal"

RUNNER_START_WARN_S = 10.0
"""Seconds the Ray backend waits for its runners to start before it says why they have not."""


class RayWeightStore:
    """Client of a WeightStore actor: weights go through the object store, published once.

    The actor holds ``[ObjectRef]`` (a list, so Ray does not resolve it), so each publish is one
    ``ray.put`` and every subscriber reads the same shared, zero-copy arrays.
    """

    def __init__(self, actor: Any):
        self.actor = actor

    def publish(self, policy_id: str, version: int, weights: Any) -> int:
        """Put the weights in the object store once and hand the store their reference."""
        import ray

        return ray.get(self.actor.publish.remote(policy_id, version, [ray.put(weights)]))

    def latest(self, policy_id: str, newer_than: int = -1) -> tuple[int, Any] | None:
        """The newest (version, weights) if newer than ``newer_than``; weights read zero-copy."""
        import ray

        got = ray.get(self.actor.latest.remote(policy_id, newer_than))
        return None if got is None else (got[0], ray.get(got[1][0]))

    def version(self, policy_id: str) -> int:
        """Newest version held (-1 if none)."""
        import ray

        return ray.get(self.actor.version.remote(policy_id))


class _RAY:
    """Ray in this process, shared by every RayBackend here (two Algorithms in one notebook or
    script): shut down when the last backend using the Ray shoal started stops, not the first."""

    started = False  # shoal called ray.init (a Ray the user started is theirs to shut down)
    users = 0  # RayBackends not yet shut down
    script_env: Any = None  # the EnvSpec of the script's env that shoal's last ray.init hands its workers


@contextlib.contextmanager
def _python_sigterm_kept() -> Iterator[None]:
    """Within (``ray.init``), Ray replaces the process's SIGTERM handling twice: in Python, with
    ``sys.exit(15)`` while it starts, and below Python, with a handler that prints a stack dump
    and then calls the one it displaced (at a run's start the default: the process dies,
    uncleaned). Where Python code handles SIGTERM (a run starting, which stops as at Ctrl-C and
    leaves no run directory behind), a SIGTERM that Ray's exit caught goes to that handler, and
    the handler is put back afterwards; a process with none keeps Ray's."""
    handler = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        yield
    except SystemExit as e:
        if callable(handler) and e.code == signal.SIGTERM:
            handler(signal.SIGTERM, None)  # Ctrl-C's KeyboardInterrupt at a run's start
        raise  # a handler that only notes the signal: ray.init was cut short all the same
    finally:
        if callable(handler):
            signal.signal(signal.SIGTERM, handler)


class RayBackend:
    """Every role a Ray actor. Starts a local cluster, or joins one with ``--address`` (or the
    ``RAY_ADDRESS`` a Ray Job's entrypoint is given)."""

    name = "ray"

    def __init__(self, config: Any):
        address = config.address or _job_address()
        if address is not None:
            _send_token_when_joining(address)  # before `import ray`, which reads the mode
        import ray

        self.config = config
        self.actors: list[Any] = []
        self.store_name: str | None = None  # the weight store's actor name, once made
        self.owns_ray = not ray.is_initialized()
        from shoal.envs import registered_here

        spec = registered_here(config.env)  # an env registered by the user's script: the workers need it too
        shoals_own = _RAY.started and spec == _RAY.script_env  # the Ray shoal started here, for this env
        if spec is not None and not self.owns_ray and not shoals_own:
            raise ShoalError(f"{config.env} is registered in this process only, and Ray was started without it "
                             "(Ray hands a script's env to its workers only as it starts): give the env as "
                             f"'MODULE:{config.env}', MODULE being the module that registers it")
        if self.owns_ray:
            _check_reachable(address)
            if address is None:
                # Ray's GCS keeps events of the last 100,000 tasks for its dashboard; a long run
                # makes millions, and that history alone grew ~9 MiB a minute here (MEASURED in
                # benchmarks/soak_faults.py). shoal starts no dashboard: keep 10,000.
                os.environ.setdefault("RAY_task_events_max_num_task_in_gcs", "10000")
                # Ray 2.60 turns token authentication on for every new local cluster and logs a
                # WARNING saying so each time; this cluster is the run's own, so keep it quiet.
                logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            try:
                # "local": always a new cluster when no address is given; a bare ray.init() would
                # join whatever cluster /tmp/ray/ray_current_cluster names, even a stale one.
                # Ray's hook runs in each worker before any role: it registers the script's env there.
                hook = {} if spec is None else {"runtime_env": {"worker_process_setup_hook": _registering(spec)}}
                with _python_sigterm_kept():
                    ray.init(address=address or "local", include_dashboard=False,
                             logging_level=logging.WARNING, log_to_driver=True, **hook)
                _RAY.script_env = spec
            except (ConnectionError, TimeoutError, RuntimeError, ValueError) as e:
                where = address or "a new local cluster"
                raise ShoalError(f"cannot start or reach Ray at {where}: {str(e).splitlines()[0]} "
                                 "(start one with `ray start --head`, or drop "
                                 f"{'--address' if config.address else 'RAY_ADDRESS'})") from None
        self.cpus = float(ray.cluster_resources().get("CPU", 0.0))
        self.gpus = float(ray.cluster_resources().get("GPU", 0.0))
        _RAY.started = _RAY.started or self.owns_ray
        _RAY.users += 1
        self.released = False

    def make(self, cls: type, *args: Any, name: str, num_cpus: float = 0.0, concurrency: int = 1,
             actor_name: str | None = None, num_gpus: float = 0.0, **kwargs: Any) -> RayHandle:
        """Create ``cls(*args, **kwargs)`` as an actor. Helpers take no CPU so they never wait for one.
        ``concurrency`` > 1 runs that many calls at once in threads (for batching services).
        ``actor_name`` registers it in namespace ``shoal`` for other processes to find."""
        import ray

        actor = ray.remote(cls).options(num_cpus=num_cpus, num_gpus=num_gpus, name=actor_name,
                                        namespace=STORE_NAMESPACE if actor_name else None,
                                        max_concurrency=concurrency).remote(*args, **kwargs)
        self.actors.append(actor)
        return RayHandle(actor)

    def get(self, futures: Any) -> Any:
        """Wait for ObjectRefs. A role that died or raised becomes :class:`RoleFailed`, with the
        error's last line (the run can be restarted from a checkpoint)."""
        import ray

        try:
            return ray.get(futures)
        except ray.exceptions.RayError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, ShoalError):  # a user-facing error raised inside a role
                raise type(cause)(str(cause)) from None
            _raise_if_shared_object_lost(e)
            lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            raise RoleFailed(f"{type(e).__name__}: {lines[-1][:300] if lines else e}") from e

    def wait_for_runners(self, pings: list[Any]) -> None:
        """Wait for the runners' first replies. A runner asking for more CPUs (or, on
        --runner-device cuda, more of a GPU) than are free waits, silently in Ray, until they free
        up (another run on the cluster, or another Algorithm in this process, holds them): say so
        once, then go on waiting, as a queued trial does."""
        import ray

        _, pending = ray.wait(pings, num_returns=len(pings), timeout=RUNNER_START_WARN_S)
        if pending:
            free = ray.available_resources()
            for key, ask, total, fewer in (("CPU", self.runner_cpus(), self.cpus, "fewer --num-env-runners"),
                                           ("GPU", self.runner_gpus(), self.gpus, "--runner-device cpu")):
                if ask > free.get(key, 0.0):
                    logging.getLogger("shoal").warning(
                        "%d of %d runners wait for %ss: each asks for %g, and the Ray cluster has %g of %g free "
                        "(another run, or another shoal Algorithm in this process, holds them); they start when "
                        "%ss free up, or stop this run and give it %s", len(pending), len(pings), key, ask,
                        free.get(key, 0.0), total, key, fewer)
        self.get(pings)

    def wait_any(self, futures: list[Any]) -> int:
        """Index of the first of ``futures`` to finish (ray.wait)."""
        import ray

        ready, _ = ray.wait(futures, num_returns=1)
        return futures.index(ready[0])

    def collect(self, statuses: dict[int, Any], timeout_s: float) -> tuple[dict[int, Any], dict[int, str]]:
        """Statuses that came back within ``timeout_s``, and why the others did not (the actor
        died, its call raised, or it hangs)."""
        import ray

        refs = list(statuses.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        ready_set = set(ready)
        ok, failed, errors = {}, {}, []
        for i, ref in statuses.items():
            if ref not in ready_set:
                failed[i] = f"no reply within {timeout_s:g} s"
                continue
            try:
                ok[i] = ray.get(ref)
            except (ray.exceptions.RayError, ShoalError) as e:
                errors.append(e)  # every error read before raising one: Ray logs those never read
                failed[i] = str(e).strip().splitlines()[-1].removeprefix("shoal.errors.ShoalError: ")[:600]
        for e in errors:
            _raise_if_shared_object_lost(e)
            if isinstance(getattr(e, "cause", None), Diverged):  # as on the local backend: no restart helps
                raise Diverged(str(e.cause)) from None
        return ok, failed

    def discard(self, result: Any) -> None:
        """Read the result ref of a failed ``call_checked`` call (its status said why), so that Ray
        does not log the same error again, with a traceback, as an error nobody read."""
        import ray

        try:
            ray.get(result, timeout=0)
        except Exception:
            pass  # the error its status reported, or a call still hanging (its actor is killed next)

    def replace(self, old: RayHandle, cls: type, *args: Any, name: str, num_cpus: float = 0.0,
                **kwargs: Any) -> RayHandle:
        """Kill a failed (or hung) actor and start a new one in its place."""
        import ray

        try:
            ray.kill(old.actor)
        except Exception:
            pass  # already dead
        if old.actor in self.actors:
            self.actors.remove(old.actor)
        return self.make(cls, *args, name=name, num_cpus=num_cpus, **kwargs)

    def weight_store(self) -> RayWeightStore:
        """A WeightStore actor and the client every role shares. It is a named actor (namespace
        ``shoal``), so that ``shoal serve-policy --follow`` in another process can subscribe."""
        import uuid

        self.store_name = f"weights-{uuid.uuid4().hex[:12]}"
        return RayWeightStore(self.make(WeightStore, name="weight-store", actor_name=self.store_name).actor)

    def live_store(self) -> dict[str, Any] | None:
        """The cluster's address and the store actor's name, for subscribers in other processes."""
        import ray

        if self.store_name is None:
            return None
        return {"address": ray.get_runtime_context().gcs_address, "namespace": STORE_NAMESPACE,
                "actor": self.store_name, "auth_mode": os.environ.get("RAY_AUTH_MODE")}

    def runner_cpus(self) -> float:
        """One CPU per runner where the cluster has them, else a fair share: an actor asking for
        more CPUs than exist would wait forever (MEASURED.md)."""
        return min(1.0, self.cpus / self.config.num_env_runners) if self.cpus else 0.0

    def _wants_gpu(self, flag: str, device: str) -> bool:
        """Whether a role on ``device`` (the value of ``flag``) needs a GPU of the cluster; a
        cluster without one is refused now, as an actor asking for it would wait forever."""
        if device == "auto":
            return self.gpus >= 1
        if device.startswith("cuda") and self.gpus < 1:
            raise ShoalError(f"{flag} {device}: the Ray cluster has no GPU (its resources: {self.cpus:g} CPUs); "
                             f"train with {flag} cpu, or join a cluster with one (--address)")
        return device.startswith("cuda")

    def learner_gpus(self) -> float:
        """One GPU for a learner on --device cuda (or auto, where the cluster has one), half of
        one where central inference servers or runners on --runner-device cuda share it (they
        take the other half): Ray then makes it the only GPU the learner's process sees."""
        if not self._wants_gpu("--device", self.config.device):
            return 0.0
        shared = self.config.inference == "central" or self._wants_gpu("--runner-device", self.config.runner_device)
        return 0.5 if shared else 1.0

    def inference_gpus(self) -> float:
        """Each central inference server's share of the half GPU the learner leaves (none where
        the learner takes none)."""
        central = self.config.inference == "central"
        return 0.5 / self.config.num_inference_servers if central and self.learner_gpus() else 0.0

    def runner_gpus(self) -> float:
        """Each runner's share of a GPU on --runner-device cuda: of the half the learner leaves, or
        of a whole one where the learner trains on the CPU."""
        if not self._wants_gpu("--runner-device", self.config.runner_device):
            return 0.0
        return (0.5 if self.learner_gpus() else 1.0) / self.config.num_env_runners

    def shutdown(self) -> None:
        """Stop our actors; stop Ray if shoal started it and no other backend here uses it."""
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:
                pass  # already gone
        self.actors.clear()
        if self.released:
            return
        self.released = True
        _RAY.users -= 1
        if _RAY.started and _RAY.users == 0:
            ray.shutdown()
            _RAY.started = False


def _raise_if_shared_object_lost(e: BaseException) -> None:
    """A role's call failed because an object it read (the published weights) died with its
    owner (the learner that put it): that is the owner's failure, not the caller's, and replacing
    the caller would only read the same lost object again."""
    import ray

    lost = ray.exceptions.ObjectLostError
    if isinstance(e, lost) or isinstance(getattr(e, "cause", None), lost):
        raise SharedObjectLost(f"{type(getattr(e, 'cause', None) or e).__name__}: an object the roles share was "
                               "lost with the role that owned it (the learner, for published weights)") from e


def _registering(spec: Any) -> Any:
    """A worker setup hook (Ray takes a named function, not a partial) that registers ``spec``.

    The spec's entry point, a class of the script, may derive from a module beside the script
    (``from my_base import Base``): Ray puts the script's directory on a worker's path only after
    its setup hook has run, and unpickling the hook would need that module. So the spec travels as
    bytes, and the hook puts the driver's directories on the path before it unpickles them."""
    from ray import cloudpickle

    blob = cloudpickle.dumps(spec)
    script = getattr(sys.modules.get("__main__"), "__file__", None)  # none in a notebook or `python -c`
    driver_paths = list(dict.fromkeys([os.path.dirname(os.path.abspath(script))] * bool(script) + [os.getcwd()]))

    def register_script_env() -> None:
        from shoal.envs import register_spec

        sys.path.extend(p for p in driver_paths if p not in sys.path)
        register_spec(cloudpickle.loads(blob))

    return register_script_env


def ray_destination(config: Any) -> str:
    """Where ``--backend ray`` will run ``config``'s roles, in words: the cluster this process
    already runs, the one ``--address`` (or a Ray Job's ``RAY_ADDRESS``) names, or a new local one."""
    ray = sys.modules.get("ray")  # not imported for this: `import ray` alone takes seconds
    if ray is not None and ray.is_initialized():
        return "the Ray cluster this process already runs"
    address = config.address or _job_address()
    return f"the Ray cluster at {address}" if address else "a new local Ray cluster"


def _job_address() -> str | None:
    """The cluster a Ray Job's entrypoint runs on: Ray sets ``RAY_ADDRESS`` to its GCS's host:port
    there (``ray job submit -- shoal train ... --backend ray``), and a bare ``ray.init()`` joins
    it. An http(s):// one names a dashboard, for the ``ray job`` commands, not a cluster to join."""
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if not address or address == "local" or address.startswith(("http://", "https://")):
        return None
    return address


def _check_reachable(address: str | None) -> None:
    """Fail in seconds, not minutes, when a host:port address does not answer, or answers as
    something other than a Ray head node's GCS (the dashboard's port, say): ``ray.init`` keeps
    retrying either for minutes, printing Ray's C++ warnings, before giving up."""
    import socket

    if not address or address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ShoalError(f"a Ray address (--address, RAY_ADDRESS) must be 'auto' or host:port, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        raise ShoalError(f"cannot reach a Ray cluster at {address}: {e.strerror or e} "
                         "(is `ray start --head` running there?)") from None
    if os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "false", ""):
        return  # a TLS cluster's GCS takes no plaintext call; ray.init has the certificates
    import grpc

    # The GCS's own gRPC method that ray.init calls first, with an empty request: a head node
    # answers it, or refuses it for want of the cluster's token (ray.init sends that).
    with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as channel:  # direct, as Ray's
        call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")
        try:
            call(b"", timeout=3)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAUTHENTICATED:
                # gRPC's "failed to connect ...; last error: ...: ipv4:HOST:PORT: what" -> what
                detail = (e.details() or "-").splitlines()[0].rpartition(f":{port}: ")[2]
                raise ShoalError(f"{address} answers, but not as a Ray cluster ({e.code().name}: {detail}); "
                                 "give the head node's GCS port, 6379 unless `ray start --port` chose "
                                 "another (8265 is the dashboard's)") from None


def _send_token_when_joining(address: str | None) -> None:
    """Ray 2.60's `ray start --head` enables token authentication, but a driver that joins by
    address leaves it off unless told, and is then refused. Send the token when one is at hand
    (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); RAY_AUTH_MODE, if set, wins.
    Ray reads the mode when it is imported: a program that imported ray before must set it."""
    import os
    from pathlib import Path

    if address is None or "RAY_AUTH_MODE" in os.environ:
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or \
            (Path.home() / ".ray" / "auth_token").is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


def make_backend(config: Any) -> LocalBackend | RayBackend:
    """The backend ``config.backend`` names."""
    return {"local": LocalBackend, "ray": RayBackend}[config.backend](config)
