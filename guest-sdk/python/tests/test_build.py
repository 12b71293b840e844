"""The build command's own text: what an author sees when componentize-py fails."""

from sharehost_guest._build import failure_text

# componentize-py 0.25.1's output for a plugin module with no Plugin subclass, with
# RUST_BACKTRACE=1 in the environment (the backtrace cut short here).
FAILED = '''Traceback (most recent call last):
  File "/root/.cache/sharehost/py-toolchain/componentize-py-0.25.1/bin/componentize-py", line 8, in <module>
    sys.exit(script())
             ^^^^^^^^
AssertionError: Traceback (most recent call last):
  File "/0/sharehost_app.py", line 4, in <module>
    WitWorld = make_world(_plugin_module)
  File "/2/sharehost_guest/_component.py", line 323, in plugin_class
    raise TypeError(
TypeError: plugin: expected exactly one sharehost_guest.Plugin subclass, found none; mark the one to export with @sharehost_guest.export


Caused by:
    TypeError: plugin: expected exactly one sharehost_guest.Plugin subclass, found none; mark the one to export with @sharehost_guest.export

Stack backtrace:
   0: <anyhow::Error>::msg::<alloc::string::String>
   1: anyhow::__private::format_err
'''


def test_a_plugin_import_error_is_its_python_traceback_alone():
    text = failure_text(FAILED)
    assert text.startswith("Traceback (most recent call last):\n  File \"/0/sharehost_app.py\"")
    assert text.rstrip().endswith("mark the one to export with @sharehost_guest.export")
    assert "componentize-py\", line 8" not in text
    assert "Stack backtrace" not in text and "Caused by" not in text
    assert text.count("TypeError: plugin:") == 1


def test_another_failure_is_kept_but_for_the_backtrace():
    text = failure_text("error: something else\n\nStack backtrace:\n   0: frame\n")
    assert text == "error: something else\n"


def test_the_inputs_digest_follows_the_source_and_not_the_builds_own_leftovers(tmp_path):
    from sharehost_guest._build import inputs_digest

    (tmp_path / "plugin.py").write_text("X = 1\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "table.txt").write_text("a\n")
    first = inputs_digest([tmp_path], "settings")
    assert first == inputs_digest([tmp_path], "settings")
    # What the build and the author's tools leave beside the source is not an input.
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "plugin.cpython-314.pyc").write_bytes(b"\0")
    (tmp_path / "plugin.wasm").write_bytes(b"\0asm")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "x").write_text("y")
    assert inputs_digest([tmp_path], "settings") == first
    # The source, a data file, a new module and the settings are.
    assert inputs_digest([tmp_path], "other settings") != first
    (tmp_path / "data" / "table.txt").write_text("b\n")
    second = inputs_digest([tmp_path], "settings")
    assert second != first
    (tmp_path / "helper.py").write_text("")
    assert inputs_digest([tmp_path], "settings") != second
