"""One lock per run and flavor: `uv pip compile --generate-hashes` for the nodes' platform.

The lock holds every package a node runs except dlinfra itself when the run ships its own wheel
(that wheel is pinned by its sha256 in the manifest and installed `--no-deps` after the lock). Its
text is deterministic for the same inputs and index state, so its sha256 names an environment:
a baked image, a cached local venv and a node compare locks by that digest.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dlinfra import __version__
from dlinfra.environment.declared import Declared
from dlinfra.errors import DlinfraError, SpecError, mask

# "controller": the account controller's image (dlinfra and boto3 to drive terraform; no TensorFlow)
Flavor = Literal["cpu", "gpu", "controller"]
EXTRAS: dict[Flavor, str] = {"cpu": "train,aws", "gpu": "train-gpu,aws", "controller": "aws"}
# Script mode holds the user's requirements, dlinfra's agent (its own dependencies, py-spy, boto3)
# and a TensorFlow: dlinfra's build, unless the requirements pin their own (an Estimator program on
# 2.15, say), which is then the only one in the lock. Nothing else, pinned or not: no scikit-learn,
# which Program mode's extras carry (a script that imports it lists it; validate says so).
SCRIPT_EXTRAS: dict[Flavor, str] = {"cpu": "script-cpu,aws", "gpu": "script-gpu,aws", "controller": "aws"}
OWN_TENSORFLOW_EXTRAS = "script,aws"
TENSORFLOW_NAMES = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-nightly")
FIELD = "training.requirements"
PYPI = "https://pypi.org/simple"
RESOLVE_TIMEOUT = 600.0
# uv draws its explanations as a tree (x, box-drawing lines, arrows): quoted as plain text
GLYPHS = re.compile(r"^[\s\u00d7\u2570\u2500\u25b6\u2502\u251c]+")
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Versions a lock takes where nothing in it asks for others: uv's preferences (what it reads from an
# existing output file), never a constraint, so a requirement that wants another version gets it.
# ml-dtypes 0.7.0 spends 0.55 s of CPU registering its numpy ufunc loops at every `import tensorflow`
# (0.6.0: 4 ms, with numpy 2.2 to 2.4 alike; BENCHMARKS.md, "ml-dtypes"): on the chief's path to the
# first step, every mirrored worker's, and 15-20x that on an emulated VM.
PREFERRED = ("ml-dtypes==0.6.0",)


@dataclass(frozen=True)
class Platform:
    """What the nodes run on: the image's Python, the instance's architecture, and the oldest glibc
    the lock's wheels may need. An index with one wheel per release (a wheelhouse of this machine's
    downloads) may hold only a wheel tagged for a newer glibc than 2.28 (tensorboard-data-server's is
    manylinux_2_31): a platform whose glibc is known says so, and such wheels can be locked."""

    python: str  # "3.11"
    machine: str  # "x86_64" or "aarch64"
    # 2.28: Debian 10+, Ubuntu 20.04+, Amazon Linux 2023; TensorFlow's wheels need no newer
    glibc: str = "2.28"

    @classmethod
    def here(cls) -> Platform:
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        libc, version = platform.libc_ver()
        return cls(python, platform.machine(), _uv_glibc(version) if libc == "glibc" else "2.28")

    @property
    def uv(self) -> str:
        return f"{self.machine}-manylinux_{self.glibc.replace('.', '_')}"

    def __str__(self) -> str:
        return f"Python {self.python} on linux/{self.machine}"


@dataclass(frozen=True)
class Index:
    """Where packages come from: `aws.pip_index_url`, else the variables pip and uv users already
    set (PIP_INDEX_URL, UV_DEFAULT_INDEX, ...), else PyPI; plus extra indexes. Resolution and every
    install use the same ones."""

    url: str = PYPI
    extra: tuple[str, ...] = ()
    extra_ca: str | None = None  # PEM text (aws.pip_extra_ca)

    @classmethod
    def of(cls, index_url: str | None, extra_ca: str | None, environ: Mapping[str, str]) -> Index:
        url = index_url or next(
            (environ[k] for k in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL") if environ.get(k)),
            PYPI,
        )
        extra: list[str] = []
        for key in ("UV_INDEX", "UV_EXTRA_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
            extra += [u for u in environ.get(key, "").split() if u not in extra]
        return cls(url, tuple(extra), extra_ca)

    def uv_args(self) -> list[str]:
        args = ["--index-url", self.url]
        for url in self.extra:
            args += ["--extra-index-url", url]
        return args

    def shown(self) -> str:
        """For the manifest and logs: credentials masked."""
        return " + ".join(mask(u) for u in (self.url, *self.extra))

    def has_credentials(self) -> bool:
        return any(mask(u) != u for u in (self.url, *self.extra))


@dataclass(frozen=True)
class Lock:
    """A lock's text (uv's requirements format: `name==version` with `--hash=sha256:` lines)."""

    text: str
    flavor: Flavor = "cpu"
    platform: Platform = field(default_factory=Platform.here)
    # how it was made when not from the index's answer just now (cached, offline): the run's log says so
    note: str = field(default="", compare=False)

    @functools.cached_property
    def sha256(self) -> str:  # once: every node's config names it (a 1,000-worker render asked 2,006 times)
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def file_name(self) -> str:
        return f"env-{self.flavor}.lock"

    def pins(self) -> dict[str, str]:
        return pins_of(self.text)


def pins_of(text: str) -> dict[str, str]:
    """{normalized name: version} of every package a lock pins."""
    found = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", text, flags=re.M)
    return {normalize(name): version for name, version in found}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _uv_glibc(version: str) -> str:
    """The newest manylinux tag uv targets (2.17 to 2.40) that a glibc of `version` runs."""
    major, minor = (int(x) for x in [*version.split("."), "0"][:2])
    return f"2.{max(17, min(40, minor))}" if major == 2 else "2.28"


def uv() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


def uv_environ(index: Index, scratch: Path) -> dict[str, str]:
    """uv's environment: no colour in messages we quote; an extra CA added to the system's roots.
    No interpreter downloads: a lock for another Python needs none (uv resolves by the wheels' tags),
    and without the internet the attempt alone cost 7 s of DNS failures per resolution."""
    env = dict(os.environ, NO_COLOR="1", UV_NO_PROGRESS="1", UV_PYTHON_DOWNLOADS="never")
    if index.extra_ca:
        bundle = scratch / "ca.pem"
        system = SYSTEM_CA.read_text(encoding="utf-8") if SYSTEM_CA.is_file() else ""
        bundle.write_text(system + "\n" + index.extra_ca + "\n", encoding="utf-8")
        env["SSL_CERT_FILE"] = str(bundle)
    return env


def pins_tensorflow(requirements: list[str]) -> bool:
    """Whether the requirements name a TensorFlow build of their own."""
    from packaging.requirements import InvalidRequirement, Requirement

    for text in requirements:
        with contextlib.suppress(InvalidRequirement):
            if normalize(Requirement(text).name) in TENSORFLOW_NAMES:
                return True
    return False


def extras(flavor: Flavor, requirements: list[str], script: bool) -> str:
    """dlinfra's extras in the lock (see SCRIPT_EXTRAS for script mode's one rule)."""
    if not script:
        return EXTRAS[flavor]
    return OWN_TENSORFLOW_EXTRAS if pins_tensorflow(requirements) else SCRIPT_EXTRAS[flavor]


def beside(requirements: list[str], script: bool) -> str:
    """What a run's environment holds beside the user's requirements, for `plan` and `validate`."""
    if not script:
        return "dlinfra's training stack (TensorFlow 2.21, Keras, scikit-learn, TensorBoard) and boto3"
    tensorflow = (
        "no TensorFlow of dlinfra's (yours is pinned)"
        if pins_tensorflow(requirements)
        else ("TensorFlow 2.21 and TensorBoard (pin tensorflow in training.requirements for your own)")
    )
    return f"dlinfra's agent (its dependencies, py-spy, boto3), {tensorflow}; nothing else"


def resolve(
    dlinfra: str,
    requirements: list[str],
    flavor: Flavor,
    target: Platform,
    index: Index,
    script: bool = False,
) -> Lock:
    """The lock of one flavor. `dlinfra` is the run's wheel (a path), a source checkout's
    pyproject.toml (its declared dependencies, the same as its wheel's: environment/declared.py) or a
    release pin (`==X`). `script`: the nodes run the user's command (see extras). A conflict, or a
    requirement no index holds, is a SpecError (exit 2) naming the field."""
    wanted = extras(flavor, requirements, script)
    if dlinfra.endswith(".whl"):
        top = [f"dlinfra[{wanted}] @ {Path(dlinfra).absolute().as_uri()}"]
    elif dlinfra.endswith("pyproject.toml"):
        declared = Declared.read(Path(dlinfra))
        declared.refuse_python(target.python)
        top = declared.requirements(wanted)
    else:
        top = [f"dlinfra[{wanted}]=={dlinfra.removeprefix('==') or __version__}"]
    with tempfile.TemporaryDirectory(prefix="dlinfra-lock-") as tmp:
        scratch = Path(tmp)
        (scratch / "requirements.in").write_text("\n".join([*top, *requirements]) + "\n", encoding="utf-8")
        (scratch / "lock.txt").write_text("\n".join(PREFERRED) + "\n", encoding="utf-8")
        command = [
            uv(), "pip", "compile", str(scratch / "requirements.in"),
            "--generate-hashes", "--no-header", "--no-annotate", "--quiet",
            "--python-version", target.python, "--python-platform", target.uv,
            "-o", str(scratch / "lock.txt"), *index.uv_args(),
        ]  # fmt: skip
        result, offline = _compile(command, index, scratch), ""
        if result.returncode != 0 and _unreachable(result.stderr):
            # offline: what uv cached from the index resolves it alike (validate on a train, say)
            first, result = result, _compile([*command, "--offline"], index, scratch)
            if result.returncode != 0:  # not a conflict: uv's cache lacks what the index would say
                raise _unreached(first.stderr, index)
            offline = (
                f"the package index did not answer ({index.shown()}): locked offline from uv's cache "
                "of it, which may lack releases published since it was filled"
            )
        if result.returncode != 0:
            raise _failure(result.stderr, requirements, flavor, target, index)
        text = (scratch / "lock.txt").read_text(encoding="utf-8")
    return Lock(_without_local_files(text), flavor, target, offline)


def _compile(command: list[str], index: Index, scratch: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command, capture_output=True, text=True, env=uv_environ(index, scratch), timeout=RESOLVE_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise DlinfraError(
            f"resolving the run's environment took over {RESOLVE_TIMEOUT:.0f}s ({index.shown()}). "
            "Fix: check that the package index answers"
        ) from None


def _unreachable(stderr: str) -> bool:
    return any(
        w in stderr for w in ("error sending request", "Could not connect", "dns error", "Connection refused")
    )


def _without_local_files(text: str) -> str:
    """Drop `name @ file://...` entries (the run's own wheel): no node has this machine's files."""
    out, skipping = [], False
    for line in text.splitlines():
        if line and not line[0].isspace():
            skipping = " @ file://" in line
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


class IndexUnreachable(DlinfraError):
    """The package index did not answer, and uv's cache of it could not lock the environment."""


def _unreached(stderr: str, index: Index) -> IndexUnreachable:
    return IndexUnreachable(
        f"could not reach the package index to lock the run's environment ({index.shown()}), and uv's "
        f"cache of it holds too little to lock it offline: {_whole_lines(_quoted(stderr)[-3:], 600)}. "
        "Fix: check the network, or point PIP_INDEX_URL / aws.pip_index_url at a mirror this machine "
        "reaches"
    )


def _quoted(stderr: str) -> list[str]:
    """uv's message lines as plain text, secrets masked, its hints and warnings left out."""
    lines = [GLYPHS.sub("", line).rstrip() for line in stderr.splitlines()]
    return [mask(line) for line in lines if line and not line.startswith(("hint:", "warning:"))]


def _failure(
    stderr: str, requirements: list[str], flavor: Flavor, target: Platform, index: Index
) -> DlinfraError:
    why = _whole_lines(_quoted(stderr), 1500)
    where = FIELD if requirements else "dlinfra's own dependencies"
    return SpecError(
        [
            f"{where}: no environment satisfies them for the nodes ({target}, the {flavor} build of "
            f"TensorFlow, index {index.shown()}): {why}. Fix: loosen or correct the pin the resolver "
            "names, or publish the package to the index"
        ]
    )


def _whole_lines(lines: list[str], budget: int) -> str:
    """The resolver's explanation joined, cut between its sentences, never inside one: a sentence
    cut short names half a package or half a version range."""
    sentences: list[str] = []
    for line in (line.strip() for line in lines):
        # uv wraps a long sentence over lines; a label ("cause:") or a capital starts a new one
        wrapped = sentences and not sentences[-1].endswith((".", ":")) and not re.match(r"[A-Z]|\w+: ", line)
        if wrapped:
            sentences[-1] += f" {line}"
        else:
            sentences.append(line)
    kept: list[str] = []
    for line in sentences:
        if len("; ".join([*kept, line])) > budget and kept:
            break
        kept.append(line.rstrip(".:") if len(line) <= budget else f"{line[:budget]}…")
    rest = len(sentences) - len(kept)
    return "; ".join(kept) + (f" (and {rest} more of the resolver's sentences)" if rest else "")
