"""The input boundary for experiment files: bytes → UTF-8 text → one YAML document, within limits,
before anything is validated, written or run. Every refusal names the file (and line) and the fix.

The limits are far above any real experiment and far below what hurts: a 340-byte alias bomb
expands to billions of values, a 50,000-deep nesting overflows the composer's recursion, a
5,000-digit integer overflows int() — each is refused here, in milliseconds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from dlinfra.errors import SpecError, mask

MAX_BYTES = 1_000_000
MAX_VALUES = 10_000  # YAML nodes once aliases are expanded
MAX_DEPTH = 32
MAX_DIGITS = 20  # an int64 has 19
MAX_SHOWN = 80  # characters of a bad value echoed back in a message
INT_TAG = "tag:yaml.org,2002:int"
# The system's own directories: a user's file (an experiment, its requirements) that resolves into one
# is a mistake or a probe (a link to /etc/shadow), and is never read, so never quoted back. Not /usr
# as a whole (projects live in /usr/src/app in Docker's images), nor /var (DLINFRA_HOME may be there).
SYSTEM_DIRS = (
    *("/etc", "/proc", "/sys", "/dev", "/boot", "/run", "/bin", "/sbin", "/lib", "/lib64"),
    *("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/share", "/usr/include"),
)
Lines = dict[tuple[str | int, ...], int]


def read_text(path: Path, source: str) -> str:
    """The file as text, or a SpecError saying why it cannot be one."""
    checked_path(path, shown(source), "name the experiment file")
    if real := system_file(path):
        raise SpecError(
            [f"{source}: is a system file ({real}), not an experiment. Fix: name your experiment's YAML file"]
        )
    if path.is_dir():
        raise SpecError(
            [f"{source}: is a directory. Fix: name the experiment file in it, e.g. {source}/experiment.yaml"]
        )
    if not path.exists():
        raise SpecError([f"{source}: no such file. Fix: check the path, or run `dlinfra init {source}`"])
    too_big = (
        "an experiment file is a few KB. Fix: keep data out of the spec (training.dataset.uri points at it)"
    )
    return bounded_text(path, source, too_big)


def checked_path(path: Path, where: str, fix: str) -> None:
    """A path this machine can look up at all: not one with a NUL byte, a name over 255 bytes or a
    whole over PATH_MAX, which the file system refuses before it looks (an internal error else)."""
    try:
        path.stat()
    except FileNotFoundError:
        pass  # the caller says what is missing, in its own words
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise SpecError([f"{where}: is no path this machine can open ({why}). Fix: {fix}"]) from None


def system_file(path: Path) -> Path | None:
    """Where `path` really is, if that is in one of the system's own directories."""
    real = path.resolve()
    return real if any(real.is_relative_to(d) for d in SYSTEM_DIRS) else None


def bounded_text(path: Path, where: str, too_big: str) -> str:
    """A user's text file read within the spec's size limit, as UTF-8, or a SpecError naming `where`
    and why it is no text file; never a line of it, which may be anything (a key, /etc/shadow)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)  # bounded: a FIFO or /dev/zero never ends
    except OSError as exc:
        raise SpecError(
            [f"{where}: cannot be read ({exc.strerror}). Fix: check the file's permissions and owner"]
        ) from None
    if len(raw) > MAX_BYTES:
        raise SpecError([f"{where}: over {MAX_BYTES // 1_000_000} MB; {too_big}"])
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or _utf16_without_bom(raw[:64]):
        raise SpecError([f"{where}: is UTF-16 text. Fix: save it as UTF-8 (iconv -f UTF-16 -t UTF-8)"])
    if b"\x00" in raw:
        # a NUL alone says binary (an archive, a model, /proc's environ), not another encoding
        line = raw[: raw.index(b"\x00")].count(b"\n") + 1
        raise SpecError(
            [f"{where}:{line}: holds a NUL byte, so it is no text file. Fix: name the text file meant"]
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError(
            [f"{where}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}). Fix: save the file as UTF-8"]
        ) from None


def _utf16_without_bom(head: bytes) -> bool:
    """ASCII written as UTF-16: a NUL beside every character, on the same side of each pair."""
    pairs = [head[i : i + 2] for i in range(0, len(head) - 1, 2)]
    return len(pairs) >= 2 and any(all(p[i] == 0 and p[1 - i] for p in pairs) for i in (0, 1))


def parse_document(text: str, source: str) -> tuple[dict[str, Any], Lines]:
    """The top-level mapping of an experiment file and the line of each key path."""
    data, lines = _load(text, source)
    if data is None:
        raise SpecError([f"{source}: the file is empty. Fix: start from `dlinfra init`"])
    if not isinstance(data, dict):
        raise SpecError(
            [
                f"{source}:1: (top level): expected a mapping of keys (name:, cluster:, ...), "
                f"got {type(data).__name__}"
            ]
        )
    return data, lines


def parse_value(raw: str, flag: str) -> Any:
    """A `--set` value as YAML reads it (`3` is a number, `[a, b]` a list); plain text otherwise."""
    try:
        return _load(raw, flag)[0]
    except SpecError as exc:
        if any("YAML syntax error" in p for p in exc.problems):
            return raw
        raise


def shown(value: Any) -> str:
    """A value for a message: its repr with anything like a credential masked, cut to a readable length."""
    text = mask(repr(value))
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}… ({len(text)} characters)"


def credentials_in(data: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], str]]:
    """(key path, masked value) of every value or key of a parsed document that holds something shaped
    like a credential: refused before validation, so it never reaches a rendered file, the lock file,
    the manifest, a plan or a log."""
    if isinstance(data, dict):
        keys = [(path, f"the key {shown(k)}") for k in data if isinstance(k, str) and mask(k) != k]
        return keys + [hit for k, v in data.items() for hit in credentials_in(v, (*path, str(k)))]
    if isinstance(data, list):
        return [hit for i, v in enumerate(data) for hit in credentials_in(v, (*path, i))]
    if isinstance(data, str) and mask(data) != data:
        return [(path, shown(data))]
    return []


CREDENTIAL_FIX = (
    "remove it: an experiment file lives in git, and its values land in user-data, plans, logs and the "
    "run record. The CLI takes AWS credentials from the usual chain (environment, ~/.aws, SSO), nodes "
    "from their instance profile; an index, endpoint or data URL must work without a secret in it"
)


def _too_many(source: str) -> SpecError:
    return SpecError(
        [
            f"{source}: holds more than {MAX_VALUES:,} values (each use of a YAML alias counts). "
            "Fix: an experiment needs a few dozen; keep data out of the spec"
        ]
    )


def _too_deep(where: str) -> SpecError:
    return SpecError([f"{where}: nested deeper than {MAX_DEPTH} levels. Fix: an experiment needs a handful"])


def _unprintable(text: str, source: str, exc: yaml.reader.ReaderError) -> str:
    """A character YAML refuses to read: a control character, or (from a flag) a byte of the
    command line that was not UTF-8, which Python keeps as a lone surrogate."""
    code = ord(exc.character) if isinstance(exc.character, str) else int(exc.character)
    line = text[: exc.position].count("\n") + 1
    where = source if source.startswith("-") else f"{source}:{line}"
    what = "a byte that is not UTF-8" if 0xDC80 <= code <= 0xDCFF else f"the control character U+{code:04X}"
    return f"{where}: holds {what}, which YAML does not take. Fix: remove it"


def _unsafe(where: str, problem: str) -> str:
    """A document well formed but asking for more than plain data: a tag that would build an object
    (`!!python/object`, which safe loading refuses) or a key that is a list or a mapping."""
    tag = re.search(r"constructor for the tag '([^']*)'", problem)
    if tag:
        written = re.sub(r"^tag:yaml\.org,2002:", "!!", tag.group(1))
        return (
            f"{where}: the YAML tag {shown(written)} is not allowed: an experiment file holds "
            "plain values (mappings, lists, text, numbers), never objects. Fix: remove the tag"
        )
    return f"{where}: {problem}: an experiment file's keys are plain words. Fix: write the key as text"


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that stops composing at the limits, before a huge document is in memory."""

    def __init__(self, text: str, source: str):
        super().__init__(text)
        self.source, self.nodes, self.depth = source, 0, 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self.nodes += 1
        if self.nodes > MAX_VALUES:
            raise _too_many(self.source)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH + 1:
                raise _too_deep(f"{self.source}:{self.peek_event().start_mark.line + 1}")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _load(text: str, source: str) -> tuple[Any, Lines]:
    try:
        loader = _BoundedLoader(text, source)  # its reader refuses a control character here already
    except yaml.reader.ReaderError as exc:
        raise SpecError([_unprintable(text, source, exc)]) from None
    try:
        root = loader.get_single_node()
        if root is None:
            return None, {}
        lines = _Walk(source).check(root)
        return loader.construct_document(root), lines
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if isinstance(exc, yaml.constructor.ConstructorError):
            raise SpecError([_unsafe(where, problem)]) from None
        raise SpecError(
            [f"{where}: YAML syntax error: {problem}. Fix: check indentation and quoting"]
        ) from None
    finally:
        loader.dispose()


class _Walk:
    """One pass over the composed document, aliases expanded as the constructor would: counts values
    (and stops at the limit), records each key path's line, and finds duplicate keys and huge numbers."""

    def __init__(self, source: str):
        self.source = source
        self.values = 0
        self.lines: Lines = {}
        self.problems: list[str] = []

    def check(self, root: yaml.Node) -> Lines:
        self._visit(root, ())
        if self.problems:
            raise SpecError(self.problems)
        return self.lines

    def _visit(self, node: yaml.Node, path: tuple[str | int, ...]) -> None:
        self.values += 1
        where = f"{self.source}:{node.start_mark.line + 1}"
        if self.values > MAX_VALUES:
            raise _too_many(self.source)
        if len(path) > MAX_DEPTH:
            raise _too_deep(where)
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                name = str(key.value)
                line = key.start_mark.line + 1
                if name in seen and name != "<<":
                    dotted = ".".join(map(str, (*path, name)))
                    self.problems.append(
                        f"{self.source}:{line}: {dotted}: given twice (lines {seen[name]} and {line}); "
                        "YAML would keep only the last. Fix: remove one"
                    )
                seen[name] = line
                self.lines.setdefault((*path, name), line)
                self._visit(value, (*path, name))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.lines.setdefault((*path, i), item.start_mark.line + 1)
                self._visit(item, (*path, i))
        elif node.tag == INT_TAG and len(node.value.lstrip("+-").replace("_", "")) > MAX_DIGITS:
            dotted = ".".join(map(str, path)) or "(top level)"
            self.problems.append(
                f"{where}: {dotted}: a number of {len(node.value)} digits. "
                "Fix: use a value in the allowed range"
            )


class StrictModel(BaseModel):
    """User input: unknown keys are typos, and a resolved spec never changes."""

    # allow_inf_nan: `.inf` for a timeout would switch the check off, and render cannot print it
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ---------------------------------------------------------------- cluster
