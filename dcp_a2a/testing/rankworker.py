"""One rank of a :class:`dcp_a2a.testing.rankpool.RankPool`: what runs in each rank process.

The rank joins the rendezvous store its parent hosts, holds the process group (and the
subgroups of ranks 0..n-1 the pool asked for), then runs the tasks its parent sends through a
pipe until told to stop: each task ``task(ctx, *args)`` with ``ctx`` this rank's
:class:`RankContext`, its result (or its traceback) sent back pickled. ``faulthandler`` writes
the rank's Python stack to a file on SIGUSR1 (the parent's watchdog asks for it while the rank
is blocked inside gloo/NCCL) and on a crash; the rank exits by itself when its parent is gone.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .devices import rank_device


# --------------------------------------------------------------------------- the worker side
@dataclass
class RankContext:
    """What a task sees on its rank."""

    rank: int
    world_size: int
    backend: str
    device: Any                       # torch.device the rank computes on
    groups: dict = field(repr=False)  # n -> ProcessGroup of ranks 0..n-1 (n == world: WORLD)

    def process_group(self, n: int | None = None):
        n = self.world_size if n is None else n
        if n not in self.groups:
            raise ValueError(
                f"no process group of size {n} on this pool (sizes: {sorted(self.groups)}); "
                "pass it in RankPool(subgroup_sizes=...)"
            )
        if self.rank >= n:
            raise ValueError(f"rank {self.rank} is not a member of the {n}-rank group")
        return self.groups[n]

    def group(self, n: int | None = None):
        """The ``n``-rank group (ranks 0..n-1) as a DCP group object: ``world_size``,
        ``rank_in_group``, ``device_group`` (what ``lse_reduce`` takes)."""
        from ..collective import Group

        n = self.world_size if n is None else n
        return Group(n, self.rank, self.process_group(n))


def _watch_owner(owner_pid: int) -> None:
    # The pool's owner is gone (even SIGKILLed) when it no longer exists or when this rank was
    # reparented (its parent is the owner under spawn, the fork server under forkserver, which
    # exits with the owner): leave no orphan behind.
    parent = os.getppid()
    while True:
        try:
            os.kill(owner_pid, 0)
            gone = os.getppid() != parent
        except ProcessLookupError:
            gone = True
        except PermissionError:
            gone = False
        if gone:
            os._exit(3)
        time.sleep(0.5)


def _send(conn, obj) -> None:
    try:
        data = pickle.dumps(obj)
    except Exception:
        data = pickle.dumps(("error", "the task's result could not be pickled:\n"
                                      + traceback.format_exc()))
    conn.send_bytes(data)


def run_rank(rank, world_size, backend, device_type, store_addr, prefix, pg_timeout_s,
                 startup_timeout_s, subgroup_sizes, conn, stack_file, owner_pid, env, sys_path):
    os.environ.update(env)
    # tasks live in the owner's modules (test files, scripts): resolve them the way it does
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    threading.Thread(target=_watch_owner, args=(owner_pid,), daemon=True).start()
    fh = open(stack_file, "w")
    faulthandler.enable(file=fh, all_threads=True)  # a crash leaves its stack here too
    faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # N ranks share the machine's cores with the test process
        device = rank_device(backend, rank, device_type)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # The rendezvous waits for every rank to start (8 ranks spawning CUDA contexts on a
        # loaded machine took over 20 s on an H200 host), so it gets the startup timeout; the
        # collectives then get pg_timeout, where torch can change it after creation.
        timeout = timedelta(seconds=pg_timeout_s)
        set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
        rendezvous = timedelta(seconds=startup_timeout_s) if set_timeout else timeout
        host, port = store_addr
        store = dist.TCPStore(host, port, is_master=False, timeout=rendezvous)
        dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=rank,
                                world_size=world_size, timeout=rendezvous)
        groups = {world_size: dist.group.WORLD}
        for n in sorted(set(subgroup_sizes)):
            if 1 <= n < world_size:
                # every rank takes part in creating every group, member or not
                groups[n] = dist.new_group(list(range(n)), timeout=rendezvous)
        if set_timeout:
            for pg in groups.values():
                if pg not in (None, dist.GroupMember.NON_GROUP_MEMBER):  # this rank's groups
                    set_timeout(timeout, pg)
        ctx = RankContext(rank, world_size, backend, device, groups)
    except BaseException:
        _send(conn, ("error", traceback.format_exc()))
        return
    _send(conn, ("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            break
        try:
            task = pickle.loads(msg)
            if task is None:
                break
            fn, args = task
            reply = ("ok", fn(ctx, *args))
        except BaseException:
            reply = ("error", traceback.format_exc())
        _send(conn, reply)
    try:
        dist.destroy_process_group()
    except Exception:
        pass

