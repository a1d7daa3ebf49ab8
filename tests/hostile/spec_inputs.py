"""Classes 5, 8 and 9 of issue 55 where the spec and its files are read: files that are not what they
claim to be (a requirements file that is binary, not UTF-8, a system file, 2 MB), internal errors
(a sizing history of the wrong shape, an extreme shaped link), and messages that mislead."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from hostile import Case

PASSWD_LINE = "root:x:0:0:root:/root:/bin/bash"
Args = Callable[[Path], list[str]]


def _requirements(content: bytes, link: str | None = None) -> Args:
    """An experiment whose training.requirements names req.txt holding `content` (or linking to `link`)."""

    def make(work: Path) -> list[str]:
        req = work / "req.txt"
        if link:
            req.symlink_to(link)
        else:
            req.write_bytes(content)
        spec = work / "experiment.yaml"
        spec.write_text("name: reqs\ntraining:\n  requirements: req.txt\n")
        return ["validate", str(spec)]

    return make


def _with_history(relative: str, content: object, command: list[str]) -> Args:
    """A spec storing in the scratch directory, whose sizing history holds `content` at `relative`
    ({model} and {device}: the spec's sizing keys, as dlinfra computes them)."""

    def make(work: Path) -> list[str]:
        from dlinfra.sizing.advisor import device_key, model_key
        from dlinfra.spec.loading import load_spec

        spec = work / "experiment.yaml"
        spec.write_text(f"name: sized\nstorage:\n  url: file://{work}/store\n")
        resolved = load_spec(spec)
        path = (
            work
            / "store"
            / "sizing"
            / relative.format(model=model_key(resolved), device=device_key(resolved))
        )
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(content))
        return [command[0], str(spec), *command[1:]]

    return make


def _spec(text: str, *args: str, command: str = "validate") -> Args:
    def make(work: Path) -> list[str]:
        spec = work / "experiment.yaml"
        spec.write_text(text)
        return [command, str(spec), *args]

    return make


def _experiment_link(target: str) -> Args:
    def make(work: Path) -> list[str]:
        (work / "experiment.yaml").symlink_to(target)
        return ["validate", str(work / "experiment.yaml")]

    return make


def _long_command(work: Path) -> list[str]:
    (work / "train.py").write_text("print('hi')\n")
    spec = work / "experiment.yaml"
    argument = json.dumps("x" * 900_000)
    spec.write_text(f"name: long\ntarget: aws\ntraining:\n  command: [python, train.py, {argument}]\n")
    return ["validate", str(spec)]


def _nul(work: Path) -> list[str]:
    (work / "experiment.yaml").write_bytes(b"name: a\x00b\n")
    return ["validate", str(work / "experiment.yaml")]


SHAPED = "name: shaped\ncluster:\n  local_network: shaped\n  local_link_scale: 1e-300\n"
NO_TEXT = ("holds a NUL byte, so it is no text file",)

CASES = [
    # class 5: a requirements file that is no requirements file
    Case("requirements-binary", _requirements(bytes(range(256)) * 40), ("req.txt", *NO_TEXT)),
    Case(
        "requirements-not-utf8",
        _requirements(b"numpy\ncaf\xe9-tools\n"),
        ("req.txt:2: not UTF-8 text", "training.requirements"),
    ),
    Case(
        "requirements-link-into-etc",
        _requirements(b"", link="/etc/passwd"),
        ("training.requirements", "is a system file (/etc/passwd)"),
        absent=("root:x",),
    ),
    Case(
        "requirements-a-passwd-copy",
        _requirements((PASSWD_LINE + "\n").encode() * 30),
        ("req.txt:1: the line is not a requirement", "and 25 more lines that are no requirement"),
        absent=("root:x", "/bin/bash"),
    ),
    Case(
        "requirements-2-mb",
        _requirements(b"numpy\n" * 350_000),
        ("req.txt: over 1 MB", "training.requirements"),
    ),
    Case(
        "requirements-one-line-of-900-kb",
        _requirements(b"a" * 900_000 + b"\n"),
        ("req.txt:1: the line is 900,000 characters long",),
        absent=("a" * 100,),
    ),
    Case(
        "requirements-path-with-nul",
        _spec('name: reqs\ntraining:\n  requirements: "req\\0.txt"\n'),
        ("training.requirements", "is no path this machine can open (embedded null byte)"),
    ),
    Case(
        "requirements-path-too-long",
        _spec(f"name: reqs\ntraining:\n  requirements: {'r' * 5000}.txt\n"),
        ("training.requirements", "(File name too long)", "(5006 characters)"),
        absent=("r" * 100,),
    ),
    Case(
        "experiment-link-to-etc-shadow",
        _experiment_link("/etc/shadow"),
        ("experiment.yaml: is a system file (/etc/shadow), not an experiment",),
        absent=("root:",),
    ),
    Case(
        "experiment-path-too-long",
        lambda work: ["validate", str(work / ("e" * 5000))],
        ("is no path this machine can open (File name too long)",),
        absent=("e" * 100,),
    ),
    # class 8: internal errors
    Case(
        "sizing-history-runs-a-list",
        _with_history("runs/{model}.json", [1, 2], ["advise", "--history"]),
        ("runs/", "Input should be a JSON object", "Fix: delete it"),
        absent=("_Runs",),
    ),
    Case(
        "sizing-history-run-without-fields",
        _with_history("runs/{model}.json", {"runs": [{"x": 1}]}, ["advise", "--history"]),
        ("runs.0.run_id: Field required", "Fix: delete it"),
    ),
    Case(
        "sizing-profile-wrong-shape-at-validate",
        _with_history("profiles/{model}/{device}.json", {"step_seconds": "fast"}, ["validate"]),
        ("step_seconds", "Fix: delete it"),
        absent=(": valid",),
    ),
    Case(
        "sizing-profile-step-of-1e300-seconds",
        _with_history(
            "profiles/{model}/{device}.json",
            {"step_seconds": 1e300, "parameters": 10, "trainable": 10},
            ["advise"],
        ),
        ("step_seconds: Input should be less than or equal to 86400", "Fix: delete it"),
    ),
    Case(
        "shaped-link-scale-extreme",
        _spec(SHAPED),
        ("experiment.yaml:4: cluster.local_link_scale", "Fix: use a local_link_scale of at least"),
    ),
    Case(
        "shaped-link-scale-extreme-deploy",
        _spec(SHAPED, command="deploy"),
        ("cluster.local_link_scale", "at least"),
    ),
    # class 9: messages that mislead
    Case(
        "nul-byte-is-not-utf16",
        _nul,
        ("experiment.yaml:1: holds a NUL byte",),
        absent=("UTF-16",),
    ),
    Case(
        "control-character-in-the-spec",
        _spec("name: a\x07b\n"),
        ("experiment.yaml:1: holds the control character U+0007", "Fix: remove it"),
    ),
    Case(
        "set-value-not-utf8",
        lambda work: ["validate", "--set", "name=a\udcffb"],  # argv's byte 0xff, as Python keeps it
        ("--set name: holds a byte that is not UTF-8",),
    ),
    Case(
        "aws-python-3-10-unquoted",
        _spec("target: aws\naws:\n  python: 3.10\n"),
        ("aws.python: 3.1 is a number to YAML", "quote the version: python: '3.10'"),
    ),
    Case(
        "tag-value-a-number",
        _spec("target: aws\naws:\n  tags:\n    version: 1.10\n"),
        ("aws.tags.version", "Fix: quote the value as it was meant"),
        absent=("dlinfra schema",),
    ),
    Case(
        "section-not-a-mapping",
        _spec("storage: 5\n"),
        ("storage: Input should be a mapping of keys", "endpoint_url, url"),
        absent=("StorageSpec",),
    ),
    Case(
        "aws-command-900-kb",
        _long_command,
        ("training.command: the user-data of node", "Fix: give the script its long settings in a file"),
        absent=("training.model", "xxxxxxxxxx"),
    ),
]
