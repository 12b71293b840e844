"""The pinned Python plugin toolchain, installed once into a per-user cache (never into a
checkout or a plugin's directory) and shared by every plugin and every copy of the SDK.

Usage: ``python -m sharehost_guest._toolchain [--with-pytest] [--with-wasm-tools]``: installs
what is missing and prints the venv's directory.

Where: ``$SHAREHOST_PY_TOOLCHAIN`` when set, else
``${XDG_CACHE_HOME:-~/.cache}/sharehost/py-toolchain/componentize-py-0.25.1``. What:
componentize-py==0.25.1 from PyPI; with ``--with-pytest`` pytest==9.2.0; with
``--with-wasm-tools`` wasm-tools==1.254.0 and wac-cli==0.8.1 (``cargo install --locked``, for
``--wasi deny`` builds; about 10 minutes once, needs cargo). Needs a Python >= 3.9 with
``venv`` and ``pip`` (``$PYTHON`` picks another interpreter for the venv) the first time.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

COMPONENTIZE_PY = "0.25.1"
PYTEST = "9.2.0"
WASM_TOOLS = "1.254.0"
WAC = "0.8.1"


def cache_root() -> pathlib.Path:
    """The per-user cache every sharehost toolchain goes into."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "sharehost"


def location() -> pathlib.Path:
    """The venv of the pinned toolchain."""
    explicit = os.environ.get("SHAREHOST_PY_TOOLCHAIN")
    if explicit:
        return pathlib.Path(explicit)
    return cache_root() / "py-toolchain" / f"componentize-py-{COMPONENTIZE_PY}"


def _say(message: str) -> None:
    print(f"toolchain: {message}", file=sys.stderr)


def _version(cmd) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return (out.stdout + out.stderr).strip()


def ensure(with_pytest: bool = False, with_wasm_tools: bool = False) -> pathlib.Path:
    """Installs whatever of the toolchain is missing; returns the venv directory."""
    venv = location()
    python = venv / "bin" / "python"
    if not python.exists():
        _say(f"creating a venv in {venv}")
        venv.parent.mkdir(parents=True, exist_ok=True)
        interpreter = os.environ.get("PYTHON") or shutil.which("python3") or sys.executable
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)

    def pip(spec: str) -> None:
        _say(f"installing {spec} into {venv}")
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", spec],
            check=True,
        )

    if _version([str(venv / "bin" / "componentize-py"), "--version"]) != (
        f"componentize-py {COMPONENTIZE_PY}"
    ):
        pip(f"componentize-py=={COMPONENTIZE_PY}")
    if with_pytest and _version([str(python), "-m", "pytest", "--version"]) != f"pytest {PYTEST}":
        pip(f"pytest=={PYTEST}")
    if with_wasm_tools:
        for crate, binary, version in (
            ("wasm-tools", "wasm-tools", WASM_TOOLS),
            ("wac-cli", "wac", WAC),
        ):
            if _version([str(venv / "bin" / binary), "--version"]) != f"{crate} {version}":
                _say(f"cargo install {crate}@{version} into {venv}")
                subprocess.run(
                    ["cargo", "install", "--quiet", "--locked", "--root", str(venv), crate,
                     "--version", version],
                    check=True,
                )
    return venv


def main(argv=None) -> int:
    """Command line: ``[--with-pytest] [--with-wasm-tools]``; prints the venv directory."""
    args = sys.argv[1:] if argv is None else argv
    unknown = [a for a in args if a not in ("--with-pytest", "--with-wasm-tools")]
    if unknown:
        _say(f"unknown option {unknown[0]}")
        return 2
    venv = ensure("--with-pytest" in args, "--with-wasm-tools" in args)
    print(venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
