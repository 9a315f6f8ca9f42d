"""What ``dcp-a2a validate`` shows while its pytest sessions run: a tqdm bar per session on a
terminal, a line every 20 s elsewhere (CI logs), and each failure as it happens."""

from __future__ import annotations

import sys
import time


class _Stream:
    """Plain pass-through to a terminal stream: tqdm given ``sys.stderr`` itself stayed silent on
    some ptys here; through this wrapper it draws."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s):
        return self.stream.write(s)

    def flush(self):
        return self.stream.flush()

    def isatty(self):
        return True


class Progress:
    """A tqdm bar per pytest session on a terminal; periodic lines elsewhere (CI logs)."""

    def __init__(self, enabled: bool, stream=None):
        self.stream = stream or sys.stderr
        self.tty = enabled and self.stream.isatty()
        self.enabled = enabled
        self.bar = None
        self.done = 0
        self.total = None
        self.fails = 0
        self.skips = 0
        self.last_line = 0.0

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.bar.fp)
        else:
            print(text, file=self.stream, flush=True)

    def start_run(self, spec) -> None:
        self.done, self.total, self.fails, self.skips = 0, None, 0, 0
        self.t0 = time.monotonic()
        label = f"{spec.name} [{','.join(spec.tiers)}]"
        if self.tty:
            from tqdm import tqdm

            import shutil

            wide = shutil.get_terminal_size((0, 0)).columns >= 40
            self.bar = tqdm(total=None, desc=f"{label} collecting", unit="test",
                            file=_Stream(self.stream), dynamic_ncols=wide, ncols=None if wide else 100,
                            leave=True)
            self.label = label
        else:
            self.label = label
            self.message(f"{label}: collecting (pytest -n {spec.workers or 0})")

    def collected(self, spec, collection: dict) -> None:
        self.total = len(collection.get("selected", []))
        if self.bar is not None:
            self.bar.reset(total=self.total)
            self.bar.update(self.done)
            self.bar.set_description(self.label)
        else:
            self.message(f"{self.label}: {self.total} tests selected "
                         f"({len(collection.get('dropped', []))} left out)")

    def test_done(self, spec, rec: dict) -> None:
        self.done += 1
        oc = rec.get("outcome")
        if oc in ("failed", "error"):
            self.fails += 1
            self.message(f"  {oc.upper()} {rec['nodeid']}")
        elif oc == "skipped":
            self.skips += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(fail=self.fails, skip=self.skips, refresh=False)
        elif self.enabled and time.monotonic() - self.last_line > 20:
            self.last_line = time.monotonic()
            self.message(f"{self.label}: {self.done}/{self.total or '?'} done, "
                         f"{self.fails} failed, {self.skips} skipped")

    def end_run(self, spec, result) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.message(f"{self.label}: {self.done} tests in {result.wall_s:.1f}s, "
                     f"{self.fails} failed, {self.skips} skipped (pytest exit {result.exit_status})")

