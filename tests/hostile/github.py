"""Classes 10 and 11 of issue 55: what `dlinfra init --github` writes into a repository's workflows."""

from __future__ import annotations

from pathlib import Path

from dlinfra import __version__
from hostile import Case

TOKEN = "ghp_0123456789abcdefABCDEF0123456789abcd"


def _token_in_install(work: Path) -> list[str]:
    url = f"git+https://x-access-token:{TOKEN}@github.com/octo/dlinfra@{'a' * 40}"
    return ["init", "--github", "--install", f"dlinfra[aws,emulator] @ {url}"]


def _no_pin(work: Path) -> list[str]:
    return ["init", "--github"]


CASES = [
    # committed in the workflow file, the token would be every reader's
    Case("github-install-token", _token_in_install, expected=("--install", "credential"), absent=(TOKEN,)),
    # a dlinfra with no commit or wheel to pin (GIT_DIR: the checkout's git is out of reach) gets no
    # guessed `==VERSION` that no index serves: refused, with the choices named
    Case(
        "github-default-install-unpinned",
        _no_pin,
        expected=("--install", "git+https://github.com/ORG/dlinfra@COMMIT", "#sha256="),
        absent=(f"=={__version__}",),
        env={"GIT_DIR": "/nonexistent/dlinfra-test-git"},
    ),
]
