"""The job spec as a JSON Schema (draft 2020-12), made from the same FIELDS table the parser reads.

Editors (Taplo, VS Code's Even Better TOML) use it to complete keys, show each key's meaning and flag a wrong
type, an unknown key or a number out of range as the spec is typed.  It is advice for the editor: the parser
stays the judge and keeps its own messages (file, line, what was expected, a "did you mean"); a few of its
rules (job.name's byte limit, the layout filling the GPUs, keys that depend on each other) are not in it.
It names draft 2020-12 but uses only keywords that mean the same from draft 6 on, so validators of older
drafts (Taplo's) read it the same way.
"""

from __future__ import annotations

from typing import Any

from clusterctl.launcher.pure.parallel import DIMS
from clusterctl.launcher.pure.spec import ENV_NAME, EXIT_ACTIONS, FIELDS, MAX_NODES, SECTIONS, SLURM_TIME, Field

DRAFT = "https://json-schema.org/draft/2020-12/schema"
NO_CONTROL = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
"""A non-empty string without control characters (the parser refuses C0, DEL and C1)."""
EXIT_CODE = "^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]?)$"
"""An exit code from 1 to 255, as a TOML key."""

# Key-specific string rules the parser applies (spec._check_text_key), as patterns an editor can check.
_KEY_PATTERNS = {
    "restart.webhook": "^https?://[^/\\s]+",
    "checkpoint.resume_env": ENV_NAME.pattern,
    "launch.python": "^/",
    "checkpoint.local_dir": "^/",
}


def _portable(pattern: str) -> str:
    """A Python pattern in the dialect JSON Schema prescribes (ECMA-262): `\\d` spelled [0-9] (ASCII, as sbatch)."""
    return pattern.replace("\\d", "[0-9]")


def _text(spec_field: Field) -> dict[str, Any]:
    """The string kinds: non-empty, no control characters, and each kind's or key's own shape."""
    schema: dict[str, Any] = {"type": "string", "minLength": 1}
    patterns = [NO_CONTROL]
    if spec_field.kind == "time":
        patterns.append(_portable(SLURM_TIME.pattern))
    if spec_field.kind == "path":
        patterns.append("^[^-]")  # an option, not a path: the parser says to write './-name'
    if spec_field.dotted in _KEY_PATTERNS:
        patterns.append(_KEY_PATTERNS[spec_field.dotted])
    if len(patterns) == 1:
        schema["pattern"] = patterns[0]
    else:
        schema["allOf"] = [{"pattern": pattern} for pattern in patterns]
    return schema


def _number(spec_field: Field, json_type: str) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": json_type}
    for bound in ("minimum", "maximum"):
        value = getattr(spec_field, bound)
        if value is not None:
            schema[bound] = int(value) if json_type == "integer" else value
    return schema


def _strings(spec_field: Field) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
    if spec_field.kind == "argv" and spec_field.required:
        schema["minItems"] = 1
    return schema


def _value_schema(spec_field: Field) -> dict[str, Any]:
    """What one key may hold, by its kind."""
    kind = spec_field.kind
    if kind in ("int", "float"):
        return _number(spec_field, "integer" if kind == "int" else "number")
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "choice":
        return {"type": "string", "enum": list(spec_field.choices)}
    if kind in ("str", "path", "time", "hostlist"):
        return _text(spec_field)
    if kind == "switches":
        return {"anyOf": [{"const": "auto"}, {"type": "integer", "minimum": 0, "maximum": MAX_NODES}]}
    if kind in ("argv", "strings"):
        return _strings(spec_field)
    if kind == "env":
        # A map of strings; the parser also takes a bare number and passes it on as its text (NCCL_DEBUG_SUBSYS
        # = "INIT" and OMP_NUM_THREADS = 8 both read), so an editor must not flag the number.
        return {"type": "object", "propertyNames": {"pattern": ENV_NAME.pattern},
                "additionalProperties": {"type": ["string", "number"]}}
    if kind == "exit_actions":
        return {"type": "object", "propertyNames": {"pattern": EXIT_CODE},
                "additionalProperties": {"enum": list(EXIT_ACTIONS)}}
    if kind == "weights":
        return {"type": "object", "properties": {dim: {"type": "number", "minimum": 0, "maximum": 1e6} for dim in DIMS},
                "additionalProperties": False}
    raise AssertionError(kind)


def _default(value: Any) -> Any:
    """The default as JSON: tuples are lists."""
    return list(value) if isinstance(value, tuple) else value


def field_schema(spec_field: Field) -> dict[str, Any]:
    """One key's schema: its value's shape, its meaning and its default (none for a required key or an unset one)."""
    schema = {"description": spec_field.doc, **_value_schema(spec_field)}
    if not spec_field.required and spec_field.default is not None:
        schema["default"] = _default(spec_field.default)
    return schema


def spec_json_schema() -> dict[str, Any]:
    """The whole spec as a JSON Schema: one table per section, no key outside FIELDS, required keys required."""
    sections: dict[str, Any] = {}
    for section in SECTIONS:
        fields = [spec_field for spec_field in FIELDS if spec_field.section == section]
        table: dict[str, Any] = {"type": "object",
                                 "description": f"[{section}] of the job spec (`clusterctl spec` for the reference).",
                                 "properties": {spec_field.key: field_schema(spec_field) for spec_field in fields},
                                 "additionalProperties": False}
        required = [spec_field.key for spec_field in fields if spec_field.required]
        if required:
            table["required"] = required
        sections[section] = table
    return {
        "$schema": DRAFT,
        "title": "clusterctl job spec",
        "description": "The TOML file `clusterctl submit` reads; `clusterctl spec SPEC` checks one as clusterctl does.",
        "type": "object",
        "properties": sections,
        "required": [section for section, table in sections.items() if "required" in table],
        "additionalProperties": False,
    }
