"""`training.pass_env`: the deploying shell's variables a local node gets by name (node.environ)."""

from __future__ import annotations

import re

from dlinfra.spec.input import shown

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Set by dlinfra on every node: the shell's would be overridden, or break the node's own environment.
SET_BY_DLINFRA = frozenset({"TF_CONFIG", "TMPDIR", "PATH", "PYTHONUNBUFFERED", "PYTHONPATH", "PYTHONHOME"})
MAX_NAMES = 64
DESCRIPTION = (
    "local target: names of variables of the shell that runs deploy that its nodes and a script get, "
    "e.g. [WANDB_API_KEY]. A local node otherwise starts from an allow-list (PATH, HOME, the locale, "
    "proxies, DLINFRA_*; AWS settings only where the node reaches S3 itself), and a script gets AWS "
    "keys only named here. Values are never recorded, and masked in the store's copy of the log."
)
AWS_FIX = (
    "training.pass_env passes the deploying shell's variables to local nodes; an instance gets only "
    "its own environment and its role. Fix: remove training.pass_env for target aws (nodes reach S3 "
    "through their instance profile)"
)


def problems(names: list[str]) -> list[str]:
    """What is wrong with each name, as `[index] why`."""
    found = []
    for i, name in enumerate(names):
        if not NAME.fullmatch(name):
            found.append(
                f"[{i}] {shown(name)} is not a variable name (letters, digits, _; not first a digit)"
            )
        elif name in SET_BY_DLINFRA:
            found.append(f"[{i}] {name} is set by dlinfra on every node; leave it out")
    if len(set(names)) < len(names):
        found.append("a name is given twice")
    return found
