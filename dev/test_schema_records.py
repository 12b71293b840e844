#!/usr/bin/env python3
"""Tests of dev/schema_records.py against the real registry dev/registry runs: standard library only (the program
installs its own venv), run as `python3 dev/test_schema_records.py` (or by pytest).

The registry is one of these tests' own, on ports and a state dir of its own (TEST_REGISTRY_PORT, 28081, and the two
ports after it; target/registry-test), started once for the class and stopped at the end. When it cannot be started (no
Java 21+, no download, a port taken) every test FAILS: none is skipped. The orders are tests/fixtures/schemas'.
"""

import base64
import json
import os
import pathlib
import subprocess
import sys
import unittest
import urllib.request

DEV = pathlib.Path(__file__).resolve().parent
REPO = DEV.parent
TOOL = DEV / "schema_records.py"
SCHEMAS = REPO / "tests" / "fixtures" / "schemas"
PORT = int(os.environ.get("TEST_REGISTRY_PORT") or 28081)
REGISTRY_ENV = {
    "REGISTRY_PORT": str(PORT),
    "REGISTRY_MANAGEMENT_PORT": str(PORT + 1),
    "REGISTRY_TLS_PORT": str(PORT + 2),
    "SHAREHOST_REGISTRY_DIR": str(REPO / "target" / "registry-test"),
}
URL = f"http://127.0.0.1:{PORT}/apis/ccompat/v7"
FILES = {"avro": "order.avsc", "protobuf": "order.proto", "json-schema": "order.schema.json"}
ORDERS = [json.loads(line) for line in (SCHEMAS / "orders.jsonl").read_text().splitlines() if line.strip()]


def registry(*args, timeout=600):
    env = {**os.environ, **REGISTRY_ENV}
    return subprocess.run([str(DEV / "registry"), *args], capture_output=True, text=True, env=env, timeout=timeout)


def tool(*args, stdin="", timeout=600):
    """dev/schema_records.py ARGS against this test's registry (its first run installs the venv)."""
    return subprocess.run([sys.executable, str(TOOL), *args, "--registry", URL], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def ok(test, out):
    test.assertEqual(out.returncode, 0, f"exit {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}")
    return out.stdout


def lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def latest(subject):
    """The subject's latest version as the registry answers it (id, version, schemaType)."""
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    auth = base64.b64encode(b"sharehost:" + (os.environ.get("REGISTRY_PASSWORD") or "registry-secret").encode())
    request = urllib.request.Request(f"{URL}/subjects/{subject}/versions/latest",
                                     headers={"Authorization": f"Basic {auth.decode()}"})
    with no_proxy.open(request, timeout=30) as r:
        return json.load(r)


class SchemaRecords(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Registered before `up`, so a registry that started only in part is stopped too.
        cls.addClassCleanup(registry, "down")
        # The tool's venv installs while the registry starts (both one time: a download each).
        setup = subprocess.Popen([sys.executable, str(TOOL), "setup"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        out = registry("up")
        _, setup_err = setup.communicate(timeout=600)
        if setup.returncode != 0:
            raise AssertionError(f"dev/schema_records.py setup failed (exit {setup.returncode}):\n{setup_err}")
        if out.returncode != 0:
            raise AssertionError(f"dev/registry up failed (exit {out.returncode}); the tests need a real registry:\n"
                                 f"{out.stdout}{out.stderr}")

    def encode(self, fmt, topic):
        schema = str(SCHEMAS / FILES[fmt])
        orders = "".join(json.dumps(o) + "\n" for o in ORDERS)
        return ok(self, tool("encode", "--format", fmt, "--schema", schema, "--topic", topic, "--key-field", "id",
                             stdin=orders))

    def test_each_format_round_trips_three_orders_through_the_confluent_serdes(self):
        for fmt in FILES:
            with self.subTest(fmt):
                topic = f"orders-{fmt}"
                records = lines(self.encode(fmt, topic))
                self.assertEqual([r["key"] for r in records], ["o-1", "o-2", "o-3"])
                # The serializer registered the schema under the topic name strategy's subject, and framed every
                # value with that id: magic byte 0, the id big-endian, (Protobuf) the message indexes, the payload.
                registered = latest(f"{topic}-value")
                self.assertEqual(registered.get("schemaType", "AVRO"), {"avro": "AVRO", "protobuf": "PROTOBUF",
                                                                        "json-schema": "JSON"}[fmt])
                for r in records:
                    value = base64.b64decode(r["value"]["base64"])
                    self.assertEqual(value[0], 0)
                    self.assertEqual(int.from_bytes(value[1:5], "big"), registered["id"])
                    if fmt == "protobuf":
                        self.assertEqual(value[5], 0, "the first message's index array is the single byte 0")
                decoded = ok(self, tool("decode", "--format", fmt, "--schema", str(SCHEMAS / FILES[fmt]),
                                        "--topic", topic, "--with-schema-id",
                                        stdin="".join(json.dumps(r) + "\n" for r in records)))
                self.assertEqual([d["value"] for d in lines(decoded)], ORDERS)
                self.assertEqual({d["schema_id"] for d in lines(decoded)}, {registered["id"]})

    def test_register_prints_the_id_and_again_the_same(self):
        for fmt in FILES:
            with self.subTest(fmt):
                args = ("register", "--format", fmt, "--schema", str(SCHEMAS / FILES[fmt]), "--topic", f"reg-{fmt}")
                first = json.loads(ok(self, tool(*args)))
                self.assertEqual(first["subject"], f"reg-{fmt}-value")
                self.assertEqual(first["version"], 1)
                self.assertEqual(json.loads(ok(self, tool(*args))), first)
                self.assertEqual(latest(f"reg-{fmt}-value")["id"], first["id"])

    def test_avro_and_json_schema_decode_with_the_writer_schema_from_the_registry_alone(self):
        for fmt in ("avro", "json-schema"):
            with self.subTest(fmt):
                records = self.encode(fmt, f"writer-{fmt}")
                decoded = ok(self, tool("decode", "--format", fmt, "--topic", f"writer-{fmt}", stdin=records))
                self.assertEqual(lines(decoded), ORDERS)

    def test_decode_reads_values_as_sharehost_consume_prints_them(self):
        # consume prints a value that is valid UTF-8 as text (a JSON Schema record is), other bytes as base64, and
        # a null value as null; decode writes null for it.
        consumed = ""
        for offset, r in enumerate(lines(self.encode("json-schema", "consumed"))):
            text = base64.b64decode(r["value"]["base64"]).decode("utf-8")
            consumed += json.dumps({"topic": "consumed", "partition": 0, "offset": offset, "timestamp": 0,
                                    "key": r["key"], "value": text, "headers": []}) + "\n"
        consumed += json.dumps({"topic": "consumed", "partition": 0, "offset": 3, "value": None}) + "\n"
        decoded = ok(self, tool("decode", "--format", "json-schema", "--topic", "consumed", stdin=consumed))
        self.assertEqual(lines(decoded), [*ORDERS, None])

    def test_a_value_that_is_not_valid_is_refused_naming_its_line(self):
        bad = json.dumps({"id": "o-9", "amount": "lots", "customer": "dan", "quantity": 1})
        for fmt in FILES:
            with self.subTest(fmt):
                out = tool("encode", "--format", fmt, "--schema", str(SCHEMAS / FILES[fmt]), "--topic", f"bad-{fmt}",
                           stdin=json.dumps(ORDERS[0]) + "\n" + bad + "\n")
                self.assertEqual(out.returncode, 1, out.stderr)
                self.assertIn("stdin line 2:", out.stderr)

    def test_a_record_of_an_unknown_schema_id_is_refused(self):
        record = json.loads(self.encode("avro", "unknown").splitlines()[0])
        value = bytearray(base64.b64decode(record["value"]["base64"]))
        value[1:5] = (999999).to_bytes(4, "big")
        for fmt in ("avro", "protobuf"):
            with self.subTest(fmt):
                out = tool("decode", "--format", fmt, "--schema", str(SCHEMAS / FILES[fmt]),
                           stdin=json.dumps({"value": {"base64": base64.b64encode(value).decode()}}) + "\n")
                self.assertEqual(out.returncode, 1, out.stdout)
                self.assertIn("stdin line 1:", out.stderr)

    def test_registry_up_again_is_a_no_op_and_status_says_it_runs(self):
        again = registry("up")
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("already running", again.stdout)
        self.assertIn(f"url: {URL}", again.stdout)
        status = registry("status")
        self.assertEqual(status.returncode, 0, status.stdout + status.stderr)
        self.assertEqual(registry("url").stdout.strip(), URL)


if __name__ == "__main__":
    unittest.main()
