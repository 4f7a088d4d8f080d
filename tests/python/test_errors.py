"""Errors are Python exceptions: promptcache.Error at the root, SchemaError (also a ValueError)
with file/line/column/element for PML problems, ModelError for model folders; the message is
the CLI's."""
import pytest

import promptcache as pc
from conftest import cli_path

import subprocess

BAD_SCHEMA = """<schema name="bad">
  <module name="a">One.</module>
  <module name="a">Two.</module>
</schema>
"""


def test_bad_schema_file_raises_schema_error_with_its_line(models, tmp_path):
    eng = pc.Engine(models("tiny"))
    path = tmp_path / "bad.xml"
    path.write_text(BAD_SCHEMA)
    with pytest.raises(pc.SchemaError) as info:
        eng.add_schema(str(path))
    e = info.value
    assert isinstance(e, pc.Error) and isinstance(e, ValueError)
    assert (e.file, e.line, e.column) == (str(path), 3, 3)
    assert e.element == '<module name="a">'
    assert "duplicate module name 'a'" in str(e)
    # The message is the one the CLI prints for the same file.
    r = subprocess.run([str(cli_path()), "layout", str(path), "--model", str(models("tiny"))],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "promptcache: " + str(e) + "\n" in r.stderr


def test_malformed_xml_text_names_line_and_column(models):
    eng = pc.Engine(models("tiny"))
    with pytest.raises(pc.SchemaError) as info:
        eng.add_schema('<schema name="x">\n<module name="a">text\n</schema>')
    assert info.value.kind == "xml syntax"
    assert info.value.file == "<string>" and info.value.line == 3


def test_prompt_errors_are_schema_errors(stories):
    with pytest.raises(pc.SchemaError) as info:
        stories.generate('<prompt schema="stories"><nope/> x</prompt>', max_new_tokens=2)
    assert info.value.kind == "unknown module" and "nope" in str(info.value)
    with pytest.raises(pc.SchemaError) as info:
        stories.score(pc.Prompt(schema="nothere", text="x"), ["a"])
    assert info.value.kind == "unknown schema"
    with pytest.raises(pc.SchemaError):
        stories.generate('<prompt schema="stories"><instruction/> x', max_new_tokens=2)


def test_model_errors(tmp_path):
    with pytest.raises(pc.ModelError) as info:
        pc.Engine(tmp_path / "missing")
    assert "model folder does not exist" in str(info.value)
    assert info.value.file == str(tmp_path / "missing")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(pc.ModelError):
        pc.Engine(tmp_path / "m")


def test_other_errors_are_promptcache_errors(stories):
    with pytest.raises(pc.Error) as info:
        stories.generate('<prompt schema="stories"> x</prompt>', temperature=-1)
    assert not isinstance(info.value, pc.SchemaError) and info.value.kind == "invalid argument"
    with pytest.raises(TypeError):
        stories.generate(42)
    with pytest.raises(TypeError):
        stories.score('<prompt schema="stories"> x</prompt>', "yes")


def test_bad_engine_arguments_are_not_model_errors(models):
    with pytest.raises(pc.Error) as info:
        pc.Engine(models("tiny"), device="gpu")
    assert not isinstance(info.value, pc.ModelError) and info.value.kind == "invalid argument"
    with pytest.raises(pc.Error) as info:
        pc.Engine(models("tiny"), weights="f7")
    assert not isinstance(info.value, pc.ModelError)
