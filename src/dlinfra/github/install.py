"""Which dlinfra the generated workflows install: exactly the one that wrote them.

A version pin (`dlinfra[aws,emulator]==0.1.0`) names whatever an index serves under that name: no
index serves this dlinfra yet, and a stranger who registers the name would have adopters' CI run
their package. So the default is what PEP 610's direct_url.json (or the checkout) says this dlinfra
was installed from, pinned so that it cannot move: a git URL at its commit, or a hosted wheel with
its sha256. Anything else (an index, a local wheel, a checkout with changes or no https remote)
has no such pin: `init --github` refuses and names the choices, rather than guessing.
"""

from __future__ import annotations

import json
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from dlinfra import __version__
from dlinfra.errors import SpecError

EXTRAS = "dlinfra[aws,emulator]"
COMMIT_RE = re.compile(r"[0-9a-f]{40}")


def default_install() -> str:
    """The running dlinfra as a pip requirement a GitHub runner installs to the same code, or a
    SpecError (exit 2) naming the --install choices."""
    try:
        direct = metadata.distribution("dlinfra").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        direct = None
    info: dict[str, Any] = json.loads(direct) if direct else {}
    found, how = pinned(info)
    if found:
        return found
    raise SpecError(
        [
            f"--install: this dlinfra {__version__} came from {how}: a GitHub runner cannot install "
            "it as the same code. Fix: pass --install with one of: "
            f"'{EXTRAS} @ git+https://github.com/ORG/dlinfra@COMMIT' (a commit you pushed), "
            f"'{EXTRAS} @ https://HOST/dlinfra-{__version__}-py3-none-any.whl#sha256=HEX' (a wheel "
            f"you host), or '{EXTRAS}==VERSION' only if your runners' index serves that dlinfra"
        ]
    )


def pinned(info: dict[str, Any]) -> tuple[str | None, str]:
    """(the requirement, None if there is none) and how dlinfra was installed, for the message."""
    url = str(info.get("url", ""))
    vcs = info.get("vcs_info") or {}
    if (
        vcs.get("vcs") == "git"
        and url.startswith("https://")
        and COMMIT_RE.fullmatch(vcs.get("commit_id", ""))
    ):
        return f"{EXTRAS} @ git+{url}@{vcs['commit_id']}", "git"
    archive = info.get("archive_info")
    if archive is not None and url.startswith("https://"):
        digest = (archive.get("hashes") or {}).get("sha256") or str(archive.get("hash", "")).removeprefix(
            "sha256="
        )
        if re.fullmatch(r"[0-9a-f]{64}", digest):
            return f"{EXTRAS} @ {url.split('#')[0]}#sha256={digest}", "a wheel URL"
        return None, "a URL with no sha256 recorded"
    if "dir_info" in info and url.startswith("file://"):
        return _checkout(Path(unquote(urlparse(url).path)))
    if url:
        return None, "a local file"
    return None, "a package index (which one is not recorded)"


def _checkout(root: Path) -> tuple[str | None, str]:
    """A git checkout's commit, fetched from its https `origin`: only if the tree has no changes,
    as the commit is then the code that runs."""

    def git(*args: str) -> str | None:
        try:
            result = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout.strip() if result.returncode == 0 else None

    commit, remote = git("rev-parse", "HEAD"), git("remote", "get-url", "origin")
    if commit is None or not COMMIT_RE.fullmatch(commit):
        return None, f"the directory {root}, not a git checkout"
    if remote is None:
        return None, f"the checkout {root}, which has no `origin` remote"
    if m := re.fullmatch(r"git@([A-Za-z0-9.-]+):([A-Za-z0-9_./-]+)", remote):
        remote = f"https://{m[1]}/{m[2]}"  # the same repository, as a runner fetches it without a key
    if not remote.startswith("https://") or "@" in remote.removeprefix("https://").split("/")[0]:
        return None, f"the checkout {root}, whose `origin` is not a plain https URL"
    if git("status", "--porcelain", "--untracked-files=no") != "":
        return None, f"the checkout {root}, which has uncommitted changes"
    return f"{EXTRAS} @ git+{remote}@{commit}", "a checkout"
