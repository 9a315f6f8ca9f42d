"""The tests on the pool of ranks on one xdist worker under ``--dist loadgroup``.

pytest-xdist's loadgroup sends the tests of one ``xdist_group`` to one worker by appending the
group's name to their node ids on the workers. Since pytest 9.2 a node id is structured and
that rename no longer takes (pytest-dev/pytest-xdist#1386): the group mark is ignored, and every
worker started a pool of ranks of its own. On one H200 (2026-12-05, 8 workers) the eight pools
started at once, their first tests took 19-25 s each, and 64 rank processes held CUDA contexts.

Here the workers name the pool's tests in a file and the controller's scheduler (a loadgroup
scheduler, through xdist's ``pytest_xdist_make_scheduler`` hook) reads it: the pool's tests are
one unit of work again, whatever the pytest version; xdist's own suffix still counts where it
takes. xdist's scope reordering hands the largest unit out first, so the pool starts at once.
The scheduler also hands tests right to workers that replace crashed ones.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from .recorder import _is_worker

GROUP = "rank_pool"
ENV = "DCP_A2A_POOL_GROUP_DIR"  # where the workers name the group's tests (set by the controller)


def _loadgroup(config) -> bool:
    return getattr(config.option, "dist", "no") == "loadgroup"


def configure(config) -> None:
    """Controller: a fresh directory for this session's workers (inherited through the
    environment), or none, so that a nested session never reads or feeds an outer one's."""
    if _is_worker(config):
        return
    if _loadgroup(config) and getattr(config.option, "numprocesses", None):
        where = tempfile.mkdtemp(prefix="dcp_a2a_poolgroup_")
        os.environ[ENV] = where
        config.add_cleanup(lambda: shutil.rmtree(where, ignore_errors=True))
    else:
        os.environ.pop(ENV, None)


def record(config, pooled: list) -> None:
    """Worker: name the group's tests (before xdist reports the collection to the controller)."""
    where = os.environ.get(ENV)
    if not (_is_worker(config) and where and Path(where).is_dir()):
        return
    worker = config.workerinput.get("workerid", "gw")
    tmp = Path(where) / f".{worker}.json.tmp"
    tmp.write_text(json.dumps([item.nodeid for item in pooled]))
    tmp.replace(Path(where) / f"{worker}.json")  # whole or absent


def named(where: str | None) -> set[str]:
    """The node ids the workers put in the group."""
    ids: set[str] = set()
    for path in Path(where).glob("*.json") if where else ():
        ids.update(json.loads(path.read_text()))
    return ids


def make_scheduler(config, log):
    """The loadgroup scheduler that also groups the tests the workers named; None elsewhere
    (xdist's own)."""
    where = os.environ.get(ENV)
    if not (_loadgroup(config) and where):
        return None
    from xdist.scheduler import LoadGroupScheduling

    class PoolGroupScheduling(LoadGroupScheduling):
        pooled: set[str] | None = None
        holding = False

        def _split_scope(self, nodeid: str) -> str:
            if self.pooled is None:  # first called once every worker's collection is in
                self.pooled = named(where)
            return GROUP if nodeid in self.pooled else super()._split_scope(nodeid)

        def remove_node(self, node):
            # loadscope puts a dead worker's unfinished units back in the queue, the test it
            # died in included: that test crashed the next worker too, and the next, until
            # xdist gave up replacing them and the session ended (an engine's segfault on the
            # CPU). It has its record (xdist's crash report); it is not run again.
            # (xdist hands the queue out again within remove_node: held until the test is out)
            self.holding = True
            try:
                crashitem = super().remove_node(node)
            finally:
                self.holding = False
            for scope, unit in list(self.workqueue.items()):
                if crashitem in unit:
                    unit[crashitem] = True
                    if all(unit.values()):
                        del self.workqueue[scope]
            for other in list(self.assigned_work):
                self._reschedule(other)
            return crashitem

        def _reschedule(self, node) -> None:
            # Workers that replace crashed ones (an engine's segfault), three cases xdist's
            # loadscope scheduler gets wrong, each an internal error that ends the session or a
            # wait to its end: one still collecting has no collection to be handed tests from
            # (its own collection's arrival schedules it); one that has died, before xdist has
            # read its end, cannot be sent tests (OSError: what it was handed goes back to the
            # queue when its end is read); and a worker starts a test only once it holds the
            # next one or has been told to stop, so a late one must not hold a single test.
            if self.holding or node not in self.registered_collections:
                return
            try:
                super()._reschedule(node)
                while (not node.shutting_down and node in self.assigned_work
                       and self._pending_of(self.assigned_work[node]) < 2):
                    if not self.workqueue:
                        node.shutdown()
                        break
                    self._assign_work_unit(node)
            except OSError:
                return

    return PoolGroupScheduling(config, log)
