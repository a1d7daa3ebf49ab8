"""A node's log as others read it: masked with the masking every input echo goes through, before the
store (and so `dlinfra logs`, a FAILED marker, the controller) gets a line of it.

The node's processes (its agent, TensorFlow's C++ logs, a user's script) write the log file directly;
the beacon keeps a masked copy of it, a complete line at a time, and uploads that copy instead."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from dlinfra.errors import mask

# Names whose values are secrets whatever their shape (a GitHub token, a proxy password): masked by value.
SECRET_NAME = re.compile(r"(?i)secret|token|passw|credential|api_?key|access_?key|private_?key|session")
SHORTEST_SECRET = 8  # a value this short ("1", "true") would mask ordinary words of the log
CHUNK = 1 << 22  # read at most this much of a log a beat: a huge log is masked over a few beats


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values of the variables named like secrets, longest first (a key inside a token is not
    masked half)."""
    found = {v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= SHORTEST_SECRET}
    return sorted(found, key=len, reverse=True)


def masker(environ: Mapping[str, str] = os.environ) -> Callable[[str], str]:
    """errors.mask (the shapes of keys, tokens, URL passwords, password= parameters), and this node's
    own secrets by value, whatever their shape."""
    values = secret_values(environ)

    def masked(text: str) -> str:
        for value in values:
            text = text.replace(value, "***")
        return mask(text)

    return masked


class MaskedLog:
    """The masked copy of a log file that only grows (a node's lives append to it). Only complete
    lines are copied until `final`: half a line may hold half a secret, which no mask recognizes."""

    def __init__(self, source: Path, copy: Path, mask_text: Callable[[str], str] | None = None):
        self.source, self.copy = source, copy
        self.mask = mask_text or masker()
        self._read = 0  # bytes of the source already masked into the copy
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(b"")

    def update(self, final: bool = False) -> bool:
        """Mask what the source gained since the last call into the copy; whether the copy grew."""
        grew = False
        with open(self.source, "rb") as src, open(self.copy, "ab") as out:
            src.seek(self._read)
            while chunk := src.read(CHUNK):
                end = len(chunk) if final else chunk.rfind(b"\n") + 1
                if end == 0:  # no complete line yet (or one longer than a chunk: copied whole at the end)
                    break
                text = chunk[:end].decode("utf-8", errors="replace")
                out.write(self.mask(text).encode("utf-8"))
                self._read += end
                grew = True
        return grew
