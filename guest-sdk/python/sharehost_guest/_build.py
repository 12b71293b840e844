"""sharehost-build-py: builds a Python sharehost plugin into a WebAssembly component the host
accepts (contract ``sharehost:plugin@0.2.0``).

Usage: ``sharehost-build-py [--wasi stub|deny] [--http] [--no-cache] PLUGIN OUT.wasm [componentize-py options]``

- ``PLUGIN``: a plugin module file (``path/to/my_plugin.py``), or a directory holding
  ``plugin.py`` or exactly one other module (``test_*.py``, ``*_test.py``, ``conftest.py`` and
  ``setup.py`` do not count). Its directory is on the component's module path, so sibling
  modules import normally; add ``-p path/to/site-packages`` for pure-Python dependencies.
- ``--wasi``: how the WASI imports the host refuses are dealt with (default ``stub``, or
  ``$SHAREHOST_PY_WASI``); see the SDK's README.
- ``--http``: build with ``wasi:http`` (needed when the plugin uses ``sharehost_guest.http``).
  Without it the build finds out itself: a plugin module of the directory that imports
  ``sharehost_guest.http`` is built with it, and a build that meets the import elsewhere is
  made again with it. A component with ``wasi:http`` loads only in a pipeline that grants
  outbound hosts.

Module-level code runs once, at build time: the component starts from that snapshot. The
pinned toolchain is installed into a per-user cache the first time (``_toolchain``).

The same inputs give the same bytes: componentize-py 0.25.1 does not build the same bytes
twice (its build-time interpreter draws a random hash secret and file times into the snapshot,
and orders its WASI stubs by an unordered map, with no option to fix any of them), so a build
is kept under the digest of its inputs (the plugin's directory, the SDK, the flags, the
toolchain) in ``~/.cache/sharehost/py-builds`` and the same inputs are answered with its bytes:
a rebuild of unchanged source is instant and the host's compile cache keeps its entry.
``--no-cache`` builds anew.
"""

from __future__ import annotations

import ast
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Tuple

from . import _imports, _toolchain

SDK_DIR = pathlib.Path(__file__).resolve().parent.parent
WIT_DIR = pathlib.Path(__file__).resolve().parent / "wit"
WORLD_PACKAGE = "sharehost:guest-py"
RESERVED = {"wit_world", "sharehost_app", "sharehost_guest", "sharehost_build"}
#: Interfaces a component may import without a grant (host/runtime/src/validate.rs), and with
#: an HTTP grant; the build checks its output against them.
ALLOWED = (
    "sharehost:plugin/host@", "sharehost:plugin/outputs@", "sharehost:plugin/types@",
    "wasi:cli/stderr@", "wasi:io/error@", "wasi:io/poll@", "wasi:io/streams@",
    "wasi:clocks/monotonic-clock@", "wasi:clocks/wall-clock@", "wasi:random/random@",
    "wasi:random/insecure@", "wasi:random/insecure-seed@", "wasi:cli/environment@",
    "wasi:cli/exit@", "wasi:cli/stdin@", "wasi:cli/stdout@", "wasi:cli/terminal-input@",
    "wasi:cli/terminal-output@", "wasi:cli/terminal-stdin@", "wasi:cli/terminal-stdout@",
    "wasi:cli/terminal-stderr@",
)
ALLOWED_WITH_HTTP = ("wasi:http/types@", "wasi:http/outgoing-handler@")
#: The namespace the SDK's own WASI imports carry through a ``--wasi stub`` build (see
#: ``_imports``).
STUB_NAMESPACE = "sharehost-wasi"


#: Builds kept by their inputs' digest; the oldest go first.
KEPT_BUILDS = 16
#: Directories never part of a build's inputs: installs, caches and version control (the
#: component's own ``__pycache__`` writes would otherwise change the inputs of the next build).
NOT_INPUTS = {"__pycache__", ".venv", "venv", "node_modules", "target", ".git", ".pytest_cache"}
#: A directory larger than this is built without looking for a kept build: hashing it would
#: cost more than it saves.
MOST_INPUT_BYTES = 256 << 20


class BuildError(Exception):
    """A build that cannot go on; the message says why."""


def _usage() -> str:
    return (__doc__ or "").split("\n\n", 2)[1].strip()


def find_module(plugin: str) -> Tuple[pathlib.Path, str]:
    """The plugin's directory and module name."""
    path = pathlib.Path(plugin)
    if path.is_dir():
        directory = path.resolve()
        if (directory / "plugin.py").is_file():
            module = "plugin"
        else:
            candidates = sorted(
                p.name
                for p in directory.glob("*.py")
                if not (
                    p.name.startswith("test_")
                    or p.name.endswith("_test.py")
                    or p.name in ("conftest.py", "setup.py")
                )
            )
            if len(candidates) != 1:
                raise BuildError(
                    f"{plugin}: expected plugin.py or exactly one module, found: "
                    f"{' '.join(candidates) or 'none'}"
                )
            module = candidates[0][:-3]
    elif path.is_file() and path.suffix == ".py":
        directory = path.resolve().parent
        module = path.stem
    else:
        raise BuildError(f"{plugin} is neither a .py module nor a directory")
    if module in RESERVED:
        raise BuildError(f"rename {module}.py: the name is taken by the build")
    return directory, module


def uses_http(directory: pathlib.Path) -> bool:
    """Whether a module of the plugin's directory imports ``sharehost_guest.http`` (tests
    excluded): read with ``ast``, never run."""
    for path in directory.glob("*.py"):
        if path.name.startswith("test_") or path.name.endswith("_test.py"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(
                a.name == "sharehost_guest.http" for a in node.names
            ):
                return True
            if isinstance(node, ast.ImportFrom):
                if node.module == "sharehost_guest.http":
                    return True
                if node.module == "sharehost_guest" and any(a.name == "http" for a in node.names):
                    return True
    return False


def write_wit(into: pathlib.Path, namespace: str) -> None:
    """The WIT the component is built against: the contract, the SDK's two worlds, and the
    WASI interfaces they import under ``namespace`` (``wasi``, or ``sharehost-wasi`` for a stub
    build, renamed back afterwards)."""
    deps = into / "deps"
    deps.mkdir(parents=True)
    shutil.copy(WIT_DIR / "plugin.wit", deps / "plugin.wit")
    for package in sorted((WIT_DIR / "wasi").iterdir()):
        (deps / f"wasi-{package.name}").mkdir()
        for f in sorted(package.glob("*.wit")):
            text = re.sub(r"\bwasi:", f"{namespace}:", f.read_text(encoding="utf-8"))
            (deps / f"wasi-{package.name}" / f.name).write_text(text, encoding="utf-8")
    (into / "world.wit").write_text(
        f"""package {WORLD_PACKAGE};

/// A plugin, and the stream its SDK writes an uncaught exception to before it traps.
world plugin-py {{
  include sharehost:plugin/plugin@0.2.0;
  import {namespace}:cli/stderr@0.2.0;
}}

/// A plugin that calls granted hosts over HTTP.
world plugin-py-http {{
  include plugin-py;
  import {namespace}:http/outgoing-handler@0.2.0;
}}
""",
        encoding="utf-8",
    )


def componentize(
    cpy: pathlib.Path, work: pathlib.Path, directory: pathlib.Path, module: str, wasi: str,
    http: bool, extra: List[str], out: pathlib.Path,
) -> subprocess.CompletedProcess:
    """One componentize-py run (output captured, so a missing ``--http`` can be recognised)."""
    namespace = STUB_NAMESPACE if wasi == "stub" else "wasi"
    wit = work / f"wit-{wasi}-{int(http)}"
    if not wit.exists():
        write_wit(wit, namespace)
    # Tells the SDK glue which WASI and world it has (which guards and clients to install).
    (work / "sharehost_build.py").write_text(f'WASI = "{wasi}"\nHTTP = {http}\n')
    # The app module componentize-py wraps: the SDK glue first (it guards clocks, files and
    # run-time imports before the plugin binds them), then the plugin (imported at build time).
    (work / "sharehost_app.py").write_text(
        "from sharehost_guest._component import make_world\n"
        f"import {module} as _plugin_module\n\n"
        "WitWorld = make_world(_plugin_module)\n"
    )
    world = f"{WORLD_PACKAGE}/plugin-py{'-http' if http else ''}"
    cmd = [
        str(cpy), "-q", "-d", str(wit), "-w", world,
        "--import-interface-name", "sharehost:plugin/types@0.2.0=types",
    ]
    if http:
        cmd += ["--import-interface-name", f"{namespace}:http/types@0.2.0=http_types"]
    cmd += ["componentize", "sharehost_app", "-p", str(work), "-p", str(directory),
            "-p", str(SDK_DIR), *extra, "-o", str(out)]
    if wasi == "stub":
        cmd.append("--stub-wasi")
    # The plugin's own directory is where it imports from; the SDK is always this copy.
    # componentize-py puts the site-packages of $VIRTUAL_ENV, or without one those of the
    # Python it finds on PATH, on the component's module path: a build would take whatever
    # the building machine happens to have installed. An empty venv directory gives it none;
    # a plugin's own dependencies come with `-p`.
    env = dict(os.environ)
    no_packages = work / "no-site-packages"
    no_packages.mkdir(exist_ok=True)
    env["VIRTUAL_ENV"] = str(no_packages)
    # componentize-py is Rust: with these set, a mistake in the plugin came buried under its
    # stack (30 frames and more); the author needs the plugin's Python traceback alone.
    env.pop("RUST_BACKTRACE", None)
    env.pop("RUST_LIB_BACKTRACE", None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)


def deny_filesystem_and_sockets(tools: pathlib.Path, work: pathlib.Path, full: pathlib.Path,
                                out: pathlib.Path) -> None:
    """``--wasi deny``: plugs a component exporting exactly the ``wasi:filesystem`` and
    ``wasi:sockets`` interfaces the build imports, whose functions trap."""
    run = lambda *a: subprocess.run([str(x) for x in a], check=True, capture_output=True)  # noqa: E731
    run(tools / "wasm-tools", "component", "wit", full, "--out-dir", work / "full-wit")
    deny = work / "deny"
    (deny / "deps").mkdir(parents=True)
    for f in (work / "full-wit" / "deps").glob("*.wit"):
        if f.name != "plugin.wit":
            shutil.copy(f, deny / "deps" / f.name)
    component_wit = (work / "full-wit" / "component.wit").read_text()
    denied = sorted(set(re.findall(r"import (wasi:(?:filesystem|sockets)/[a-z-]+@[0-9.]+)", component_wit)))
    if not denied:
        shutil.copy(full, out)
        return
    (deny / "deny.wit").write_text(
        "package sharehost:wasi-deny;\nworld deny {\n"
        + "".join(f"  export {i};\n" for i in denied)
        + "}\n"
    )
    run(tools / "wasm-tools", "component", "embed", "--dummy", deny, "-w", "deny", "-o", work / "deny.core.wasm")
    run(tools / "wasm-tools", "component", "new", work / "deny.core.wasm", "-o", work / "deny.wasm")
    run(tools / "wac", "plug", full, "--plug", work / "deny.wasm", "-o", out)


def inputs_digest(directories: List[pathlib.Path], settings: str) -> Optional[str]:
    """The SHA-256 of what a build reads: every file under ``directories`` (but
    :data:`NOT_INPUTS` and built components), by relative path and content, and ``settings``;
    ``None`` when they hold more than :data:`MOST_INPUT_BYTES`."""
    h = hashlib.sha256(settings.encode())
    total = 0
    for index, top in enumerate(directories):
        files = []
        for root, dirs, names in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in NOT_INPUTS)
            files.extend(pathlib.Path(root) / n for n in names if not n.endswith((".wasm", ".pyc")))
        for f in sorted(files):
            data = f.read_bytes()
            total += len(data)
            if total > MOST_INPUT_BYTES:
                return None
            rel = f.relative_to(top).as_posix()
            h.update(f"\0{index}\0{rel}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()


def _kept_builds() -> pathlib.Path:
    return _toolchain.cache_root() / "py-builds"


def _keep(digest: str, component: bytes) -> None:
    """Keeps ``component`` as the build of ``digest``, dropping the oldest past
    :data:`KEPT_BUILDS`. A failure to keep is not the build's failure."""
    try:
        kept = _kept_builds()
        kept.mkdir(parents=True, exist_ok=True)
        part = kept / f"{digest}.wasm.{os.getpid()}"
        part.write_bytes(component)
        part.replace(kept / f"{digest}.wasm")
        builds = sorted(kept.glob("*.wasm"), key=lambda f: f.stat().st_mtime, reverse=True)
        for old in builds[KEPT_BUILDS:]:
            old.unlink(missing_ok=True)
    except OSError as e:
        sys.stderr.write(f"build: the build is not kept for the next one ({e})\n")


def build(plugin: str, out: str, wasi: str = "stub", http: Optional[bool] = None,
          extra: Optional[List[str]] = None, fresh: bool = False) -> pathlib.Path:
    """Builds ``plugin`` into ``out`` (the kept build of the same inputs unless ``fresh``);
    returns the path written."""
    if wasi not in ("stub", "deny"):
        raise BuildError(f"--wasi must be stub or deny (got '{wasi}')")
    directory, module = find_module(plugin)
    venv = _toolchain.ensure(with_wasm_tools=(wasi == "deny"))
    cpy = venv / "bin" / "componentize-py"
    out_path = pathlib.Path(out).resolve()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    extra_dirs = [pathlib.Path(p) for flag, p in zip(extra or [], (extra or [])[1:])
                  if flag in ("-p", "--python-path") and pathlib.Path(p).is_dir()]
    digest = None if fresh else inputs_digest(
        [directory, SDK_DIR / "sharehost_guest", *extra_dirs],
        f"componentize-py {_toolchain.COMPONENTIZE_PY}\nmodule {module}\nwasi {wasi}\n"
        f"http {http}\nextra {extra or []}\n",
    )
    if digest is not None:
        kept = _kept_builds() / f"{digest}.wasm"
        if kept.is_file():
            component = kept.read_bytes()
            out_path.write_bytes(component)
            kept.touch()
            sys.stderr.write(
                f"build: {out} (inputs unchanged: the bytes built from them before, "
                f"{len(component)} bytes, {time.monotonic() - started:.1f} s; --no-cache builds anew)\n"
            )
            return out_path
    with_http = uses_http(directory) if http is None else http
    with tempfile.TemporaryDirectory(prefix="sharehost-build-py-") as tmp:
        work = pathlib.Path(tmp)
        raw = work / "raw.wasm"
        result = componentize(cpy, work, directory, module, wasi, with_http, extra or [], raw)
        if result.returncode != 0 and not with_http and _needs_http(result):
            with_http = True
            result = componentize(cpy, work, directory, module, wasi, True, extra or [], raw)
        if result.returncode != 0:
            sys.stderr.write(failure_text(result.stdout + result.stderr))
            raise BuildError(f"componentize-py failed ({result.returncode})")
        sys.stderr.write(result.stdout)
        if wasi == "stub":
            component, _ = _imports.rename_imports(raw.read_bytes(), f"{STUB_NAMESPACE}:", "wasi:")
        else:
            plugged = work / "plugged.wasm"
            deny_filesystem_and_sockets(venv / "bin", work, raw, plugged)
            component = plugged.read_bytes()
        allowed = ALLOWED + (ALLOWED_WITH_HTTP if with_http else ())
        refused = [
            i for i in _imports.import_names(component)
            if ":" in i and not i.startswith(allowed)
        ]
        if refused:
            raise BuildError(f"the component imports {', '.join(refused)}, which the host refuses")
        out_path.write_bytes(component)
    if digest is not None:
        _keep(digest, component)
    took = time.monotonic() - started
    sys.stderr.write(
        f"build: {out} (--wasi {wasi}{', wasi:http' if with_http else ''}, "
        f"{out_path.stat().st_size} bytes, {took:.1f} s)\n"
    )
    return out_path


def failure_text(output: str) -> str:
    """componentize-py's failure as the author needs it: the Python traceback of importing the
    plugin (its own frames and the error), without componentize-py's frames around it or a Rust
    backtrace; any other failure as componentize-py said it, backtrace cut."""
    text = output.split("\nStack backtrace:", 1)[0]
    marker = "AssertionError: Traceback (most recent call last):"
    if marker in text:
        inner = text.split(marker, 1)[1].split("\nCaused by:", 1)[0]
        return "Traceback (most recent call last):" + inner.rstrip() + "\n"
    return text.rstrip() + "\n"


def _needs_http(result: subprocess.CompletedProcess) -> bool:
    from .http import NEEDS_HTTP

    return NEEDS_HTTP in result.stdout or NEEDS_HTTP in result.stderr


def main(argv=None) -> int:
    """The command line (see the module's doc)."""
    args = list(sys.argv[1:] if argv is None else argv)
    wasi = os.environ.get("SHAREHOST_PY_WASI", "stub")
    http: Optional[bool] = None
    fresh = False
    while args and (args[0] in ("--wasi", "--http", "--no-cache") or args[0].startswith("--wasi=")):
        a = args.pop(0)
        if a == "--http":
            http = True
        elif a == "--no-cache":
            fresh = True
        elif a == "--wasi":
            wasi = args.pop(0) if args else ""
        else:
            wasi = a.split("=", 1)[1]
    if len(args) < 2 or args[0] in ("-h", "--help"):
        print(_usage(), file=sys.stderr)
        return 2
    try:
        build(args[0], args[1], wasi, http, args[2:], fresh)
    except BuildError as e:
        print(f"build: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        detail = (e.stderr or b"").decode("utf-8", "replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        print(f"build: {' '.join(map(str, e.cmd))} failed: {detail}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
