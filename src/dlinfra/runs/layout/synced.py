"""Script mode's synced directories in the run's store (`checkpoints/files/`, `tensorboard/`): a
node's local directory mirrored file by file under a prefix (node.directory_sync keeps the mirror)."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, ClassVar

from dlinfra.runs.store import Store


class SyncedDirs:
    """RunStore's synced-directory keys: `<prefix>/<rel>`, `rel` a file's path under the directory."""

    store: Store
    tagged: ClassVar[dict[str, dict[str, str]]] = {}  # object tags by prefix (S3 lifecycle rules match them)

    def put_synced(self, prefix: str, rel: str, fh: BinaryIO) -> None:
        self.store.put_opened(f"{prefix}/{rel}", fh, tags=self.tagged.get(prefix))

    def synced(self, prefix: str) -> list[str]:
        """The files under `prefix`, relative to it."""
        return [key[len(prefix) + 1 :] for key in self.store.list_keys(prefix + "/")]

    def get_synced(self, prefix: str, rel: str, path: Path) -> bool:
        return self.store.get_file(f"{prefix}/{rel}", path)

    def delete_synced(self, prefix: str, rel: str) -> None:
        """Remove one synced file (what the directory no longer holds); one not there is no error."""
        self.store.delete(f"{prefix}/{rel}")

    def synced_uri(self, prefix: str) -> str:
        return self.store.uri(prefix)
