"""Runs the component glue (argv[1]: the WASI mode, stub by default) (sharehost_guest._component) natively against fake generated
bindings, in its own process (the glue patches time, open and the import system). Used by
test_component_glue.py; prints one JSON object with what the fake host saw."""

import enum
import json
import sys
import types as pytypes
from dataclasses import dataclass


def fake_bindings(seen):
    cpt = pytypes.ModuleType("componentize_py_types")

    @dataclass(frozen=True)
    class Err(Exception):
        value: object

    cpt.Err = Err
    host = pytypes.ModuleType("wit_world.imports.host")

    class Level(enum.Enum):
        TRACE = 0
        DEBUG = 1
        INFO = 2
        WARN = 3
        ERROR = 4

    host.Level = Level
    host.log = lambda level, message: seen["logs"].append([level.name.lower(), message])
    outputs = pytypes.ModuleType("wit_world.imports.outputs")

    @dataclass
    class Header:
        key: str
        value: object

    @dataclass
    class EmitError_UnknownOutput:
        value: str

    outputs.Header = Header
    outputs.EmitError_UnknownOutput = EmitError_UnknownOutput
    for name in ("NoSuchRecord", "TooManyEmits", "TooManyBytes", "ReservedHeader"):
        setattr(outputs, "EmitError_" + name, type("EmitError_" + name, (), {}))

    def emit(index, output, key, value, headers):
        if output != "out":
            raise Err(EmitError_UnknownOutput(output))
        seen["emits"].append([index, output, key.decode(), [[h.key, h.value] for h in headers]])

    outputs.emit = emit
    wtypes = pytypes.ModuleType("wit_world.imports.types")
    for name in ("Accept", "Release", "Renew"):
        setattr(wtypes, "Verdict_" + name, dataclass(type("Verdict_" + name, (), {})))
    wtypes.Verdict_Reject = dataclass(type("Verdict_Reject", (), {"__annotations__": {"value": object}}))
    wtypes.Verdict_Retry = dataclass(type("Verdict_Retry", (), {"__annotations__": {"value": int}}))
    stderr = pytypes.ModuleType("wit_world.imports.stderr")

    class Stream:
        def blocking_write_and_flush(self, data):
            seen["stderr"].append(data.decode())

        def __exit__(self, *exc):
            return None

    stderr.get_stderr = Stream
    imports = pytypes.ModuleType("wit_world.imports")
    imports.host, imports.outputs, imports.types = host, outputs, wtypes
    imports.stderr = stderr
    ww = pytypes.ModuleType("wit_world")
    ww.imports = imports
    sys.modules.update(
        {
            "componentize_py_types": cpt,
            "wit_world": ww,
            "wit_world.imports": imports,
            "wit_world.imports.host": host,
            "wit_world.imports.outputs": outputs,
            "wit_world.imports.types": wtypes,
            "wit_world.imports.stderr": stderr,
        }
    )
    return Err


PLUGIN = '''
import time
from sharehost_guest import Plugin, ConfigError, accept, reject, retry, release, EmitError

class P(Plugin):
    def init(self, config):
        if config.get("refuse"):
            raise ConfigError("refused: " + config.get("refuse"))
        if config.get("crash"):
            raise KeyError("boom")
        self.token = config.secret("t")
        self.calls = 0

    def handle(self, records):
        self.calls += 1
        print("call", self.calls, end="")
        print(" records", len(records))
        out = []
        for r in records:
            v = r.value_str()
            if v == "emit":
                try:
                    r.emit("out", key="k", headers=[("h", None)])
                    r.emit("nowhere")
                except EmitError as e:
                    out.append(reject(str(e)))
                    continue
            if v == "clock":
                try:
                    time.time()
                except RuntimeError as e:
                    out.append(reject(str(e)))
                    continue
            if v == "crash":
                raise ValueError("crash " + str(self.calls))
            if v == "bad":
                out.append("accept")
                continue
            out.append({"a": accept(), "r": release(), "t": retry(7)}.get(v, reject(self.token)))
        return out
'''


def main():
    seen = {"logs": [], "emits": [], "results": [], "stderr": []}
    Err = fake_bindings(seen)
    if len(sys.argv) > 1:
        # What the build writes: which WASI the component has (stub or deny).
        build = pytypes.ModuleType("sharehost_build")
        build.WASI = sys.argv[1]
        sys.modules["sharehost_build"] = build
    from sharehost_guest import _component
    from sharehost_guest.testing import _encode, _spec

    mod = pytypes.ModuleType("plugin_under_test")
    exec(compile(PLUGIN, "plugin_under_test.py", "exec"), mod.__dict__)
    sys.modules["plugin_under_test"] = mod
    World = _component.make_world(mod)
    w = World()

    def init(config, secrets=()):
        try:
            w.init(list(config), list(secrets))
            seen["results"].append("init ok")
        except Err as e:
            seen["results"].append("init err: " + e.value)

    def handle(*values):
        batch = _encode([_spec(v) for v in values])
        try:
            seen["results"].append([type(v).__name__ + repr(vars(v)) for v in w.handle(batch)])
        except BaseException as e:
            seen["results"].append("raised " + type(e).__name__)

    handle("a")  # before init: everything released
    init([("refuse", "no")])
    init([("crash", "1")])
    init([], [("t", "s3cret")])
    handle("a", "r", "t", "x", None)
    handle("emit", "clock")
    handle("crash")
    handle("bad")
    try:
        open("/etc/hostname")
    except PermissionError:
        seen["results"].append("open refused")
    try:
        import fractions  # noqa: F401
    except ImportError as e:
        seen["results"].append("import refused: " + e.name)
    # Codecs looked up at build time work; any other says what to do.
    seen["results"].append(json.loads(b"\xff\xfe{\x00}\x00".decode("utf-16")) == {})
    seen["results"].append(json.loads('{"a": 1}'.encode("utf-16-be")) == {"a": 1})
    try:
        "x".encode("cp037")
    except LookupError as e:
        seen["results"].append("codec refused: " + str(e))
    print(json.dumps(seen), file=sys.__stdout__)


main()
