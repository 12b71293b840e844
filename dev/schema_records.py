#!/usr/bin/env python3
"""Test data in the Confluent wire format, made and read by Confluent's own serializers through a real registry.

The host's schema support is tested against records that a real serializer wrote and against a real deserializer's
reading of what the host wrote, never against our own encoder. This program is that serializer and deserializer: the
Avro, Protobuf and JSON Schema serdes of the `confluent-kafka` package, talking to the registry `dev/registry up`
runs (or any Confluent-compatible one), with its records in the JSON-lines format of `sharehost produce` and
`sharehost consume` (docs/plugin-guide.md).

  register --format F --schema FILE (--subject S | --topic T)
      registers FILE's text under S (default T-value, the topic name strategy) and prints
      {"subject": S, "id": ID, "version": V}.
  encode --format F --schema FILE (--subject S | --topic T) [--message NAME] [--key-field FIELD]
      reads JSON objects, one a line, on stdin; writes one record a line, {"value": {"base64": ...}} (with
      "key": the field's value as text when --key-field is given), the value serialized by the format's serializer,
      which registers the schema under the subject as it does by default (auto.register.schemas).
  decode --format F [--schema FILE] [--message NAME] [--subject S | --topic T] [--with-schema-id]
      reads records, one a line (what `sharehost consume` prints, or encode's output; a value as text or
      {"base64": ...}), and writes each value as the format's deserializer reads it, as JSON (null for a null value);
      --with-schema-id writes {"schema_id": ID, "value": ...} (with "message_indexes" for Protobuf).
  setup
      only installs the venv (what the first of the others does) and prints its directory, e.g. while a registry
      starts.

F is avro, protobuf or json-schema. --registry URL (default $SHAREHOST_REGISTRY_URL, else
http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7 with REGISTRY_PORT 18081) names the registry's Confluent-compatible
API; --registry-user-info USER:PASSWORD (default $SHAREHOST_REGISTRY_USER_INFO, else dev/registry's user
sharehost:$REGISTRY_PASSWORD, password registry-secret by default; "" for none) are its basic credentials,
--registry-ca FILE the CA of an https registry. Avro and JSON Schema decode with the writer's schema fetched from the
registry by the record's id (FILE, when given, is the reader's schema). Protobuf takes the .proto of --schema (compiled with protoc from grpcio-tools into a
temporary directory) and its message --message (full or short name; default the file's first message).

Protobuf and Apicurio Registry (dev/registry): Apicurio 3.3.3's Confluent API stores a schema as the client sent it,
and the Confluent Protobuf serializer sends a base64 FileDescriptorProto, so a subject that encode registered holds
that form where Confluent's registry would hold .proto text; and it does not answer `?format=serialized` as Confluent's
registry does (raw descriptor bytes for a .proto-text schema, HTTP 500 for a base64 one), which the Confluent
Protobuf deserializer asks for the writer's schema. So a Protobuf decode reads the wire format (magic byte, schema id,
message indexes) with the Confluent deserializer without a registry client, parses the payload as --message, and then
checks through the registry that the id is a registered PROTOBUF schema. `register` registers the .proto text
(what Confluent's registry holds), so a subject that both register and encode wrote to has two versions, two ids.

Keep one format per subject: Apicurio gives the same content one id in every subject, but an id's schemaType is that
of the subject that first held it.

Dependencies: dev/schema-records-requirements.txt, pinned, installed on first use into a venv under
$SHAREHOST_CACHE/schema-records/ (default ${XDG_CACHE_HOME:-~/.cache}/sharehost; the venv is named by the hash of the
pins, so a changed pin installs a new one); the program then runs itself in it. Needs a Python 3.10+ with venv and pip the first
time ($PYTHON picks another).
Exit status: 0, 1 on an error (said on stderr, naming the input line), 2 on a usage error.
"""

import argparse
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

NAME = "dev/schema_records.py"
DEV = Path(os.path.abspath(os.path.dirname(__file__)))
REQUIREMENTS = DEV / "schema-records-requirements.txt"
FORMATS = ("avro", "protobuf", "json-schema")


class Die(Exception):
    """Ends the command: "dev/schema_records.py: error: MSG" on stderr, exit status 1."""


def say(msg):
    print(f"{NAME}: {msg}", file=sys.stderr, flush=True)


# --- the venv ------------------------------------------------------------------------------------------------------


def cache_root():
    """$SHAREHOST_CACHE as dev/kafka and dev/registry read it, else the per-user cache the SDK's toolchain uses."""
    if os.environ.get("SHAREHOST_CACHE"):
        return Path(os.environ["SHAREHOST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sharehost"


def venv_dir():
    """The venv for these exact pins (the file's comments aside): checkouts with different pins each get their own."""
    pins = [line.strip() for line in REQUIREMENTS.read_text().splitlines() if line.strip() and line[0] != "#"]
    digest = hashlib.sha256("\n".join(pins).encode()).hexdigest()[:16]
    return cache_root() / "schema-records" / digest


def ensure_venv():
    """Creates the venv and installs the pinned packages when it is not complete; returns its python."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    stamp = venv / "requirements.txt"  # copied in last: a half-made venv has none and is made again
    if stamp.is_file():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Serialises first installs by parallel tests.
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file():
            return python
        say(f"installing {REQUIREMENTS.name} into {venv} (one time) ...")
        shutil.rmtree(venv, ignore_errors=True)
        interpreter = os.environ.get("PYTHON") or shutil.which("python3") or sys.executable
        if subprocess.call([interpreter, "-m", "venv", str(venv)], stdout=sys.stderr) != 0:
            raise Die(f"{interpreter} -m venv {venv} failed (is python3-venv installed?)")
        rc = subprocess.call(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
             "-r", str(REQUIREMENTS)],
            stdout=sys.stderr,
        )
        if rc != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise Die(f"installing {REQUIREMENTS} into {venv} failed (see pip's output above)")
        shutil.copyfile(REQUIREMENTS, stamp)
    return python


def in_venv():
    try:
        return Path(sys.prefix).resolve() == venv_dir().resolve()
    except OSError:
        return False


# --- the command line ----------------------------------------------------------------------------------------------


def default_user_info():
    return os.environ.get("SHAREHOST_REGISTRY_USER_INFO") or (
        f"sharehost:{os.environ.get('REGISTRY_PASSWORD') or 'registry-secret'}")


def default_registry():
    return os.environ.get("SHAREHOST_REGISTRY_URL") or (
        f"http://127.0.0.1:{os.environ.get('REGISTRY_PORT') or 18081}/apis/ccompat/v7")


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"{NAME}: error: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv):
    parser = Parser(prog=NAME, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def common(p, schema_required):
        p.add_argument("--registry", default=default_registry(), help="the Confluent-compatible API's URL")
        p.add_argument("--registry-user-info", default=default_user_info(), help='USER:PASSWORD ("" for none)')
        p.add_argument("--registry-ca", type=Path, help="the CA file of an https registry")
        p.add_argument("--format", required=True, choices=FORMATS)
        p.add_argument("--schema", required=schema_required, type=Path, help=".avsc, .proto or JSON Schema file")
        p.add_argument("--subject", help="the subject (default: TOPIC-value)")
        p.add_argument("--topic", help="the topic (the subject is TOPIC-value unless --subject says otherwise)")

    p = sub.add_parser("register", help="register a schema under a subject")
    common(p, True)
    p = sub.add_parser("encode", help="JSON objects on stdin to records in the wire format on stdout")
    common(p, True)
    p.add_argument("--message", help="Protobuf: the message type (default: the file's first)")
    p.add_argument("--key-field", help="give each record the key FIELD's value, as text")
    p = sub.add_parser("decode", help="records on stdin to the JSON of their values on stdout")
    common(p, False)
    p.add_argument("--message", help="Protobuf: the message type (default: the file's first)")
    p.add_argument("--with-schema-id", action="store_true", help='write {"schema_id": ID, "value": ...}')
    sub.add_parser("setup", help="only install the venv and print its directory")
    args = parser.parse_args(argv)
    if args.command == "setup":
        return args
    if args.command in ("register", "encode") and not (args.subject or args.topic):
        parser.error(f"{args.command} needs --subject or --topic")
    if args.command == "decode" and args.format == "protobuf" and args.schema is None:
        parser.error("decode --format protobuf needs --schema (the .proto the message type comes from)")
    if args.schema is not None and not args.schema.is_file():
        raise Die(f"--schema {args.schema}: no such file")
    args.subject = args.subject or f"{args.topic}-value"
    args.topic = args.topic or "records"
    return args


# --- the serdes (run in the venv) ----------------------------------------------------------------------------------


def client(args):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    conf = {"url": args.registry}
    if args.registry_user_info:
        conf["basic.auth.user.info"] = args.registry_user_info
    if args.registry_ca:
        conf["ssl.ca.location"] = str(args.registry_ca)
    return SchemaRegistryClient(conf)


def schema_type(fmt):
    return {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}[fmt]


def proto_message_class(proto_file, message):
    """The message class of MESSAGE (full or short name; default the first) in PROTO_FILE, compiled by protoc."""
    import importlib.resources
    import tempfile

    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from grpc_tools import protoc

    proto_file = proto_file.resolve()
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory(prefix="schema-records-") as tmp:
        out = Path(tmp) / "descriptors.pb"
        rc = protoc.main(["protoc", f"-I{proto_file.parent}", f"-I{well_known}", "--include_imports",
                          f"--descriptor_set_out={out}", proto_file.name])
        if rc != 0:
            raise Die(f"protoc could not compile {proto_file} (its message is above)")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    pool = descriptor_pool.DescriptorPool()
    for f in files:
        pool.Add(f)
    main_file = files[-1]  # --include_imports lists the imports first
    names = [(f"{main_file.package}." if main_file.package else "") + m.name for m in main_file.message_type]
    if not names:
        raise Die(f"{proto_file} defines no message")
    if message is None:
        full = names[0]
    else:
        matches = [n for n in names if n == message or n.rsplit(".", 1)[-1] == message]
        if not matches:
            raise Die(f"{proto_file} has no top-level message {message} (it has {', '.join(names)})")
        full = matches[0]
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full))


def subject_strategy(subject):
    """The subject for every record: the topic name strategy's TOPIC-value unless --subject names another."""
    return lambda ctx, record_name: subject


def cmd_register(args):
    from confluent_kafka.schema_registry import Schema

    c = client(args)
    schema = Schema(args.schema.read_text(), schema_type(args.format))
    schema_id = c.register_schema(args.subject, schema)
    registered = c.lookup_schema(args.subject, schema)
    print(json_line({"subject": args.subject, "id": schema_id, "version": registered.version}))
    return 0


def serializer(args, c):
    conf = {"auto.register.schemas": True, "subject.name.strategy": subject_strategy(args.subject)}
    text = args.schema.read_text()
    if args.format == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        return AvroSerializer(c, text, conf=conf)
    if args.format == "json-schema":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        return JSONSerializer(text, c, conf=conf)
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf import json_format

    cls = proto_message_class(args.schema, args.message)
    ser = ProtobufSerializer(cls, c, conf)
    return lambda obj, ctx: ser(json_format.ParseDict(obj, cls()), ctx)


def cmd_encode(args):
    import base64
    import json

    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = serializer(args, client(args))
    ctx = SerializationContext(args.topic, MessageField.VALUE)
    for number, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            value = ser(obj, ctx)
        except Exception as e:
            raise Die(f"stdin line {number}: {type(e).__name__}: {e}")
        record = {}
        if args.key_field is not None:
            if not isinstance(obj, dict) or args.key_field not in obj:
                raise Die(f"stdin line {number}: no field {args.key_field} for the key")
            key = obj[args.key_field]
            record["key"] = key if isinstance(key, str) else json.dumps(key)
        record["value"] = {"base64": base64.b64encode(value).decode("ascii")}
        print(json_line(record), flush=True)
    return 0


def deserializer(args, c):
    """A function of the value's bytes and the context to the JSON-able value."""
    text = args.schema.read_text() if args.schema is not None else None
    conf = {"subject.name.strategy": subject_strategy(args.subject)}
    if args.format == "avro":
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        return AvroDeserializer(c, text, conf=conf)
    if args.format == "json-schema":
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        return JSONDeserializer(text, conf=conf, schema_registry_client=c)
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from google.protobuf import json_format

    cls = proto_message_class(args.schema, args.message)
    # Without a registry client: see the module's doc (Apicurio and ?format=serialized). decode() checks the id.
    de = ProtobufDeserializer(cls, conf)

    def read(data, ctx):
        d = json_format.MessageToDict(de(data, ctx), preserving_proto_field_name=True,
                                      always_print_fields_with_no_presence=True)
        # (in the fields' order, as Avro and JSON come out: MessageToDict puts the zero values last)
        return {f.name: d[f.name] for f in cls.DESCRIPTOR.fields if f.name in d}

    return read


def record_value(record, number):
    """The bytes of a record line's value (text is its UTF-8, as `sharehost consume` prints valid UTF-8), or None."""
    import base64

    if not isinstance(record, dict):
        raise Die(f"stdin line {number}: not a JSON object")
    value = record.get("value")
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and isinstance(value.get("base64"), str):
        return base64.b64decode(value["base64"], validate=True)
    raise Die(f'stdin line {number}: "value" is neither text, {{"base64": ...}} nor null')


def cmd_decode(args):
    import json

    from confluent_kafka.schema_registry import prefix_schema_id_deserializer
    from confluent_kafka.schema_registry.common.serde import SchemaId
    from confluent_kafka.serialization import MessageField, SerializationContext

    c = client(args)
    de = deserializer(args, c)
    ctx = SerializationContext(args.topic, MessageField.VALUE)
    checked = set()
    for number, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            data = record_value(json.loads(line), number)
        except ValueError as e:
            raise Die(f"stdin line {number}: {e}")
        if data is None:
            print("null", flush=True)
            continue
        try:
            value = de(data, ctx)
            # (the id as Confluent's own reader of the prefix finds it)
            schema_id = SchemaId(schema_type(args.format))
            prefix_schema_id_deserializer(data, ctx, schema_id)
            if args.format == "protobuf" and schema_id.id not in checked:
                registered = c.get_schema(schema_id.id)
                if registered.schema_type != "PROTOBUF":
                    raise Die(f"stdin line {number}: schema {schema_id.id} is {registered.schema_type}, "
                              "not PROTOBUF")
                checked.add(schema_id.id)
        except Die:
            raise
        except Exception as e:
            raise Die(f"stdin line {number}: {type(e).__name__}: {e}")
        if args.with_schema_id:
            out = {"schema_id": schema_id.id}
            if args.format == "protobuf":
                out["message_indexes"] = schema_id.message_indexes
            out["value"] = value
            value = out
        print(json_line(value), flush=True)
    return 0


def json_line(obj):
    import base64
    import json

    def other(o):
        if isinstance(o, (bytes, bytearray)):
            return {"base64": base64.b64encode(o).decode("ascii")}
        return str(o)  # decimals, dates, UUIDs of Avro's logical types

    return json.dumps(obj, default=other, ensure_ascii=False)


def main(argv):
    args = None
    try:
        args = parse_args(argv)
        if args.command == "setup":
            ensure_venv()
            print(venv_dir())
            return 0
        if not in_venv():
            python = ensure_venv()
            sys.stdout.flush()
            os.execv(str(python), [str(python), os.path.abspath(__file__), *argv])
        return {"register": cmd_register, "encode": cmd_encode, "decode": cmd_decode}[args.command](args)
    except Die as e:
        print(f"{NAME}: error: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the registry's answers (SchemaRegistryError), a refused connection
        where = f" (registry {args.registry}; is it up? dev/registry up)" if "Connect" in type(e).__name__ else ""
        print(f"{NAME}: error: {type(e).__name__}: {e}{where}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    # A reader that stops early (`... decode | head -1`) ends it quietly.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))
