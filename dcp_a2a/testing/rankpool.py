"""A reusable pool of ranks: spawned processes that hold a real ``torch.distributed`` group.

Starting a process group is the expensive part of a multi-process test (spawning a 4-rank gloo
group costs seconds: every rank imports torch and Triton), so :class:`RankPool` starts the ranks
once and runs many small *tasks* on them::

    pool = RankPool(4, subgroup_sizes=(2, 3))       # WORLD of 4, plus groups of ranks {0,1}, {0,1,2}
    results = pool.run(task, shared_arg, per_rank=[(x0,), (x1,), (x2,), (x3,)])
    results = pool.run(task, n=2)                    # only ranks 0 and 1, on their 2-rank group

A task is a picklable module-level function ``task(ctx, *args, *per_rank[r])`` where ``ctx`` is
the rank's :class:`RankContext`; its return value (any picklable object, tensors included) comes
back per rank. Arguments and results travel through a pipe with plain pickle (tensors are
copied, never shared), so a task can neither alias the caller's memory nor leak shared segments.

Faults never hang the caller:
  * a task that raises on any rank -> :class:`RankFailure` carrying every failed rank's formatted
    traceback, after a short grace period for the other ranks to report;
  * a rank that does not answer within the task timeout (stuck in a collective, a deadlock, an
    endless loop) -> :class:`RankTimeout` with the Python stack of every silent rank (dumped by
    ``faulthandler`` on SIGUSR1, so it works while the rank is blocked inside gloo/NCCL);
  * a rank that dies (segfault, ``os._exit``) -> :class:`RankFailure` with its exit code.
In every case the pool is torn down (all ranks killed: a half-finished collective leaves the
group unusable) and the next :meth:`RankPool.run` starts a fresh one. The process group's own
timeout (``pg_timeout``) turns a collective that a peer never joins into an exception on the
waiting rank; the parent's watchdog (``task_timeout``) is the backstop for everything else.

No rank outlives its parent: :meth:`RankPool.close` ends them, an ``atexit`` hook closes every
pool still open, the ranks are daemonic, and each rank exits on its own when its parent process
disappears (a SIGKILLed test runner included).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
import weakref
from datetime import timedelta
from multiprocessing.connection import wait as _wait_any
from typing import Any, Callable, Sequence

from .devices import gpu_count, rank_device
from .rankworker import RankContext, run_rank

__all__ = ["PoolError", "RankContext", "RankFailure", "RankPool", "RankTimeout",
           "cpu_rank_environment", "fork_server_context", "gpu_count", "rank_device"]


class PoolError(RuntimeError):
    """A task failed on the pool; the pool has been torn down and restarts on the next run.

    ``tracebacks`` maps each failed rank to its formatted traceback (or a description of how
    it died); ``silent`` lists ranks that never answered; ``stacks`` maps those to their Python
    stack at the time the watchdog gave up (empty when unavailable)."""

    def __init__(self, message: str, *, tracebacks=None, silent=(), stacks=None, elapsed=0.0):
        super().__init__(message)
        self.tracebacks: dict[int, str] = dict(tracebacks or {})
        self.silent: tuple[int, ...] = tuple(silent)
        self.stacks: dict[int, str] = dict(stacks or {})
        self.elapsed = elapsed


class RankFailure(PoolError):
    """At least one rank raised (or died) while running the task."""


class RankTimeout(PoolError):
    """No rank raised, but at least one did not answer within the task timeout."""


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live (non-zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


# --------------------------------------------------------------------------- the parent side
_OPEN_POOLS: "weakref.WeakSet[RankPool]" = weakref.WeakSet()


@atexit.register
def _close_all_pools() -> None:
    for pool in list(_OPEN_POOLS):
        pool.close()


def _describe_exit(code) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@contextlib.contextmanager
def cpu_rank_environment():
    """Start CPU (gloo) ranks under this: their tensors live on the CPU, so their Triton must be
    the interpreter even on a machine with a GPU. The fork server is started by the first
    Process.start() and captures os.environ then (and imports dcp_a2a in it), so the variable
    must be set in the parent for that moment."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


# What the fork server imports before it forks anything. It is one server per process, started
# by the first forkserver Process.start(), so this list is the union of what every pool asked for
# until then; a module added after the server started is imported by each rank on first use.
_FORKSERVER_PRELOAD: list[str] = ["torch", "torch.distributed", "dcp_a2a.testing.rankpool"]


def _mp_context(method: str, preload: Sequence[str] = ()):
    import torch.multiprocessing as mp

    ctx = mp.get_context(method)
    if method == "forkserver":
        # The fork server imports torch, Triton and dcp_a2a once; every rank after that is a
        # fork of it (a clean, single-threaded process, like spawn) that starts in a fraction
        # of a second instead of re-importing torch (~3 s of CPU per rank).
        _FORKSERVER_PRELOAD.extend(m for m in preload if m not in _FORKSERVER_PRELOAD)
        ctx.set_forkserver_preload(list(_FORKSERVER_PRELOAD))
    return ctx


def fork_server_context(preload: Sequence[str] = ()):
    """The multiprocessing context of the pools' fork server, started now if it is not running
    (with the CPU-rank environment, see :func:`cpu_rank_environment`, and ``preload`` added to
    what it imports). For helper processes that need torch without paying its import: a
    ``Process`` of this context is a fork of the server. The server is shared with every
    :class:`RankPool` of this process (gloo pools fork their ranks from it)."""
    from multiprocessing import forkserver

    ctx = _mp_context("forkserver", preload)
    with cpu_rank_environment():
        forkserver.ensure_running()
    return ctx


class RankPool:
    """``world_size`` spawned ranks in one ``torch.distributed`` group, reused across tasks.

    backend         "gloo" or "nccl" (rank r on cuda:r; needs a GPU per rank)
    device          where the ranks compute: "cuda" (rank r on cuda:(r % GPUs), compiled Triton;
                    several gloo ranks may share a GPU), "cpu" (Triton's interpreter), or None:
                    "cuda" on a machine with a GPU (always for nccl), else "cpu"
    subgroup_sizes  also build groups of ranks 0..n-1 for each n (tasks pick one with ``n=``)
    pg_timeout      the process group's timeout: a collective a peer never joins raises after it
    task_timeout    the parent's watchdog for one task (default for :meth:`run`)
    grace           after one rank fails, how long the others get to report before teardown
    env             extra environment for the ranks (on top of the caller's environment at
                    start; modules the fork server preloaded saw its environment at its start)
    start_method    "forkserver" (default: fast restarts) or "spawn"
    preload         modules the fork server should import before forking ranks (what the tasks
                    import: each rank then starts with them instead of importing them itself);
                    only effective if the server was not yet running in this process
    """

    def __init__(self, world_size: int, *, backend: str = "gloo", device: str | None = None,
                 subgroup_sizes: Sequence[int] = (), pg_timeout: float = 20.0,
                 task_timeout: float = 60.0, startup_timeout: float = 180.0,
                 grace: float = 2.0, env: dict | None = None,
                 start_method: str | None = None, preload: Sequence[str] = ()):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        for n in subgroup_sizes:
            if not 1 <= n <= world_size:
                raise ValueError(f"subgroup size {n} is not in [1, world_size={world_size}]")
        if device is None:
            device = "cuda" if backend == "nccl" or gpu_count() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu', 'cuda' or None, got {device!r}")
        if device == "cpu" and backend == "nccl":
            raise ValueError("an nccl pool computes on GPUs (device='cuda')")
        self.device = device
        # GPU ranks use compiled kernels and their own CUDA context: spawn them fresh rather
        # than fork them from a server that imported dcp_a2a for interpreted (CPU) ranks
        start_method = start_method or ("forkserver" if device == "cpu" else "spawn")
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
        self.start_method = start_method
        self.preload = tuple(preload)
        self.world_size = world_size
        self.backend = backend
        self.subgroup_sizes = tuple(sorted(set(subgroup_sizes)))
        self.pg_timeout = float(pg_timeout)
        self.task_timeout = float(task_timeout)
        self.startup_timeout = float(startup_timeout)
        self.grace = float(grace)
        self.env = {"OMP_NUM_THREADS": "1", **(env or {})}
        if device == "cpu":
            self.env["TRITON_INTERPRET"] = "1"
        self.starts = 0          # how many times the ranks were (re)started
        self.spawned_pids: list[int] = []  # every rank process this pool ever started
        self._procs: list = []
        self._conns: list = []
        self._store = None
        self._tmpdir: str | None = None
        _OPEN_POOLS.add(self)

    # ------------------------------------------------------------------ lifecycle
    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self) -> "RankPool":
        """Spawn the ranks and wait until every one holds the process group (idempotent)."""
        if self.alive:
            return self
        self._teardown()
        import torch.distributed as dist

        ctx = _mp_context(self.start_method, self.preload)
        # The parent hosts the rendezvous store on a port the OS picks: no port races.
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=self.startup_timeout))
        self._tmpdir = tempfile.mkdtemp(prefix="dcp_a2a_pool_")
        self.starts += 1
        prefix = f"pool{os.getpid()}_{self.starts}"
        t0 = time.monotonic()
        for r in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            p = ctx.Process(
                target=run_rank, name=f"dcp_a2a-rank{r}", daemon=True,
                args=(r, self.world_size, self.backend, self.device,
                      ("127.0.0.1", self._store.port), prefix,
                      self.pg_timeout, self.startup_timeout, self.subgroup_sizes, child_end,
                      self._stack_file(r),
                      os.getpid(), {**os.environ, **self.env}, list(sys.path)),
            )
            with (cpu_rank_environment() if self.device == "cpu"
                  else contextlib.nullcontext()):
                p.start()
            self.spawned_pids.append(p.pid)
            child_end.close()
            self._procs.append(p)
            self._conns.append(parent_end)
        replies = self._collect(range(self.world_size), self.startup_timeout, t0)
        bad = {r: v for r, (ok, v) in replies.items() if ok != "ready"}
        if bad or len(replies) < self.world_size:
            silent = [r for r in range(self.world_size) if r not in replies]
            stacks = self._dump_stacks(silent)
            self._teardown()
            raise RankFailure(
                self._message(f"starting a {self.world_size}-rank {self.backend} pool failed",
                              bad, silent, stacks, self.startup_timeout),
                tracebacks=bad, silent=silent, stacks=stacks)
        return self

    def close(self) -> None:
        """Stop the ranks (politely, then by force) and release everything. Idempotent."""
        for c in self._conns:
            try:
                c.send_bytes(pickle.dumps(None))
            except Exception:
                pass
        deadline = time.monotonic() + 5.0
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._teardown()

    def _teardown(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(10.0)
        for c in self._conns:
            c.close()
        self._procs, self._conns = [], []
        self._store = None
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> "RankPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ running tasks
    def run(self, fn: Callable, *args, per_rank: Sequence[tuple] | None = None,
            n: int | None = None, timeout: float | None = None) -> list:
        """Run ``fn(ctx, *args, *per_rank[r])`` on ranks 0..n-1 (default: all) and return the
        list of their results. Raises :class:`RankFailure` / :class:`RankTimeout` (after
        tearing the pool down) when any rank fails or stays silent past ``timeout``."""
        n = self.world_size if n is None else n
        if n != self.world_size and n not in self.subgroup_sizes:
            raise ValueError(f"no {n}-rank group on this pool (world {self.world_size}, "
                             f"subgroups {self.subgroup_sizes})")
        if per_rank is not None and len(per_rank) != n:
            raise ValueError(f"per_rank has {len(per_rank)} entries for {n} ranks")
        timeout = self.task_timeout if timeout is None else float(timeout)
        self.start()
        t0 = time.monotonic()
        for r in range(n):
            extra = tuple(per_rank[r]) if per_rank is not None else ()
            try:
                data = pickle.dumps((fn, args + extra))
            except Exception as e:
                raise TypeError(f"task {getattr(fn, '__name__', fn)!r} or its arguments cannot "
                                f"be pickled (tasks must be module-level functions): {e}") from e
            self._conns[r].send_bytes(data)
        replies = self._collect(range(n), timeout, t0)
        errors = {r: v for r, (st, v) in replies.items() if st != "ok"}
        silent = [r for r in range(n) if r not in replies]
        if not errors and not silent:
            return [replies[r][1] for r in range(n)]
        stacks = self._dump_stacks(silent)
        elapsed = time.monotonic() - t0
        self._teardown()
        name = getattr(fn, "__qualname__", repr(fn))
        msg = self._message(f"task {name} on {n} of {self.world_size} {self.backend} ranks",
                            errors, silent, stacks, timeout)
        cls = RankFailure if errors else RankTimeout
        raise cls(msg, tracebacks=errors, silent=silent, stacks=stacks, elapsed=elapsed)

    def _collect(self, ranks, timeout: float, t0: float) -> dict:
        """Wait for one reply per rank; stop early ``grace`` s after the first failure."""
        pending = set(ranks)
        replies: dict[int, tuple[str, Any]] = {}
        deadline = t0 + timeout
        while pending:
            now = time.monotonic()
            if now >= deadline:
                break
            by_obj = {}
            for r in pending:
                by_obj[self._conns[r]] = r
                by_obj[self._procs[r].sentinel] = r
            for obj in _wait_any(list(by_obj), timeout=deadline - now):
                r = by_obj[obj]
                if r not in pending:
                    continue
                conn = self._conns[r]
                if conn.poll():  # data first: a rank may answer and then exit
                    try:
                        replies[r] = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        replies[r] = ("died", self._death(r))
                    except Exception:
                        replies[r] = ("error", "its reply could not be unpickled:\n"
                                      + traceback.format_exc())
                elif not self._procs[r].is_alive():
                    replies[r] = ("died", self._death(r))
                else:
                    continue
                pending.discard(r)
                if replies[r][0] not in ("ok", "ready"):
                    deadline = min(deadline, time.monotonic() + self.grace)
        return replies

    def _death(self, r: int) -> str:
        p = self._procs[r]
        p.join(1.0)
        msg = f"rank {r} (pid {p.pid}) {_describe_exit(p.exitcode)} without answering"
        try:
            with open(self._stack_file(r)) as f:
                crash = f.read().strip()
        except OSError:
            crash = ""
        return msg + (f"; its last stack:\n{crash}" if crash else "")

    def _stack_file(self, r: int) -> str:
        return os.path.join(self._tmpdir, f"rank{r}.stack")

    def _dump_stacks(self, ranks) -> dict[int, str]:
        """Ask each silent rank for its Python stack (faulthandler on SIGUSR1)."""
        live = [r for r in ranks if self._procs[r].is_alive()]
        for r in live:
            try:
                os.kill(self._procs[r].pid, signal.SIGUSR1)
            except OSError:
                pass
        stacks = {}
        if live:
            time.sleep(0.5)
        for r in live:
            try:
                with open(self._stack_file(r)) as f:
                    stacks[r] = f.read().strip()
            except OSError:
                pass
        return stacks

    def _message(self, what, errors, silent, stacks, timeout) -> str:
        if errors:
            late = (f"rank(s) {silent} were still busy {self.grace:g} s after the first "
                    "failure (typically waiting in a collective for the failed rank)")
        else:
            late = f"rank(s) {silent} did not answer within {timeout:g} s"
        parts = [f"{what}: "
                 + ", ".join(filter(None, [
                     f"rank(s) {sorted(errors)} failed" if errors else "",
                     late if silent else "",
                 ]))
                 + " (the pool was torn down; the next task starts a fresh one)"]
        for r in sorted(errors):
            parts.append(f"--- rank {r} ---\n{errors[r]}")
        for r in silent:
            parts.append(f"--- rank {r}: no answer; its stack ---\n{stacks.get(r, '(unavailable)')}")
        return "\n".join(parts)
