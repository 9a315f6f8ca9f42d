"""Process plumbing shared by the multi-process tests: how pools are built, and helper processes
forked from the pools' fork server (which has imported torch, so they start in a fraction of a
second instead of paying torch's import).

Nothing here imports pytest: forked helper processes import this module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback

from dcp_a2a.testing.rankpool import RankPool, fork_server_context
from dcp_a2a.testing.tasks import RANK_PRELOAD

def helper_context():
    """The fork server's multiprocessing context (started with the tasks' preload if need be)."""
    return fork_server_context(RANK_PRELOAD)


# --------------------------------------------------------------------------- torchrun
def _torchrun_launcher(argv: list, env: dict, cwd: str, stdout_path: str, stderr_path: str):
    """Body of the launcher process: ``torchrun ARGV`` (``torch.distributed.run.main``, what the
    ``torchrun`` console script calls) with its output, and its ranks', in two files."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    out = os.open(stdout_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.argv = ["torchrun", *argv]
    code = 0
    try:
        from torch.distributed.run import main

        main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_torchrun(argv: list, *, env: dict, cwd: str, timeout: float,
                 out_dir) -> subprocess.CompletedProcess:
    """Run ``torchrun ARGV`` and wait (at most ``timeout`` s; then the launcher and its ranks
    are killed and ``subprocess.TimeoutExpired`` is raised). The launcher is a fork of the
    pools' fork server, so it does not import torch again; the ranks it starts are fresh
    Python processes, exactly as under the ``torchrun`` command."""
    out_dir = str(out_dir)
    so, se = os.path.join(out_dir, "torchrun.stdout"), os.path.join(out_dir, "torchrun.stderr")
    ctx = helper_context()
    p = ctx.Process(target=_torchrun_launcher, args=(list(argv), dict(env), cwd, so, se),
                    name="torchrun-launcher")
    p.start()
    p.join(timeout)
    timed_out = p.exitcode is None
    if timed_out:
        # SIGTERM: torchrun's agent stops its ranks (each in a session of its own) and exits
        p.terminate()
        p.join(15.0)
        if p.exitcode is None:
            p.kill()
            p.join(5.0)

    def _read(path):
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    stdout, stderr = _read(so), _read(se)
    if timed_out:
        raise subprocess.TimeoutExpired(["torchrun", *argv], timeout, stdout, stderr)
    return subprocess.CompletedProcess(["torchrun", *argv], p.exitcode, stdout, stderr)


# --------------------------------------------------------------------------- pool owner
def pool_owner(conn, world_size: int):
    """Body of a process that owns a pool: start it, run one task, send the ranks' pids, then
    wait to be killed (or, should the test process die first, return: its pool closes)."""
    from dcp_a2a.testing import tasks as mp_tasks

    pool = RankPool(world_size, device="cpu").start()
    assert pool.run(mp_tasks.all_reduce_sum, world_size, 1.0) == [float(world_size)] * world_size
    conn.send(pool.pids)
    try:
        conn.recv()    # nothing is ever sent: returns when the other end is closed
    except (EOFError, OSError):
        pass
