"""The component glue, imported only inside a component built by ``guest-sdk/python/build``.

It implements the contract's exports (``init``, ``handle``) on top of the plugin class, plugs the
host's ``log`` and ``outputs.emit`` imports into the SDK, and routes ``print()``,
``sys.stdout`` and ``sys.stderr`` to the host's log (a component built with ``--stub-wasi`` has
no working stdout: writing to it would trap). Not a public API.
"""

from __future__ import annotations

import builtins
import codecs
import errno
import io
import os
import random
import sys
import time
import traceback

from componentize_py_types import Err
from wit_world.imports import host, outputs, stderr, types

import sharehost_guest as sg

_LEVELS = {
    "trace": host.Level.TRACE,
    "debug": host.Level.DEBUG,
    "info": host.Level.INFO,
    "warn": host.Level.WARN,
    "error": host.Level.ERROR,
}

_ACCEPT = types.Verdict_Accept()
_RELEASE = types.Verdict_Release()
_RENEW = types.Verdict_Renew()


def _log(level: str, message: str) -> None:
    host.log(_LEVELS[level], message)


def _emit(index, output, key, value, headers) -> None:
    wire = [outputs.Header(k, v) for k, v in headers]
    try:
        outputs.emit(index, output, key, value, wire)
    except Err as e:
        raise _emit_error(e.value) from None


def _emit_error(e) -> sg.EmitError:
    """The SDK exception for a wire ``emit-error``."""
    if isinstance(e, outputs.EmitError_UnknownOutput):
        return sg.UnknownOutput(e.value)
    if isinstance(e, outputs.EmitError_TooManyEmits):
        return sg.TooManyEmits(e.value)
    if isinstance(e, outputs.EmitError_TooManyBytes):
        return sg.TooManyBytes(e.value)
    if isinstance(e, outputs.EmitError_ReservedHeader):
        return sg.ReservedHeader(e.value)
    return sg.NoSuchRecord()


class _HostStream(io.TextIOBase):
    """A text stream whose complete lines become host log lines at one level.

    Before the first export call (i.e. while the build pre-initialises the module) it writes to
    the stream it replaced, so output at import time shows in the build's terminal.
    """

    def __init__(self, level: str, name: str, before) -> None:
        super().__init__()
        self._level = level
        self._name = name
        self._before = before
        self._buf = ""

    @property
    def name(self) -> str:
        return self._name

    @property
    def encoding(self) -> str:
        return "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not _live:
            return self._before.write(s)
        self._buf += s
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            host.log(_LEVELS[self._level], line)
        return len(s)

    def flush(self) -> None:
        if not _live:
            self._before.flush()
            return
        if self._buf:
            line, self._buf = self._buf, ""
            host.log(_LEVELS[self._level], line)


_live = False
_plugin = None
_stdout = _HostStream("info", "<stdout>", sys.stdout)
_stderr = _HostStream("warn", "<stderr>", sys.stderr)


def _build_setting(name: str, default):
    """A setting the build wrote into the ``sharehost_build`` module: ``WASI`` (``stub``: every
    WASI import traps but the SDK's own, or ``deny``: only files and sockets do) and ``HTTP``
    (whether the component imports ``wasi:http``)."""
    try:
        import sharehost_build

        return getattr(sharehost_build, name, default)
    except ImportError:
        return default


_WASI = _build_setting("WASI", "stub")
_HTTP = _build_setting("HTTP", False)


def _go_live() -> None:
    global _live
    if not _live and _WASI == "deny":
        # The snapshot carries the build's seed; a real wasi:random gives each instance its own.
        random.seed()
    _live = True


def _flush() -> None:
    _stdout.flush()
    _stderr.flush()


# --- Runtime guards ---------------------------------------------------------------------------
# The build stubs WASI imports with traps: all of them (`--wasi stub`), or only files and
# sockets (`--wasi deny`). So a file open or an import that has to read a module file (and, in
# stub mode, a clock read or a random byte) would kill the instance with a bare "unreachable".
# These guards turn the common ones into Python exceptions that say what to do instead; they
# act only once the component runs (the build itself needs the originals). C code that reads
# the clock directly (datetime.now()) still traps in stub mode.


def _guard(module, name: str, make_error) -> None:
    original = getattr(module, name, None)
    if original is None:
        return

    def guarded(*args, **kwargs):
        if _live:
            raise make_error()
        return original(*args, **kwargs)

    guarded.__name__ = name
    guarded.__doc__ = getattr(original, "__doc__", None)
    setattr(module, name, guarded)


def _no_clock(name: str):
    return lambda: RuntimeError(
        f"time.{name}() is not available in a sharehost Python plugin (the component has no "
        "clock): use record.timestamp"
    )


def _no_file():
    return PermissionError(
        errno.EACCES, "a sharehost plugin has no filesystem: read configuration from init's config"
    )


class _NoImportAtRuntime:
    """Refuses, with a clear ImportError, imports that would have to read a module file at run
    time (there is no filesystem: that would trap). Placed just before the path finder, so
    built-in and frozen modules still import."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if _live:
            raise ImportError(
                f"module {name!r} was not imported when the component was built: import it at "
                "the top of your plugin module (a component cannot load modules at run time)",
                name=name,
            )
        return None


def _install_guards() -> None:
    if _WASI == "stub":
        _install_clock_and_random_guards()
    _guard(builtins, "open", _no_file)
    _guard(io, "open", _no_file)
    finders = sys.meta_path
    at = next(
        (i for i, f in enumerate(finders) if getattr(f, "__name__", "") == "PathFinder"),
        len(finders),
    )
    finders.insert(at, _NoImportAtRuntime)


def _install_clock_and_random_guards() -> None:
    for name in (
        "time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns",
        "process_time", "process_time_ns", "thread_time", "thread_time_ns", "sleep",
    ):
        _guard(time, name, _no_clock(name))
    _guard(
        os,
        "urandom",
        lambda: NotImplementedError(
            "os.urandom() is not available in a sharehost Python plugin (no secure randomness; "
            "`random` is seeded at build time)"
        ),
    )


# --- Codecs ---------------------------------------------------------------------------------
# Python finds a codec by importing its module the first time it is named, which a component
# cannot do at run time: `json.loads(bytes)` names utf-16/utf-32 for input that starts with
# NUL bytes, `str.encode("idna")` (and urllib with a non-ASCII host) names idna. The build
# snapshot keeps what was looked up, so the codecs plugins commonly need are looked up now;
# any other one raises a LookupError that says what to do, instead of "unknown encoding".

_CODECS = (
    "utf-8", "utf-8-sig", "utf-16", "utf-16-be", "utf-16-le", "utf-32", "utf-32-be",
    "utf-32-le", "ascii", "latin-1", "cp1252", "idna", "punycode", "unicode-escape",
    "raw-unicode-escape", "hex", "base64",
)
for _name in _CODECS:
    codecs.lookup(_name)


def _missing_codec(name: str):
    if _live:
        raise LookupError(
            f"codec {name!r} was not loaded when the component was built: call "
            f"codecs.lookup({name!r}) at the top of your plugin module"
        )
    return None


codecs.register(_missing_codec)


# --- Faults ---------------------------------------------------------------------------------


def _where(e: BaseException) -> str:
    """Where an exception was raised, as ``file:line in function``: the innermost frame of the
    plugin's own code (not the standard library's, not the SDK's), else the innermost one.
    File names lose the component's mount prefix (``/1/plugin.py`` reads ``plugin.py``)."""
    # Source lines are never looked up: the component has no files (and linecache would
    # import modules at run time).
    frames = traceback.StackSummary.extract(traceback.walk_tb(e.__traceback__), lookup_lines=False)
    if not frames:
        return ""
    ours = [
        f
        for f in frames
        if not f.filename.startswith(("/python/", "<"))
        and "/sharehost_guest/" not in f.filename
    ]
    f = (ours or frames)[-1]
    name = f.filename
    parts = name.split("/")
    if len(parts) > 2 and parts[0] == "" and parts[1].isdigit():
        name = "/".join(parts[2:])
    return f"{name}:{f.lineno} in {f.name}"


def _report(e: BaseException) -> None:
    """Writes one line saying what failed and where to the component's stderr, just before the
    instance traps: the host's fault text shows the last stderr line of a failed call (Rust
    panics reach it the same way)."""
    try:
        where = _where(e)
        message = f"{type(e).__name__}: {e}"
        if len(message) > 400:
            message = message[:400] + "..."
        line = f"plugin fault: {message}" + (f" (at {where})" if where else "")
        out = stderr.get_stderr()
        try:
            out.blocking_write_and_flush((line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
        finally:
            out.__exit__(None, None, None)
    except Exception:
        pass  # the log line already says it


def _describe(e: BaseException) -> str:
    """``Type: message`` plus the stack as file:line lines. Never reads source files (the
    component has no filesystem), unlike ``traceback.format_exc``."""
    frames = traceback.StackSummary.extract(traceback.walk_tb(e.__traceback__), lookup_lines=False)
    where = "".join(f'\n  File "{f.filename}", line {f.lineno}, in {f.name}' for f in frames)
    return f"{type(e).__name__}: {e}{where}"


def plugin_class(module) -> type:
    """The plugin class of ``module``: the one passed to ``sharehost_guest.export``, else the
    one ``Plugin`` subclass defined in the module."""
    if sg._exported:
        if len(sg._exported) > 1:
            names = ", ".join(c.__name__ for c in sg._exported)
            raise TypeError(f"@export used on several plugins ({names}); keep one")
        return sg._exported[0]
    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type)
        and issubclass(v, sg.Plugin)
        and v is not sg.Plugin
        and v.__module__ == module.__name__
    ]
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise TypeError(
            f"{module.__name__}: expected exactly one sharehost_guest.Plugin subclass, found "
            f"{names}; mark the one to export with @sharehost_guest.export"
        )
    return found[0]


def _wire(v) -> object:
    if v is sg._ACCEPT:
        return _ACCEPT
    if not isinstance(v, sg.Verdict):
        raise TypeError(
            f"handle returned {v!r}, not a verdict: use accept(), release(), reject(reason), "
            "renew() or retry(ms)"
        )
    k = v.kind
    if k == "accept":
        return _ACCEPT
    if k == "reject":
        return types.Verdict_Reject(v.reason)
    if k == "release":
        return _RELEASE
    if k == "renew":
        return _RENEW
    return types.Verdict_Retry(v.after_ms)


def make_world(module) -> type:
    """Builds the ``WitWorld`` export class for the plugin in ``module`` and routes the SDK's
    log, emits, stdout and stderr to the host. Called once, by the build's generated app
    module, at build time (the component starts from that snapshot)."""
    cls = plugin_class(module)
    if _HTTP:
        from . import _wasi_http, http

        http._sender = _wasi_http.send_all
    sg._backend.log = _log
    sg._backend.emit = _emit
    sys.stdout = _stdout
    sys.stderr = _stderr

    class WitWorld:
        """The contract's exports."""

        def init(self, config, secrets) -> None:
            global _plugin
            _go_live()
            _plugin = None
            try:
                plugin = cls()
                plugin.init(sg.Config(config, secrets))
            except sg.ConfigError as e:
                raise Err(str(e)) from None
            except Exception as e:
                raise Err(f"{type(e).__name__}: {e}") from None
            finally:
                _flush()
            _plugin = plugin

        def handle(self, batch):
            _go_live()
            records = sg.records_of(batch)
            if _plugin is None:
                # `handle` before a successful `init` breaks the contract; give all back.
                return [_RELEASE] * len(records)
            try:
                verdicts = [_wire(v) for v in _plugin.handle(records)]
            except BaseException as e:
                # Logged here (the host only sees "trap"), then re-raised: componentize-py
                # turns an exception escaping an export into a trap, i.e. a plugin fault.
                _flush()
                host.log(host.Level.ERROR, f"plugin fault: {_describe(e)}")
                _report(e)
                raise
            _flush()
            return verdicts

    return WitWorld


# Installed when this module is imported, i.e. before the plugin module (the build's app
# module imports this one first), so `from time import time` in a plugin gets the guard too.
_install_guards()
