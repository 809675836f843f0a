"""Where long work runs: this process, local worker processes, or a Dask distributed cluster.

`--cluster local[:N]` (the default, N = 1) or `--cluster tcp://host:8786` (a running Dask
scheduler). The work of a long command is cut into shards (calibration samples, evaluation
samples, sweep points), each a call `function(shared, shard)` whose result is exact, so that
merging the shards' results gives what one process gives, byte for byte.

- `local:1` calls the function here, in order: no processes, no Dask.
- `local:N` runs it in N spawned processes (`concurrent.futures.ProcessPoolExecutor`, one
  onnxruntime thread each); `shared` is sent once per process. A process that dies fails the
  run with a message (the standard library has no retry; a cluster does).
- an address connects a `distributed.Client`; `shared` is scattered once to every worker, and
  a worker lost in the middle of a shard costs only that shard, which the scheduler runs again
  elsewhere. Every worker must import the same ember: checked on connect, named if not.

Workers keep what a shard's setup built (an onnxruntime session, a quantized graph) for the
shards that follow, keyed by the shared object's `token` (`cached`).

Ctrl-C (KeyboardInterrupt) cancels what is queued or running and re-raises; commands write
their outputs only once every shard is in, so nothing partial is left.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import multiprocessing
import re
import signal
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ember.errors import EmberError

# How long connecting to a scheduler (and waiting for its first worker) may take.
CONNECT_SECONDS = 10.0
_ADDRESS = re.compile(r"^(tcp|tls|inproc|ucx|ws|wss)://\S+$")
_LOCAL = re.compile(r"^local(?::(\d+))?$")
_PACKAGES = ("ember", "profiler", "quantizer", "compiler", "simulator")
CLUSTER_HELP = ("Where the work runs: local (this process), local:N (N worker processes, one "
                "onnxruntime thread each), or the address of a running Dask scheduler, "
                "tcp://host:8786 (its workers need this ember installed and the data at the same "
                "path). The result is identical wherever it runs.")


@dataclass(frozen=True)
class Where:
    """A parsed --cluster: local processes (`address` None) or a Dask scheduler's address."""

    address: str | None = None
    processes: int = 1

    def __str__(self) -> str:
        return self.address or ("local" if self.processes == 1 else f"local:{self.processes}")


def parse(text: str) -> Where:
    """`local`, `local:N` or a scheduler address; anything else is an error that says so."""
    text = text.strip()
    if (local := _LOCAL.match(text)) is not None:
        count = int(local.group(1) or 1)
        if count < 1:
            raise EmberError(f"--cluster {text}: expected at least one process (local:1)")
        return Where(None, count)
    if _ADDRESS.match(text):
        return Where(text, 0)
    raise EmberError(f"--cluster {text}: expected local, local:N or a Dask scheduler address "
                     f"such as tcp://host:8786")


@dataclass(frozen=True)
class Shared:
    """What every shard of one run needs, sent once per worker; `token` names it in caches."""

    payload: Any
    token: str = field(default_factory=lambda: uuid.uuid4().hex)


_cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
_CACHE_ENTRIES = 4


def cached(shared: Shared, what: str, build: Callable[[], Any]) -> Any:
    """`build()` once per worker process and run (`shared.token`), for every shard after."""
    key = (shared.token, what)
    if key not in _cache:
        _cache[key] = build()
        while len(_cache) > _CACHE_ENTRIES:
            _cache.popitem(last=False)
    _cache.move_to_end(key)
    return _cache[key]


@lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of ember's own sources: two installs that differ in any line differ here
    (the package version alone does not change between commits)."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def worker_identity() -> dict:
    """What a worker reports on connect: its ember's code digest and where it lives."""
    return {"code": code_digest(), "path": str(Path(__file__).resolve().parent.parent)}


class Cluster:
    """A context manager that runs shards where `--cluster` says (see the module docstring)."""

    def __init__(self, where: Where | str = Where()):
        self.where = parse(where) if isinstance(where, str) else where
        self._client = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._pool_shared: Shared | None = None  # what the pool's processes were started with

    def __enter__(self) -> Cluster:
        if self.where.address is not None:
            self._client = _connect(self.where.address)
        return self

    def __exit__(self, *exc) -> None:
        self._stop_pool(exc[0] is not None)
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def workers(self) -> int:
        """How many shards can run at once: local processes, or the cluster's worker threads."""
        if self._client is None:
            return self.where.processes
        info = self._client.scheduler_info(n_workers=-1)["workers"]
        return max(1, sum(w.get("nthreads", 1) for w in info.values()))

    def run(self, function: Callable[[Shared, Any], Any], shared: Shared,
            shards: Iterable[Any], in_flight: int | None = None) -> Iterator[tuple[int, Any]]:
        """(index, result) of each shard as it finishes (in order on `local:1`). `shards` is
        drawn lazily, at most `in_flight` (default: twice the workers) ahead, so a generator
        may decide from results already seen whether more shards are needed."""
        if self._client is None and self.where.processes == 1:
            for index, shard in enumerate(shards):
                yield index, function(shared, shard)
            return
        in_flight = in_flight or 2 * self.workers
        submit = self._dask_submitter(function, shared) if self._client is not None else \
            self._local_submitter(function, shared)
        pending: dict[Any, int] = {}
        finished = self._finished()
        source = enumerate(shards)
        try:
            exhausted = False
            while True:
                while not exhausted and len(pending) < in_flight:
                    item = next(source, None)
                    if item is None:
                        exhausted = True
                        break
                    future = submit(item[1])
                    pending[future] = item[0]
                    finished.add(future)
                if not pending:
                    return
                future = finished.next()
                index = pending.pop(future)
                yield index, self._result(future)
        except BaseException:
            self._cancel(pending)
            raise

    def _local_submitter(self, function, shared):
        if self._pool_shared is not shared:  # processes start with the shared object
            self._stop_pool(False)
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.where.processes, mp_context=multiprocessing.get_context("spawn"),
                initializer=_local_start, initargs=(shared,))
            self._pool_shared = shared
        return lambda shard: self._pool.submit(_local_call, function, shard)

    def _stop_pool(self, failed: bool) -> None:
        if self._pool is None:
            return
        processes = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=not failed, cancel_futures=True)
        if failed:  # Ctrl-C or a failed shard: stop what is still running, now
            for process in processes:
                if process.is_alive():
                    process.terminate()
        self._pool = self._pool_shared = None

    def _dask_submitter(self, function, shared):
        scattered = self._client.scatter(shared, broadcast=True, hash=False)
        return lambda shard: self._client.submit(function, scattered, shard, pure=False)

    def _finished(self):
        """Futures in the order they finish: `add(future)`, then `next()` waits for one."""
        if self._client is not None:
            from distributed import as_completed
            return _DaskFinished(as_completed(loop=self._client.loop, raise_errors=False))
        return _LocalFinished()

    def _result(self, future):
        try:
            return future.result()
        except concurrent.futures.process.BrokenProcessPool:
            raise EmberError(f"--cluster {self.where}: a worker process died (killed, or out "
                             f"of memory); rerun, or use fewer processes") from None

    def _cancel(self, pending: dict) -> None:
        if self._client is not None:
            self._client.cancel(list(pending), force=True)
        else:
            for future in pending:
                future.cancel()


class _DaskFinished:
    def __init__(self, completed):
        self._completed = completed

    def add(self, future) -> None:
        self._completed.add(future)

    def next(self):
        return next(self._completed)


class _LocalFinished:
    def __init__(self):
        self._waiting: set = set()

    def add(self, future) -> None:
        self._waiting.add(future)

    def next(self):
        done, _ = concurrent.futures.wait(self._waiting,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        future = next(iter(done))
        self._waiting.discard(future)
        return future


# The local pool's shared object, set once in each worker process by its initializer.
_local_shared: Shared | None = None


def _local_start(shared: Shared) -> None:
    global _local_shared
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _local_shared = shared


def _local_call(function, shard):
    return function(_local_shared, shard)


def _connect(address: str):
    """A Client of the scheduler at `address`, with at least one worker that runs this ember."""
    try:
        from distributed import Client
    except ImportError:
        raise EmberError(f"--cluster {address}: Dask distributed is not installed "
                         f"(pip install 'dask[distributed]')") from None
    try:
        client = Client(address, timeout=CONNECT_SECONDS, set_as_default=False)
    except (OSError, TimeoutError) as err:
        raise EmberError(f"--cluster {address}: cannot reach a Dask scheduler there within "
                         f"{CONNECT_SECONDS:g} s ({_first_line(err)})") from None
    try:
        client.wait_for_workers(1, timeout=CONNECT_SECONDS)
    except (OSError, TimeoutError):
        client.close()
        raise EmberError(f"--cluster {address}: the scheduler has no workers (waited "
                         f"{CONNECT_SECONDS:g} s); start some with `dask worker {address}`"
                         ) from None
    mine = code_digest()
    reports = client.run(worker_identity, on_error="return")
    for worker, report in sorted(reports.items()):
        if isinstance(report, BaseException):
            client.close()
            raise EmberError(f"--cluster {address}: worker {worker} cannot run ember "
                             f"({_first_line(report)}); install this ember there "
                             f"(pip install -e .)")
        if report["code"] != mine:
            client.close()
            raise EmberError(f"--cluster {address}: worker {worker} runs another ember (code "
                             f"{report['code']} at {report['path']}; this one is {mine}); "
                             f"install the same version on every worker")
    return client


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
