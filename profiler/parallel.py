"""Profiling shards in worker processes: one onnxruntime session and one thread each.

The main process reads and checks the data and hands batches out through a bounded queue, so
memory stays constant; each worker returns its statistics, which merge exactly. Workers are
spawned, not forked (onnxruntime's and rich's threads do not survive a fork), so a script
that calls the API with workers > 1 needs the usual `if __name__ == "__main__":` guard.

Ctrl-C is the main process's to handle: workers start with SIGINT ignored (a terminal sends it to
the whole process group), and on any failure the main process terminates them and drops what is
still queued for them, so the interrupt ends the run at once instead of waiting on dead workers.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import signal
import threading
from typing import Callable, Iterable, Iterator

import numpy as np

from profiler.errors import ProfileError
from profiler.format import TensorStats, merge_stats
from profiler.session import Plan, Runner, log_severity, make_session, set_log_severity

_POLL_SECONDS = 0.1
_JOIN_SECONDS = 2.0


def run_parallel(model_bytes: bytes, plan: Plan, batches: Iterable[dict[str, np.ndarray]],
                 workers: int, on_batch: Callable[[int], None]) -> list[dict[str, TensorStats]]:
    """Statistics of each worker; `on_batch(n)` is called as workers finish batches."""
    context = multiprocessing.get_context("spawn")
    setups = context.Queue()
    tasks = context.Queue(maxsize=2 * workers)
    results = context.Queue()
    processes = [context.Process(target=_work, args=(setups, tasks, results), daemon=True)
                 for _ in range(workers)]
    # The model goes through a queue, not the arguments: a start that hands over megabytes
    # waits for the worker to import everything, and SIGINT is ignored meanwhile.
    with _sigint_ignored():
        for process in processes:
            process.start()
    done: list[dict[str, TensorStats]] = []
    try:
        for _ in processes:
            setups.put((model_bytes, plan, log_severity()))
        for batch in batches:
            _put(tasks, batch, results, processes, done, on_batch)
        for _ in processes:
            _put(tasks, None, results, processes, done, on_batch)
        while len(done) < workers:
            _receive(results, processes, done, on_batch)
    except BaseException:
        # Batches still buffered for workers that will never read them would otherwise make the
        # exit wait forever on the queue's feeder thread.
        setups.cancel_join_thread()
        tasks.cancel_join_thread()
        raise
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join(_JOIN_SECONDS)
    return done


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Processes started inside inherit SIGINT ignored, from their first import on."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may change handlers, and only it receives SIGINT anyway
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _put(tasks, item, results, processes, done, on_batch) -> None:
    while True:
        try:
            tasks.put(item, timeout=_POLL_SECONDS)
            return
        except queue.Full:
            _receive(results, processes, done, on_batch)


def _receive(results, processes, done, on_batch) -> None:
    """Handle one message if one comes; fail if a worker died without saying why."""
    try:
        kind, payload = results.get(timeout=_POLL_SECONDS)
    except queue.Empty:
        dead = [p for p in processes if p.exitcode not in (None, 0)]
        if dead:
            raise ProfileError(f"a profiling worker died (exit code {dead[0].exitcode})")
        return
    if kind == "error":
        raise ProfileError(payload)
    if kind == "batch":
        on_batch(payload)
    else:
        done.append(payload)


def _work(setups, tasks, results) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides; see the docstring
    try:
        model_bytes, plan, severity = setups.get()
        set_log_severity(severity)
        runner = Runner(make_session(model_bytes, threads=1), plan)
        while (batch := tasks.get()) is not None:
            runner.run(batch)
            results.put(("batch", len(next(iter(batch.values())))))
        results.put(("done", runner.stats()))
    except ProfileError as err:
        results.put(("error", str(err)))
    except Exception as err:  # reported to the main process, which decides the exit code
        results.put(("error", f"profiling worker failed: {type(err).__name__}: {err}"))


def merge_workers(shards: list[dict[str, TensorStats]]) -> dict[str, TensorStats]:
    merged: dict[str, TensorStats] = {}
    for shard in shards:
        for name, stats in shard.items():
            merged[name] = merge_stats(merged[name], stats) if name in merged else stats
    return merged
