"""Compares the Python order validator's price handling with the Rust component's, on random
number literals; with --write, stores the Rust answers in ``prices.jsonl`` (next to this file)
for ``test_order_validator.py``, which then checks them without Rust.

Why: the price reason prints the double serde_json reads, formatted like Rust's ``{}``; both
have quirks (serde_json is not correctly rounded without ``float_roundtrip``, Rust breaks
formatting ties away from zero) that only the Rust component itself can confirm.

Usage, from the repository root (needs the host and target/guests/order_validator.wasm, e.g.
``cargo build --release -p sharehost`` and ``dev/build-guests``):

    python3 examples/python/order-validator/testdata/rust_prices.py [--count N] [--seed S]
        [--host target/release/sharehost] [--component target/guests/order_validator_py.wasm]
        [--write]

It always compares the Rust verdicts with this directory's ``order_validator.py`` run
natively; with --component also with that (Python) component. Prints the number of literals
and of differences (and the first few); exits 1 on any difference.
"""

import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(PLUGIN_DIR)))
sys.path[:0] = [PLUGIN_DIR, os.path.join(ROOT, "guest-sdk", "python")]

from order_validator import _exact_decimal, serde_f64  # noqa: E402

from sharehost_guest import testing  # noqa: E402


def order(literal: str) -> str:
    """The order (a JSON text) whose price is ``literal``; everything else is valid."""
    return '{"id":"o","sku":"A","quantity":1,"price":%s}' % literal


def _digits(rng, n):
    return str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(n - 1))


def _long_decimal(rng):
    # 16-30 digits, the point anywhere (or after leading zeros), sometimes an exponent.
    d = _digits(rng, rng.randint(16, 30))
    p = rng.randint(-3, len(d))
    if p <= 0:
        lit = "0." + "0" * -p + d
    elif p == len(d):
        lit = d
    else:
        lit = d[:p] + "." + d[p:]
    if rng.random() < 0.3:
        lit += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 330))
    return lit


def _random_double(rng):
    while True:
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(63)))[0]
        if x == x and x != float("inf"):
            return x


def _repr_literal(rng):
    # Python's shortest digits of a random double (JSON accepts its `e+16` form).
    return repr(_random_double(rng))


def _exact_literal(rng):
    # The exact decimal value of a random double of moderate size: many digits.
    x = rng.uniform(1.0, 2.0) * 2.0 ** rng.randint(-80, 120)
    digits, exp = _exact_decimal(x)
    return f"{digits}e{exp}"


def _tie(rng):
    # A double exactly halfway between two shortest candidates (Python's repr picks the even
    # one, Rust the larger), written so serde_json reads exactly that double. Only doubles
    # below 2**52 with a few fractional bits can be ties: at and above it a double is a
    # multiple of its ulp 2**k, a tie has a 5 at 10**(p-1) (so 2**p does not divide it: p > k)
    # with candidates 10**p apart that fit within the ulp (10**p <= 2**k): impossible.
    while True:
        binade = rng.randint(15, 51)
        j = rng.randint(1, 52 - binade)  # fractional bits kept, the last one set
        x = (2 * int(rng.uniform(1.0, 2.0) * 2 ** (binade + j - 1)) + 1) / 2**j
        digits, exp = _exact_decimal(x)
        shortest = repr(x).split("e")[0].replace(".", "").lstrip("0").rstrip("0")
        if digits == shortest + "5":
            lit = f"{digits}e{exp}"
            if serde_f64(lit) == x:
                return lit


def _quirk(rng):
    # Hand-shaped corners: u64 edges, long integers with fractions, extreme exponents,
    # subnormals, the overflow edge, many leading fraction zeros.
    u = 2**64 - 1 + rng.randint(-3, 3)
    return rng.choice(
        [
            f"{u}",
            f"{u}.{rng.randint(0, 99)}",
            f"{u}{rng.randint(0, 9)}.{rng.randint(0, 9)}",
            f"{_digits(rng, rng.randint(20, 40))}.{_digits(rng, rng.randint(1, 10))}",
            f"1.79769313486231{rng.randint(50, 99)}e308",
            f"{_digits(rng, rng.randint(1, 20))}e-{rng.randint(300, 420)}",
            f"0.{'0' * rng.randint(0, 400)}{_digits(rng, rng.randint(1, 25))}",
            f"0.{'0' * rng.randint(1, 30)}e{rng.randint(300, 5000)}",
            f"{_digits(rng, rng.randint(1, 20))}e{rng.choice(['', '-'])}{rng.randint(2**31 - 400, 2**31 + 3)}",
            f"{_digits(rng, rng.randint(1, 4))}.{_digits(rng, 3)}e{rng.randint(305, 309)}",
            f"{_digits(rng, 19)}{'0' * rng.randint(0, 300)}",
            repr(rng.uniform(0, 1) * 5e-324 * rng.randint(1, 2**20)),
        ]
    )


KINDS = [_long_decimal, _repr_literal, _exact_literal, _tie, _quirk]


def literals(count: int, seed: int):
    """``count`` price literals, mostly negative (so the reason prints the price), cycling
    through every kind of hard case; the same for the same seed."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        lit = KINDS[i % len(KINDS)](rng)
        out.append(lit if rng.random() < 0.1 else "-" + lit)
    return out


def run_component(host: str, component: str, lits) -> list:
    """The reason (None for accept) the component gives for each literal's order."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i, lit in enumerate(lits):
            f.write(json.dumps({"offset": i, "value": order(lit)}) + "\n")
        path = f.name
    try:
        out = subprocess.run(
            [host, "test-plugin", component, "--input", path],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        os.unlink(path)
    lines = [json.loads(line) for line in out.splitlines() if '"verdict"' in line]
    assert len(lines) == len(lits), f"{len(lines)} verdicts for {len(lits)} records"
    return [line["reason"] for line in lines]


def python_reasons(lits) -> list:
    """The reason (None for accept) the native Python validator gives for each literal."""
    from order_validator import OrderValidator

    testing.echo_logs(False)
    v = testing.instantiate(OrderValidator)
    out = [v.check(order(lit).encode()) for lit in lits]
    testing.reset()
    return out


def main():
    """Runs the comparison (and --write); see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=932)
    ap.add_argument("--host", default=os.path.join(ROOT, "target", "release", "sharehost"))
    ap.add_argument("--rust", default=os.path.join(ROOT, "target", "guests", "order_validator.wasm"))
    ap.add_argument("--component", help="a Python order-validator component to compare too")
    ap.add_argument("--write", action="store_true", help="store the Rust answers in prices.jsonl")
    args = ap.parse_args()

    lits = literals(args.count, args.seed)
    rust = run_component(args.host, args.rust, lits)
    others = {"native Python": python_reasons(lits)}
    if args.component:
        others[args.component] = run_component(args.host, args.component, lits)
    bad = 0
    for name, got in others.items():
        diff = [(lit, r, g) for lit, r, g in zip(lits, rust, got) if r != g]
        bad += len(diff)
        print(f"{name}: {len(lits)} literals, {len(diff)} differ from Rust")
        for lit, r, g in diff[:5]:
            print(f"  {lit[:80]}: Rust {r!r:.120}, got {g!r:.120}")
    if args.write:
        with open(os.path.join(HERE, "prices.jsonl"), "w") as f:
            for lit, r in zip(lits, rust):
                f.write(json.dumps({"price": lit, "rust": r}) + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
