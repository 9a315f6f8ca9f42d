"""Launching a compiled kernel without Triton's Python dispatch (an eager call's host time).

``kernel[grid](*args, **kw)`` binds the arguments, derives their specialisation, looks the
compiled kernel up in its cache and then launches it. On one H200 (2026-12-05, 1000 eager
calls) that dispatch made an empty kernel with the pack's arguments cost 29.3 us a call, where
the pack's compiled launcher called straight took 8.7 us.

``Launches(kernel)`` keeps, per problem, the compiled kernels it has launched, keyed by what
decides Triton's specialisation of these arguments: each tensor's dtype and address modulo 16,
each other argument's value, the constexpr keywords, the current device. A new key goes through
``kernel[grid]`` (which compiles or finds the kernel, and launches it); a known one calls the
compiled kernel's launcher as ``JITFunction.run`` does, on the current stream, with the same
launch hooks. So the bits are those of Triton's own launch (the same compiled kernel, the same
arguments), and a CUDA graph captures the same launch.

``bind`` goes one step further for a caller that has checked a problem once (``dcp_a2a.ops``):
it launches like ``launch`` and returns a :class:`Site`, the compiled kernel with every argument
but the leading tensors' addresses fixed, which later calls of the same problem (same dtypes,
strides, values and address alignment: the caller's key) launch with integer addresses, as
Triton's launcher accepts them.

Every launch goes through Triton under the interpreter, where the installed Triton's compiled
kernel lacks what this calls (another version), while the kernel has pre-run hooks, and after
``DCP_A2A_TRITON_DISPATCH=1``. Changing Triton's knobs (debug, instrumentation) between calls is
not seen: a kernel already launched keeps the options it was compiled with.
"""

from __future__ import annotations

import inspect
import os
import sys

import torch

from .. import _env

DISPATCH_ENV = "DCP_A2A_TRITON_DISPATCH"  # "1": every launch through kernel[grid]
_LAUNCHER_PARTS = ("run", "function", "packed_metadata", "launch_metadata")
MAX_KEYS = 4096  # compiled launches kept a kernel (then it starts again)


def direct_enabled() -> bool:
    return not _env.INTERPRET and os.environ.get(DISPATCH_ENV, "") != "1"


_ALL: dict = {}


def _active(hook) -> bool:
    """Whether a launch hook of Triton's knobs would do anything: None, or a hook chain
    (Triton's ``HookChain``, the knobs' default since 3.4) with no hook in it, would not."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _is_jit(kernel) -> bool:
    """A ``@triton.jit`` kernel (its Python function at ``fn``), not a test's stand-in."""
    return callable(getattr(kernel, "fn", None))


def _runtime():
    """(Triton's active driver, Triton's knobs): what ``JITFunction.run`` launches with."""
    from triton import knobs
    from triton.runtime.driver import driver

    return driver.active, knobs


def launch(kernel, grid, *args, **kw):
    """``kernel[grid](*args, **kw)``, through the kernel's :class:`Launches` (a stand-in that a
    test put in a kernel's place is called as it is, and not kept)."""
    launches = _ALL.get(kernel)
    if launches is None:
        if not _is_jit(kernel):
            return kernel[grid](*args, **kw)
        launches = _ALL[kernel] = Launches(kernel)
    return launches(grid, *args, **kw)


class Launches:
    """Launches of one ``@triton.jit`` kernel; see the module's docstring. Anything else (a
    stand-in a test put in the kernel's place) is called through ``kernel[grid]``."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.cache: dict = {}
        self.tails: dict = {}  # (positional args, keyword names) -> the parameters after them
        self.usable = direct_enabled() and _is_jit(kernel)
        self.direct = 0  # launches that skipped Triton's dispatch (tests read it)
        self.sited = 0  # ... of them, through a Site
        self.runtime = None

    def __call__(self, grid, *args, **kw):
        if not self.usable or callable(grid) or getattr(self.kernel, "pre_run_hooks", None):
            return self.kernel[grid](*args, **kw)
        if self.runtime is None:
            self.runtime = _runtime()
        driver, knobs = self.runtime
        device = driver.get_current_device()
        key = (device, tuple(kw.items()), *[
            (a.dtype, a.data_ptr() & 15) if isinstance(a, torch.Tensor) else a for a in args])
        hit = self.cache.get(key)
        if hit is None:
            return self._first(key, grid, args, kw)
        compiled, tail = hit
        stream = driver.get_current_stream(device)
        full = (*args, *tail)
        g = (*grid, 1, 1)
        hooks = knobs.runtime
        enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
        if _active(enter) or _active(leave):
            compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata,
                         compiled.launch_metadata(grid, stream, *full), enter, leave, *full)
        else:  # no hook to call: no launch metadata to build for one
            compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata,
                         None, None, None, *full)
        self.direct += 1
        return compiled

    def _first(self, key, grid, args, kw):
        """Through Triton (compiling or finding the kernel); keep what it launched."""
        compiled = self.kernel[grid](*args, **kw)
        tail = self._tail(args, kw)
        if tail is None or not all(hasattr(compiled, part) for part in _LAUNCHER_PARTS):
            self.usable = False  # another Triton, or arguments we cannot order: its dispatch
            return compiled
        if len(self.cache) >= MAX_KEYS:
            self.cache.clear()
        self.cache[key] = (compiled, tail)
        return compiled

    def _tail(self, args, kw):
        """The values of the kernel's parameters after the positional ``args``, in its order
        (a keyword's, else the default): what ``JITFunction.run`` hands the launcher after
        them. Keywords that are no parameter are launch options (warps, fp fusion). None where
        a parameter has neither."""
        params = inspect.signature(self.kernel.fn).parameters
        layout = (len(args), tuple(kw))
        names = self.tails.get(layout)
        if names is None:
            later = list(params.values())[len(args):]
            if len(args) > len(params) or any(p.name not in kw and p.default is p.empty
                                              for p in later):
                return None
            names = self.tails[layout] = tuple(p.name for p in later)
        return tuple(kw[n] if n in kw else params[n].default for n in names)


def bind(kernel, grid, *args, **kw):
    """``launch(kernel, grid, *args, **kw)``, and a :class:`Site` that repeats that very launch
    with other addresses; None where launches go through Triton (the interpreter, a stand-in,
    hooks, another Triton) or the tensors are not the leading arguments."""
    compiled = launch(kernel, grid, *args, **kw)
    launches = _ALL.get(kernel)
    if launches is None or not launches.usable or callable(grid) or compiled is None:
        return None
    n = 0
    while n < len(args) and isinstance(args[n], torch.Tensor):
        n += 1
    if any(isinstance(a, torch.Tensor) for a in args[n:]):
        return None
    tail = launches._tail(args, kw)
    if tail is None or not all(hasattr(compiled, part) for part in _LAUNCHER_PARTS):
        return None
    return Site(launches, compiled, grid, (*args[n:], *tail))


class Site:
    """One launch of one problem, every argument fixed but the addresses of the leading
    tensors: ``site(*addresses)`` launches the compiled kernel on the current stream with them
    (integers), counted in its :class:`Launches`' ``direct`` and ``sited``. It returns False
    without launching where it must not: the kernel's module now holds another object under
    its name (a test's stand-in), its launches go through Triton now, the current device is
    not the one it was made on, or a launch hook is active (hooks see tensors): the caller
    then launches through :func:`launch`. The caller guarantees the rest: the same problem
    (dtypes, strides, values), and addresses of the same alignment modulo 16 as the tensors
    it was made with."""

    __slots__ = ("launches", "kernel", "module", "name", "compiled", "run", "function",
                 "metadata", "grid", "rest", "device", "driver", "hooks")

    def __init__(self, launches, compiled, grid, rest):
        self.launches, self.kernel = launches, launches.kernel
        fn = self.kernel.fn
        self.module, self.name = sys.modules.get(fn.__module__), fn.__name__
        self.compiled = compiled  # what it launches (tests read its metadata)
        self.run, self.function = compiled.run, compiled.function
        self.metadata = compiled.packed_metadata
        self.grid = (*grid, 1, 1)[:3]
        self.rest = rest  # the arguments after the addresses, then the parameters' tail
        driver, knobs = launches.runtime or _runtime()
        self.driver, self.hooks = driver, knobs.runtime
        self.device = driver.get_current_device()

    def __call__(self, *addresses) -> bool:
        if getattr(self.module, self.name, None) is not self.kernel or not self.launches.usable:
            return False
        driver, hooks = self.driver, self.hooks
        device = driver.get_current_device()
        if device != self.device or _active(hooks.launch_enter_hook) \
                or _active(hooks.launch_exit_hook):
            return False
        g = self.grid
        self.run(g[0], g[1], g[2], driver.get_current_stream(device), self.function,
                 self.metadata, None, None, None, *addresses, *self.rest)
        launches = self.launches
        launches.direct += 1
        launches.sited += 1
        return True
