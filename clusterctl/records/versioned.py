"""What every cross-process record shares: a kind, a version, and one error for a file not understood."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from itertools import islice
from typing import Any, TypeVar

from clusterctl.errors import ClusterctlError
from clusterctl.files import UnreadableFileError, read_regular_file
from clusterctl.slurm.names import node_name_problem
from clusterctl.text import one_line

T = TypeVar("T")


class RecordError(ClusterctlError):
    """A record file that is not what its reader understands (damaged, foreign, or from a newer clusterctl)."""

    exit_code = 10

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


def header(kind: str, version: int) -> dict[str, Any]:
    """The two fields every record starts with."""
    return {"kind": kind, "version": version}


def check_header(data: object, kind: str, version: int, where: str) -> Mapping[str, Any]:
    """`data` as a mapping of this kind at this version, or RecordError saying what to do.

    A newer version is refused rather than half-read: the writer knows something this reader does not.
    """
    if not isinstance(data, Mapping):
        raise RecordError(where, f"not a {kind} record (expected a JSON object)")
    if data.get("kind") != kind:
        raise RecordError(where, f"not a {kind} record (kind {data.get('kind')!r})")
    found = data.get("version")
    if not isinstance(found, int) or isinstance(found, bool):
        raise RecordError(where, f"{kind} record without a version number")
    if found > version:
        raise RecordError(where, f"{kind} record version {found} is newer than this clusterctl understands "
                                 f"({version}); upgrade clusterctl on this host")
    if found < version:
        raise RecordError(where, f"{kind} record version {found} is older than this clusterctl reads ({version})")
    return data


def checked(cls: type[T], values: dict[str, Any]) -> T:
    """An instance of the frozen dataclass `cls` holding `values`, already checked by the caller, made
    without its __init__: a frozen dataclass sets each field through object.__setattr__, five times the
    cost of this, and the agent makes 100,000 such records a heartbeat at 12,500 nodes.  `values` must
    name every field (the result is then equal to `cls(**values)`); nothing else may use it."""
    made: T = object.__new__(cls)
    made.__dict__.update(values)
    return made


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The `default` of a field reader that has none: the field must be present."""


def field(data: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str, *,
          default: Any = REQUIRED) -> Any:
    """One field of the expected type (bool is never accepted as int).  It is required unless a `default`
    is given: then an absent field reads as `default` (a field a later release added within a version).
    The readers below that take a `default` take it the same way."""
    if key not in data:
        if default is not REQUIRED:
            return default
        raise RecordError(where, f"missing field `{key}`")
    value = data[key]
    wanted = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in wanted:
        raise RecordError(where, f"field `{key}` has the wrong type (bool)")
    if not isinstance(value, wanted):
        raise RecordError(where, f"field `{key}` has the wrong type ({type(value).__name__})")
    return value


def _float(value: int | float, key: str, where: str) -> float:
    try:
        return float(value)
    except OverflowError:  # a whole number too large for a float
        raise RecordError(where, f"field `{key}` is too large a number") from None


def number_field(body: Mapping[str, Any], key: str, where: str, *, default: float = REQUIRED) -> float:
    """A number of any sign, as a float."""
    return _float(field(body, key, (int, float), where, default=default), key, where)


def number_or_none_field(body: Mapping[str, Any], key: str, where: str, *,
                         default: float | None = REQUIRED) -> float | None:
    """A number of any sign as a float, or null (None)."""
    value = field(body, key, (int, float, type(None)), where, default=default)
    return None if value is None else _float(value, key, where)


def text_field(body: Mapping[str, Any], key: str, where: str, *, limit: int, printable: bool = False) -> str:
    """A text field of at most `limit` characters (`printable`: no control characters either)."""
    value: str = field(body, key, str, where)
    if printable and (len(value) > limit or not value.isprintable()):
        raise RecordError(where, f"field `{key}` must be printable text of at most {limit} characters")
    if len(value) > limit:
        raise RecordError(where, f"field `{key}` is longer than {limit} characters")
    return value


def text_or_none_field(body: Mapping[str, Any], key: str, where: str, *, limit: int) -> str | None:
    """A text field of at most `limit` characters, or null (None); present either way."""
    return None if body.get(key, "") is None else text_field(body, key, where, limit=limit)


def strings_field(body: Mapping[str, Any], key: str, where: str, *,
                  default: tuple[str, ...] = REQUIRED) -> tuple[str, ...]:
    """A list of strings, as a tuple."""
    values = field(body, key, list, where, default=default)
    if not all(isinstance(v, str) for v in values):
        raise RecordError(where, f"field `{key}` must be a list of strings")
    return tuple(values)


def indented_json(document: Any) -> str:
    """`json.dumps(document, indent=2, sort_keys=True)`, the same text, built without holding every
    piece of it at once (json.dumps keeps millions of small strings for a 100,000-node rank map)."""
    pieces = json.JSONEncoder(indent=2, sort_keys=True).iterencode(document)
    parts = []
    while batch := list(islice(pieces, 65_536)):
        parts.append("".join(batch))
    return "".join(parts)


def parse_json_record(raw: bytes, where: str) -> Any:
    """A record file's bytes as JSON; RecordError (naming `where`) for bytes that are not UTF-8 JSON."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordError(where, f"not a readable JSON record ({exc.__class__.__name__})") from None


RECORD_LIMIT = 256 << 20
"""The largest record file read (bytes): far above any record clusterctl writes (a 100,000-node rank
map is tens of MB), far below what would exhaust a reader's memory."""


def read_json_record(path: Path, *, missing_ok: bool = False, limit: int = RECORD_LIMIT,
                     follow_symlinks: bool = True) -> Any:
    """A record file as JSON: None for a missing file when `missing_ok` (else FileNotFoundError);
    RecordError for a file that cannot be read, is not a regular file (a directory, a FIFO: never
    waited on), is larger than `limit` bytes, or is not UTF-8 JSON."""
    try:
        raw = read_regular_file(path, limit=limit, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    except UnreadableFileError as exc:
        raise RecordError(str(path), exc.reason) from None
    return parse_json_record(raw, str(path))


MAX_WHOLE = 2**63 - 1
"""The largest whole number a record field takes (what a signed 64-bit counter holds)."""


def refuse_unknown(body: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    """RecordError naming the first field of `body` not in `known` (written by a newer clusterctl?)."""
    unknown = sorted(str(key) for key in body if key not in known)
    if unknown:
        raise RecordError(where, f"unknown field `{one_line(unknown[0][:64])}` (written by a newer clusterctl?): "
                                 "this reader does not guess what it means")


def whole_field(body: Mapping[str, Any], key: str, where: str, *, maximum: int = MAX_WHOLE) -> int:
    """A whole-number field from 0 to `maximum` (bool refused)."""
    value = field(body, key, int, where)
    if not 0 <= value <= maximum:
        raise RecordError(where, f"field `{key}` is {value}: a whole number from 0 to {maximum}")
    return int(value)


def count_field(body: Mapping[str, Any], key: str, where: str) -> int:
    """A whole number, not negative, with no bound above: for the records whose one-pass readers take any
    such `int` (a node's report, a rank's progress), so that this accepts exactly what they do."""
    value: int = field(body, key, int, where)
    if value < 0:
        raise RecordError(where, f"field `{key}` is {value}: a whole number, not negative")
    return value


def finite_field(body: Mapping[str, Any], key: str, where: str, *, what: str) -> float:
    """A finite number, not negative, as a float; `what` names it in the error ("a finite count")."""
    value = field(body, key, (int, float), where)
    try:
        number = float(value)
    except OverflowError:  # a whole number too large for a float
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise RecordError(where, f"field `{key}` is {one_line(repr(value)[:64])}: {what}, not negative")
    return number


def seconds_field(body: Mapping[str, Any], key: str, where: str) -> float:
    """A field of seconds (or an epoch time): a finite number, not negative."""
    return finite_field(body, key, where, what="a finite number of seconds")


def dated_field(body: Mapping[str, Any], key: str, value: float | None, where: str) -> int | None:
    """The step (or rank) beside a measured `value`: a whole number beside a value, null without one."""
    if value is None:
        if body.get(key) is not None:
            raise RecordError(where, f"field `{key}` is set without the value it goes with")
        return None
    return count_field(body, key, where)


def node_field(body: Mapping[str, Any], key: str, where: str) -> str:
    """A field holding a Slurm node name (what may be put in an argv)."""
    value = field(body, key, str, where)
    if (problem := node_name_problem(value)):
        raise RecordError(where, f"field `{key}`: {problem}")
    return str(value)


def nodes_field(body: Mapping[str, Any], key: str, where: str, *,
                default: tuple[str, ...] = REQUIRED) -> tuple[str, ...]:
    """A list of Slurm node names, as a tuple."""
    names = strings_field(body, key, where, default=default)
    for name in names:
        if (problem := node_name_problem(name)):
            raise RecordError(where, f"field `{key}`: {problem}")
    return names


def choice_field(body: Mapping[str, Any], key: str, choices: tuple[str, ...], where: str) -> str:
    """A text field that is one of `choices`."""
    value = field(body, key, str, where)
    if value not in choices:
        raise RecordError(where, f"field `{key}` is {value[:64]!r}: one of {', '.join(choices)}")
    return str(value)


NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
"""How a measured value that is not a finite number is written: JSON has no NaN or infinity, and a loss
that went NaN is exactly what a user wants to see."""


def measured_to_json(value: float | None) -> float | str | None:
    """A value a training program measured (a loss, a gradient norm) as stored: the number, or
    "nan", "inf", "-inf" (see NON_FINITE), or None when there is none."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"


def measured_field(body: Mapping[str, Any], key: str, where: str) -> float | None:
    """An optional measured value (see `measured_to_json`): a number of any sign, "nan", "inf", "-inf", or
    null.  Non-finite values come back as `math.nan` / `math.inf` themselves, so a record holding a NaN
    compares equal to itself once read back."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(where, f"field `{key}` is {one_line(repr(value)[:64])}: a number, \"nan\", \"inf\", "
                                 "\"-inf\" or null")
    number = float(value)
    if math.isfinite(number):
        return number
    return math.nan if math.isnan(number) else math.inf if number > 0 else -math.inf
