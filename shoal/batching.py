"""``@shoal.batched``: turn a function of a list of requests into a batched service.

    class Model:
        @shoal.batched(max_batch=64, max_wait_ms=2)
        def infer(self, requests: list[np.ndarray]) -> list[np.ndarray]:
            ...  # one forward pass for all of them

    model.infer(obs)  # from many threads at once: each call waits for its own result
    await Model.infer.acall(model, obs)  # from coroutines, on any number of event loops

Callers from any number of threads each pass one request; a worker thread per instance takes
the first waiting request, gathers more for at most ``max_wait_ms`` (or until ``max_batch``),
calls the function once with the list, and hands each caller its result. The worker wakes for
the first request and for a full batch, not for every request: each wake-up hands the GIL
from the callers' thread to the worker's (with 32 clients, waking per request cost the policy
server ~5% of its throughput; BENCHMARKS.md). An exception in
the function is raised in every caller of that batch; the service goes on with the next.
Coroutines' results go back to their event loop in one wake-up per batch, not one per request.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Callable


class Batcher:
    """The queue and worker thread behind one batched function of one instance."""

    def __init__(self, fn: Callable[[list[Any]], list[Any]], max_batch: int, max_wait_ms: float):
        self.fn, self.max_batch, self.max_wait_s = fn, max_batch, max_wait_ms / 1000.0
        self.requests: queue.SimpleQueue[tuple[Any, Future | asyncio.Future]] = queue.SimpleQueue()
        self.full = threading.Event()  # set when the requests waiting fill a batch with the worker's first
        self.sizes: list[int] = []  # batch sizes served, for metrics (bounded)
        self.worker = threading.Thread(target=self._run, daemon=True, name="shoal-batcher")
        self.worker.start()

    def __call__(self, request: Any, timeout: float | None = None) -> Any:
        done: Future = Future()
        self._put(request, done)
        return done.result(timeout)

    async def acall(self, request: Any) -> Any:
        """As a call, from a coroutine: waits without holding a thread."""
        done = asyncio.get_running_loop().create_future()
        self._put(request, done)
        return await done

    def _put(self, request: Any, done: Future | asyncio.Future) -> None:
        self.requests.put((request, done))
        if self.requests.qsize() >= self.max_batch - 1:
            self.full.set()

    def _run(self) -> None:
        while True:
            batch = [self.requests.get()]  # wakes for the first request
            self.full.clear()  # then for a full batch (_put sets it), or at the deadline
            if self.requests.qsize() < self.max_batch - 1:
                self.full.wait(self.max_wait_s)
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.requests.get_nowait())
                except queue.Empty:
                    break
            self._serve(batch)

    def _serve(self, batch: list[tuple[Any, Future | asyncio.Future]]) -> None:
        if len(self.sizes) < 100_000:
            self.sizes.append(len(batch))
        try:
            results = self.fn([request for request, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batched function returned {len(results)} results for {len(batch)} requests")
            outcomes = [(done, result, None) for (_, done), result in zip(batch, results)]
        except BaseException as e:  # every caller of this batch learns of it; the service goes on
            outcomes = [(done, None, e) for _, done in batch]
        # Threads' futures are settled here; coroutines' on their own loop, one wake-up per loop.
        loops: dict[asyncio.AbstractEventLoop | None, list[tuple[Any, Any, BaseException | None]]] = {}
        for outcome in outcomes:
            loops.setdefault(None if isinstance(outcome[0], Future) else outcome[0].get_loop(), []).append(outcome)
        for loop, settled in loops.items():
            if loop is None:
                _settle(settled)
                continue
            try:
                loop.call_soon_threadsafe(_settle, settled)
            except RuntimeError:
                pass  # that loop has closed: nobody waits for these results


def _settle(outcomes: list[tuple[Any, Any, BaseException | None]]) -> None:
    """Give callers their results (a caller that gave up is skipped); coroutines' futures only
    from their own event loop."""
    for done, result, error in outcomes:
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(result)


def batched(max_batch: int = 64, max_wait_ms: float = 2.0) -> Callable[[Callable], Callable]:
    """Decorate ``fn(self, requests: list) -> list`` (or a plain ``fn(requests)``) so that callers
    pass one request and get one result, while ``fn`` sees them in batches."""
    if max_batch < 1 or max_wait_ms < 0:
        raise ValueError("max_batch must be >= 1 and max_wait_ms >= 0")

    def decorate(fn: Callable) -> Callable:
        per_instance: weakref.WeakKeyDictionary[Any, Batcher] = weakref.WeakKeyDictionary()
        lock = threading.Lock()
        plain: list[Batcher] = []

        def batcher_for(args: tuple[Any, ...]) -> tuple[Batcher, Any]:
            if len(args) == 1:  # a plain function: one batcher for all callers
                with lock:
                    if not plain:
                        plain.append(Batcher(fn, max_batch, max_wait_ms))
                return plain[0], args[0]
            owner, request = args
            with lock:
                batcher = per_instance.get(owner)
                if batcher is None:
                    batcher = per_instance[owner] = Batcher(functools.partial(fn, owner), max_batch, max_wait_ms)
            return batcher, request

        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            batcher, request = batcher_for(args)
            return batcher(request)

        async def acall(*args: Any) -> Any:
            """As a call, from a coroutine."""
            batcher, request = batcher_for(args)
            return await batcher.acall(request)

        call.acall = acall  # type: ignore[attr-defined]
        call.plain = plain  # type: ignore[attr-defined]  (a plain function's batcher, for metrics and tests)
        return call

    return decorate
