#!/usr/bin/env python3
"""dev/traces.py: wait until a trace receiver holds the spans a test expects, then print them as JSON.

    dev/traces.py wait --trace-id HEX [--spans N] [--timeout S] [--format json|tree]
    dev/traces.py wait --service NAME [--spans N] [--since S] ...
    dev/traces.py wait ... [--query-url URL | --otlp-file PATH]

It polls the receiver until the trace (or the service's traces, together) has at least N spans, or the deadline
(--timeout, default 60 s) passes: exit 0 and the spans on stdout; exit 1 with what was seen on stderr. The spans come
separately from the exporter's batches, so a count is the only end to wait for; a test that expects exactly N checks
the printed list itself.

Where the spans come from (the first that applies):
  * --query-url URL: Jaeger's query API (dev/jaeger). Its API v3 (/api/v3/traces/{id}?raw_traces=true,
    /api/v3/traces?query.service_name=...&query.raw_traces=true) answers in OTLP's own JSON, so what is printed is
    what the exporter sent, not Jaeger's model of it (no span.kind or otel.* tags added, links kept as links, no
    adjustments: see JaegerSource).
  * --otlp-file PATH: the JSON lines an OpenTelemetry Collector's file exporter writes (dev/otelcol: one
    ExportTraceServiceRequest a line), read again on each poll; the same OTLP JSON, so the same output.
  * $JAEGER_QUERY_URL, then $OTELCOL_SPANS_FILE.
  * The receiver that is up in this checkout: the env file `dev/jaeger up` or `dev/otelcol up` wrote once it answered
    (target/jaeger/jaeger.env, target/otelcol/otelcol.env, or under $SHAREHOST_JAEGER_DIR / $SHAREHOST_OTELCOL_DIR);
    `down` deletes it. Both up at once (on other ports) is ambiguous: then name one.

Each span printed (a JSON list, ordered by start time, then span id):
  {"trace_id": 32 hex, "span_id": 16 hex, "parent_span_id": 16 hex or null, "name", "kind" ("INTERNAL", "SERVER",
   "CLIENT", "PRODUCER", "CONSUMER" or "UNSPECIFIED"), "service" (resource service.name), "scope" (instrumentation
   scope name), "start_unix_nano", "end_unix_nano", "status" {"code": "UNSET"|"OK"|"ERROR", "message"},
   "attributes" {key: value}, "links" [{"trace_id", "span_id", "attributes"}]}
Attribute values are JSON values: strings, numbers (OTLP's int64 as a JSON number), booleans, lists, objects; bytes as
base64 text.

A Rust test can run this (`python3 dev/traces.py wait --trace-id ... --spans 3`) and parse stdout, or do the same
itself: with Jaeger, GET /api/v3/traces/{trace_id}?raw_traces=true until it answers 200 with N spans in
result.resourceSpans[].scopeSpans[].spans[]; with the collector, read the file again until its lines (each a JSON object
with resourceSpans[].scopeSpans[].spans[]; skip a last line still being written) hold N spans with that traceId. Ids
are hex, int64 values (intValue, the *UnixNano times) are JSON strings, kind and status.code are numbers.

--format tree prints the spans as an indented tree (children under their parent) for a person.
Standard library only.
"""

import argparse
import base64
import binascii
import datetime
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

NAME = "dev/traces.py"
REPO = Path(os.path.abspath(os.path.dirname(__file__))).parent
POLL_S = 0.2

SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}


class Die(Exception):
    pass


# --- OTLP JSON --------------------------------------------------------------------------------------------------------


def hex_id(value, size):
    """An OTLP JSON id as lower-case hex of SIZE bytes, or None when empty. The OTLP/JSON encoding says hex; protobuf's
    canonical JSON says base64: both are read, so a receiver that uses either works."""
    if not value:
        return None
    if re.fullmatch(r"[0-9a-fA-F]+", value) and len(value) == 2 * size:
        text = value.lower()
    else:
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise Die(f"cannot read id '{value}': neither {2 * size} hex digits nor base64")
        if len(raw) != size:
            raise Die(f"id '{value}' has {len(raw)} bytes, not {size}")
        text = raw.hex()
    return None if set(text) == {"0"} else text


def any_value(v):
    """An OTLP AnyValue ({"stringValue": ...}, {"intValue": "7"}, ...) as a plain JSON value."""
    if not isinstance(v, dict) or not v:
        return None
    if "stringValue" in v:
        return v["stringValue"]
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "arrayValue" in v:
        return [any_value(x) for x in (v["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in v:
        return attributes((v["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


def attributes(kvs):
    return {kv.get("key", ""): any_value(kv.get("value")) for kv in kvs or []}


def enum(value, names, prefix):
    """An OTLP enum that JSON writers spell as a number (2) or as its name ("SPAN_KIND_SERVER")."""
    if isinstance(value, str) and not value.isdigit():
        return value.removeprefix(prefix)
    return names.get(int(value or 0), str(value))


def spans_of(traces_data):
    """The spans of an OTLP TracesData / ExportTraceServiceRequest JSON object, flattened (see the module doc)."""
    out = []
    for rs in traces_data.get("resourceSpans") or []:
        resource = attributes((rs.get("resource") or {}).get("attributes"))
        for ss in rs.get("scopeSpans") or []:
            scope = (ss.get("scope") or {}).get("name", "")
            for s in ss.get("spans") or []:
                status = s.get("status") or {}
                out.append({
                    "trace_id": hex_id(s.get("traceId"), 16),
                    "span_id": hex_id(s.get("spanId"), 8),
                    "parent_span_id": hex_id(s.get("parentSpanId"), 8),
                    "name": s.get("name", ""),
                    "kind": enum(s.get("kind"), SPAN_KINDS, "SPAN_KIND_"),
                    "service": resource.get("service.name"),
                    "scope": scope,
                    "start_unix_nano": int(s.get("startTimeUnixNano") or 0),
                    "end_unix_nano": int(s.get("endTimeUnixNano") or 0),
                    "status": {"code": enum(status.get("code"), STATUS_CODES, "STATUS_CODE_"),
                               "message": status.get("message", "")},
                    "attributes": attributes(s.get("attributes")),
                    "links": [
                        {"trace_id": hex_id(link.get("traceId"), 16), "span_id": hex_id(link.get("spanId"), 8),
                         "attributes": attributes(link.get("attributes"))}
                        for link in s.get("links") or []
                    ],
                })
    return out


def dedup_sorted(spans):
    """One entry per (trace, span) id, ordered by start time: a file exporter may hold a span twice (an exporter's
    retry), and the order of a receiver's answer is its own."""
    seen = {}
    for s in spans:
        seen.setdefault((s["trace_id"], s["span_id"]), s)
    return sorted(seen.values(), key=lambda s: (s["start_unix_nano"], s["span_id"] or ""))


# --- sources ----------------------------------------------------------------------------------------------------------


def env_value(path, key):
    """KEY's value in an env file, or None."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(f"{key}="):
                return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


def default_source(since_s):
    """The source when none is named (see the module doc)."""
    if os.environ.get("JAEGER_QUERY_URL"):
        return JaegerSource(os.environ["JAEGER_QUERY_URL"], since_s)
    if os.environ.get("OTELCOL_SPANS_FILE"):
        return FileSource(os.environ["OTELCOL_SPANS_FILE"])
    jaeger_env = Path(os.environ.get("SHAREHOST_JAEGER_DIR") or REPO / "target" / "jaeger") / "jaeger.env"
    otelcol_env = Path(os.environ.get("SHAREHOST_OTELCOL_DIR") or REPO / "target" / "otelcol") / "otelcol.env"
    url = env_value(jaeger_env, "JAEGER_QUERY_URL")
    spans_file = env_value(otelcol_env, "OTELCOL_SPANS_FILE")
    if url and spans_file:
        raise Die(f"both dev/jaeger ({jaeger_env}) and dev/otelcol ({otelcol_env}) are up: "
                  "pass --query-url or --otlp-file")
    if url:
        return JaegerSource(url, since_s)
    if spans_file:
        return FileSource(spans_file)
    raise Die(
        "no trace receiver is up in this checkout (run dev/otelcol up or dev/jaeger up), "
        "and neither --query-url, --otlp-file, $JAEGER_QUERY_URL nor $OTELCOL_SPANS_FILE names one"
    )


def get_json(url, timeout=10):
    """(status, parsed body) of a GET; a connection that fails is status 0 (the receiver is not up yet, or gone)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read() or b"null")
        except ValueError:
            body = None
        return e.code, body
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


class JaegerSource:
    """Jaeger's API v3 over HTTP, asking for the raw traces: without it Jaeger's query-side adjusters add an
    "@jaeger@warnings" attribute to every span whose parent is not in the trace (a span continuing a producer's
    traceparent), and Jaeger 1.75's memory store keeps the addition, one more copy on each query."""

    def __init__(self, url, since_s):
        self.url = url.rstrip("/")
        self.since_s = since_s
        self.last_error = None

    def describe(self):
        return f"query {self.url}"

    def fetch(self, trace_id=None, service=None):
        if trace_id:
            url = f"{self.url}/api/v3/traces/{trace_id}?raw_traces=true"
        else:
            now = datetime.datetime.now(datetime.timezone.utc)
            # The window ends a little ahead: a span stamped by a clock a moment ahead still counts.
            window = {
                "query.service_name": service,
                "query.start_time_min": (now - datetime.timedelta(seconds=self.since_s)).isoformat(),
                "query.start_time_max": (now + datetime.timedelta(minutes=5)).isoformat(),
                "query.num_traces": "1000",
                "query.raw_traces": "true",
            }
            url = f"{self.url}/api/v3/traces?{urllib.parse.urlencode(window)}"
        status, body = get_json(url)
        if status == 200 and isinstance(body, dict):
            self.last_error = None
            return spans_of(body.get("result") or {})
        # 404: not (yet) stored. Anything else is remembered, to be shown if the deadline passes.
        if status != 404:
            self.last_error = f"GET {url}: {status} {body}" if status else f"GET {url}: {body}"
        return []


class FileSource:
    """An OpenTelemetry Collector file exporter's JSON lines (format: json, no compression)."""

    def __init__(self, path):
        self.path = Path(path)
        self.last_error = None

    def describe(self):
        return f"file {self.path}"

    def fetch(self, trace_id=None, service=None):
        try:
            text = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        spans = []
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                spans += spans_of(json.loads(line))
            except ValueError:
                continue  # a line the exporter is still writing
        if trace_id:
            return [s for s in spans if s["trace_id"] == trace_id]
        return [s for s in spans if s["service"] == service]


# --- the wait ---------------------------------------------------------------------------------------------------------


def normalise_trace_id(text):
    t = text.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{1,32}", t) or set(t) == {"0"}:
        raise Die(f"--trace-id must be a non-zero trace id of up to 32 hex digits (got '{text}')")
    return t.rjust(32, "0")


def wait_for_spans(source, trace_id=None, service=None, count=1, timeout_s=60.0, poll_s=POLL_S):
    """Polls SOURCE until the trace (or the service's traces) has at least COUNT spans; returns them. Raises Die at the
    deadline, naming what it saw."""
    if trace_id:
        trace_id = normalise_trace_id(trace_id)
    t0 = time.monotonic()
    while True:
        spans = dedup_sorted(source.fetch(trace_id=trace_id, service=service))
        if len(spans) >= count:
            return spans
        if time.monotonic() - t0 >= timeout_s:
            what = f"trace {trace_id}" if trace_id else f"service '{service}'"
            detail = f"; last error: {source.last_error}" if source.last_error else ""
            seen = "".join(f"\n  {s['span_id']} parent {s['parent_span_id']} {s['name']}" for s in spans)
            raise Die(
                f"{what} has {len(spans)} span(s) of the {count} awaited after {timeout_s:g}s "
                f"({source.describe()}{detail}){seen}"
            )
        time.sleep(poll_s)


def tree(spans):
    """The spans as indented lines, each child under its parent; a span whose parent is not among them (a root, or
    the child of a remote parent) starts a tree of its own and shows that parent id."""
    by_parent = {}
    ids = {s["span_id"] for s in spans}
    for s in spans:
        by_parent.setdefault(s["parent_span_id"] if s["parent_span_id"] in ids else None, []).append(s)
    lines = []

    def walk(s, depth):
        remote = f" (parent {s['parent_span_id']}, not here)" if depth == 0 and s["parent_span_id"] else ""
        lines.append(f"{'  ' * depth}{s['name']} [{s['service']}] span {s['span_id']}{remote}")
        for c in by_parent.get(s["span_id"], []):
            walk(c, depth + 1)

    for root in by_parent.get(None, []):
        walk(root, 0)
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(prog=NAME, description="Wait for spans in a trace receiver; print them as JSON.")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wait", help="wait until a trace (or a service) has at least N spans, print them")
    which = w.add_mutually_exclusive_group(required=True)
    which.add_argument("--trace-id", help="the trace's id (hex, as in a traceparent)")
    which.add_argument("--service", help="a service name (resource service.name): all of its recent traces")
    w.add_argument("--spans", type=int, default=1, help="how many spans to wait for (at least; default 1)")
    w.add_argument("--timeout", type=float, default=60.0, help="seconds until giving up (default 60)")
    w.add_argument("--since", type=float, default=3600.0,
                   help="with --service: how far back traces may start, in seconds (default 3600)")
    src = w.add_mutually_exclusive_group()
    src.add_argument("--query-url", help="Jaeger's query API, e.g. http://127.0.0.1:16687")
    src.add_argument("--otlp-file", help="an OpenTelemetry Collector file exporter's JSON lines")
    w.add_argument("--format", choices=["json", "tree"], default="json")
    args = parser.parse_args(argv)
    try:
        if args.spans < 1:
            raise Die("--spans must be 1 or more")
        if args.otlp_file:
            source = FileSource(args.otlp_file)
        elif args.query_url:
            source = JaegerSource(args.query_url, args.since)
        else:
            source = default_source(args.since)
        spans = wait_for_spans(source, trace_id=args.trace_id, service=args.service, count=args.spans,
                               timeout_s=args.timeout)
    except Die as e:
        print(f"{NAME}: error: {e}", file=sys.stderr, flush=True)
        return 1
    if args.format == "tree":
        print(tree(spans))
    else:
        print(json.dumps(spans, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
