#!/usr/bin/env python3
"""Shows a cargo build's diagnostics and fails it when the workspace's code warns.

dev/test builds the tests once, with clippy's driver as the workspace's compiler wrapper
(RUSTC_WORKSPACE_WRAPPER), so that the one build both links the test binaries and runs the
lints: a separate `cargo clippy` would check every dependency a second time (about six CPU
minutes from nothing on a 2-core machine). `cargo clippy -- -D warnings` turns a warning into an
error through an argument clippy keeps private; this reads cargo's JSON messages instead, which
cargo replays for a crate it finds built, so a warning fails every run until it is fixed.

Usage: cargo build --message-format=json ... | dev/build_warnings.py
Exits 1 when cargo's build failed, 2 when it built but a crate warned (dependencies are built with
their lints capped, so every warning is the workspace's: dev/test runs the tests then, and fails
at the end), 0 otherwise.
"""

import json
import sys


def scan(lines, out):
    """Prints each diagnostic as cargo renders it; returns (warnings, errors, build succeeded)."""
    warnings = errors = 0
    succeeded = None
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            # cargo prints only JSON on stdout with --message-format=json; anything else (a
            # build script's stray output) is shown as it came.
            out.write(line + "\n")
            continue
        reason = message.get("reason")
        if reason == "compiler-message":
            diagnostic = message.get("message") or {}
            level = diagnostic.get("level")
            if level == "warning":
                warnings += 1
            elif level in ("error", "error: internal compiler error"):
                errors += 1
            rendered = diagnostic.get("rendered")
            if rendered:
                out.write(rendered if rendered.endswith("\n") else rendered + "\n")
        elif reason == "build-finished":
            succeeded = bool(message.get("success"))
    return warnings, errors, succeeded


def main():
    warnings, errors, succeeded = scan(sys.stdin, sys.stdout)
    if succeeded is False or errors:
        print(f"dev/build_warnings.py: the build failed ({errors} errors, {warnings} warnings)", file=sys.stderr)
        return 1
    if succeeded is None:
        print("dev/build_warnings.py: cargo ended without a build-finished message", file=sys.stderr)
        return 1
    if warnings:
        print(f"dev/build_warnings.py: {warnings} warnings (lints deny them: fix each, or allow it where it is wrong)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
