"""`clusterctl spec --json-schema`: the spec's JSON Schema, made from the table the parser reads, agrees with it.

An editor given the schema (Taplo's `#:schema`, docs/spec.md) must never flag a spec clusterctl accepts, and
flags the plain mistakes (an unknown key, a wrong type, a number out of range) that clusterctl refuses.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.errors import SpecError
from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.pure.spec import FIELDS, load_spec, parse_spec
from tests.conftest import REPO
from tests.golden import assert_golden
from tests.unit.test_spec import MINIMAL

jsonschema = pytest.importorskip("jsonschema")

SPECS = sorted([*REPO.glob("examples/*.toml"), *REPO.glob("tests/data/**/*.toml")])


def _schema() -> dict:
    result = CliRunner().invoke(cli, ["spec", "--json-schema"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


SCHEMA = _schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=None)


def _schema_refuses(text: str) -> list[str]:
    return [error.message for error in VALIDATOR.iter_errors(tomllib.loads(text))]


def _parser_refuses(text: str) -> str | None:
    try:
        parse_spec(text, "job.toml", base_dir=Path("/base"))
    except SpecError as exc:
        return str(exc)
    return None


def test_the_schema_is_a_valid_draft_2020_12_schema_and_its_golden_file_is_current():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert_golden("spec/spec.schema.json", json.dumps(SCHEMA, indent=2, ensure_ascii=False) + "\n")


def test_a_validator_of_an_older_draft_reads_it_the_same_way():
    older = jsonschema.Draft7Validator({**SCHEMA, "$schema": "http://json-schema.org/draft-07/schema#"})
    for spec_file in SPECS:
        assert not list(older.iter_errors(tomllib.loads(spec_file.read_text())))
    assert list(older.iter_errors(tomllib.loads(MINIMAL.replace("nodes = 2", "nodes = 0\nnodez = 1")))) != []


def test_every_key_the_parser_reads_is_in_the_schema_with_its_meaning():
    for spec_field in FIELDS:
        described = SCHEMA["properties"][spec_field.section]["properties"][spec_field.key]
        assert described["description"] == spec_field.doc
        assert (spec_field.key in SCHEMA["properties"][spec_field.section].get("required", ())) == spec_field.required
    assert SCHEMA["required"] == ["job", "launch"]


def test_the_defaults_and_choices_are_the_parsers():
    job, launch = SCHEMA["properties"]["job"]["properties"], SCHEMA["properties"]["launch"]["properties"]
    assert job["gpus_per_node"]["default"] == 8
    assert launch["style"]["enum"] == ["srun", "torchrun"]
    assert (job["nodes"]["minimum"], job["nodes"]["maximum"]) == (1, 100_000)
    assert launch["env"]["additionalProperties"] == {"type": ["string", "number"]}


@pytest.mark.parametrize("spec_file", SPECS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_example_and_recorded_spec_in_the_repository_passes_the_schema(spec_file):
    load_spec(spec_file)  # clusterctl accepts it...
    assert _schema_refuses(spec_file.read_text()) == []  # ...so the editor must not flag it
    assert len(SPECS) >= 3


@pytest.mark.parametrize("old, new, schema_says", [
    ("nodes = 2", "nodes = 2\nnodez = 3", "'nodez' was unexpected"),
    ("[launch]", "[lunch]\nx = 1\n[launch]", "'lunch' was unexpected"),
    ("nodes = 2", 'nodes = "2"', "'2' is not of type 'integer'"),
    ('command = ["python3", "train.py"]', 'command = "python3 train.py"', "is not of type 'array'"),
    ("nodes = 2", "nodes = 0", "0 is less than the minimum of 1"),
    ("nodes = 2", "nodes = 2\ngpus_per_node = 129", "129 is greater than the maximum of 128"),
    ('command = ["python3", "train.py"]', 'command = ["a"]\nstyle = "srunn"', "'srunn' is not one of"),
    ('command = ["python3", "train.py"]', 'command = ["a"]\nenv = {"1BAD" = "x"}', "'1BAD' does not match"),
    ("nodes = 2", 'nodes = 2\ntime = "2 hours"', "'2 hours' does not match"),
    ('name = "llm"\n', "", "'name' is a required property"),
])
def test_plain_mistakes_are_flagged_by_the_schema_and_refused_by_the_parser(old, new, schema_says):
    text = MINIMAL.replace(old, new)
    assert _parser_refuses(text) is not None
    assert any(schema_says in message for message in _schema_refuses(text)), _schema_refuses(text)


SIMPLE_FIELDS = [spec_field for spec_field in FIELDS if spec_field.kind in ("int", "float", "bool", "choice", "switches")
                 and spec_field.section != "parallel"]
VALUES = st.one_of(st.integers(-10**6, 10**16), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                   st.sampled_from(["auto", "srun", "wait", "report", "in-allocation", "dcp", "", "x"]))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SIMPLE_FIELDS), VALUES)
def test_the_schema_never_flags_a_value_the_parser_takes(spec_field, value):
    data = tomllib.loads(MINIMAL)
    data.setdefault(spec_field.section, {})[spec_field.key] = value
    text = _as_toml(data)
    if _parser_refuses(text) is None:
        assert _schema_refuses(text) == []


def _as_toml(data: dict) -> str:
    """A small TOML writer for the tables above (strings, numbers, booleans, lists of strings)."""
    lines = []
    for section, table in data.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {json.dumps(value).replace('Infinity', 'inf')}" if not isinstance(value, bool)
                     else f"{key} = {'true' if value else 'false'}" for key, value in table.items())
    return "\n".join(lines) + "\n"


def test_the_reference_is_printed_one_way_at_a_time():
    result = CliRunner().invoke(cli, ["spec", "--json-schema", "--markdown"])
    assert result.exit_code == 2 and "give one" in result.output
    result = CliRunner().invoke(cli, ["spec", "--json-schema", str(SPECS[0])])
    assert result.exit_code == 2 and "--json-schema prints the reference, not a spec" in result.output
