"""The component glue, run natively against fake bindings in a subprocess (glue_harness.py)."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def run_harness(*args):
    out = subprocess.run(
        [sys.executable, str(HERE / "glue_harness.py"), *args],
        env={"PYTHONPATH": str(HERE.parent)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def seen():
    return run_harness()


def test_init_refusals_reach_the_host_with_their_message(seen):
    r = seen["results"]
    assert r[0] == ["Verdict_Release{}"], "handle before init releases"
    assert r[1] == "init err: refused: no"
    assert r[2] == "init err: KeyError: 'boom'"
    assert r[3] == "init ok"


def test_verdicts_are_converted_in_order(seen):
    assert seen["results"][4] == [
        "Verdict_Accept{}",
        "Verdict_Release{}",
        "Verdict_Retry{'value': 7}",
        "Verdict_Reject{'value': 's3cret'}",
        "Verdict_Reject{'value': 's3cret'}",
    ]


def test_emits_go_to_the_host_and_refusals_become_emit_errors(seen):
    assert seen["emits"] == [[0, "out", "k", [["h", None]]]]
    assert seen["results"][5] == [
        "Verdict_Reject{'value': \"unknown output `nowhere` (not in the manifest's [pipeline.outputs], or test-plugin's --output)\"}",
        "Verdict_Reject{'value': 'time.time() is not available in a sharehost Python plugin "
        "(the component has no clock): use record.timestamp'}",
    ]


def test_exceptions_and_non_verdicts_escape_to_trap_after_a_log_line(seen):
    assert seen["results"][6] == "raised ValueError"
    assert seen["results"][7] == "raised TypeError"
    faults = [m for level, m in seen["logs"] if level == "error"]
    assert faults[0].startswith("plugin fault: ValueError: crash 3")
    assert 'in handle' in faults[0]
    assert faults[1].startswith("plugin fault: TypeError: handle returned 'accept', not a verdict")


def test_print_reaches_the_host_log_line_by_line(seen):
    infos = [m for level, m in seen["logs"] if level == "info"]
    assert infos[:2] == ["call 1 records 5", "call 2 records 2"]


def test_files_and_late_imports_are_refused_with_python_errors(seen):
    assert seen["results"][8:10] == ["open refused", "import refused: fractions"]


def test_an_uncaught_exception_writes_its_message_and_location_to_stderr_before_the_trap(seen):
    # The host's fault text shows the last stderr line of the failed call.
    assert seen["stderr"][0] == "plugin fault: ValueError: crash 3 (at plugin_under_test.py:35 in handle)\n"
    assert seen["stderr"][1].startswith(
        "plugin fault: TypeError: handle returned 'accept', not a verdict: use accept(), "
        "release(), reject(reason), renew() or retry(ms) (at "
    )
    assert re.search(r"sharehost_guest/_component\.py:\d+ in _wire\)\n$", seen["stderr"][1])
    assert len(seen["stderr"]) == 2


def test_json_of_utf16_bytes_works_and_an_unloaded_codec_says_what_to_do(seen):
    assert seen["results"][10:12] == [True, True]
    assert seen["results"][12] == (
        "codec refused: codec 'cp037' was not loaded when the component was built: call "
        "codecs.lookup('cp037') at the top of your plugin module"
    )


def test_with_deny_wasi_the_clock_is_real_and_files_still_refused():
    seen = run_harness("deny")
    assert seen["results"][5][1] == "Verdict_Reject{'value': 's3cret'}", "time.time() worked"
    assert seen["results"][8:10] == ["open refused", "import refused: fractions"]
