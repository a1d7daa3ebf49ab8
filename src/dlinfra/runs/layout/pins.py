"""A run's pinned code and inputs in its store: what a rerun months later must find byte for byte.

    code/bundle-<sha256>.tar.gz   the user's code; code/<wheel>: the dlinfra that cloud nodes install
    code/env-<flavor>.lock        the run's environment, locked with hashes (cpu or gpu build of TF)
    code/data-<sha256>.json       the data files a glob listed when the run was prepared (their pin)
    terraform/                    the provider lock file and tfvars of a cloud run
    run-dir.tar.gz                the run dir a controller acts from (a run handed over to it)

Pinned bytes are read back checked against the sha256 the manifest holds (a StoreError otherwise).
RunStore (runs.layout) has these keys through CodePins.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from dlinfra.errors import StoreError
from dlinfra.runs.store import Store

RUN_DIR = "run-dir.tar.gz"


class CodePins:
    """RunStore's code, environment, data-listing and Terraform pins."""

    store: Store

    def put_bundle(self, sha256: str, data: bytes) -> None:
        self.store.put_bytes(bundle_key(sha256), data)

    def bundle(self, sha256: str) -> bytes:
        return self._pinned(bundle_key(sha256), sha256)

    def put_wheel(self, path: Path) -> str:
        self.store.put_file(f"code/{path.name}", path)
        return self.wheel_uri(path.name)

    def wheel_uri(self, name: str) -> str:
        return self.store.uri(f"code/{name}")

    def wheel(self, name: str, sha256: str) -> bytes:
        return self._pinned(f"code/{name}", sha256)

    def put_lock(self, name: str, text: str) -> str:
        self.store.put_bytes(f"code/{name}", text.encode())
        return self.lock_uri(name)

    def lock_uri(self, name: str) -> str:
        return self.store.uri(f"code/{name}")

    def lock(self, name: str, sha256: str) -> str:
        return self._pinned(f"code/{name}", sha256).decode()

    def put_data_listing(self, sha256: str, data: bytes) -> None:
        self.store.put_bytes(data_listing_key(sha256), data)

    def data_listing(self, sha256: str) -> bytes:
        return self._pinned(data_listing_key(sha256), sha256)

    def put_run_dir(self, data: bytes) -> None:
        self.store.put_bytes(RUN_DIR, data)

    def run_dir(self) -> bytes | None:
        return self.store.get_bytes(RUN_DIR)

    def put_terraform_pins(self, lock_file: Path, tfvars_text: str) -> None:
        """A cloud run's provider lock and inputs: what a rerun months later must apply again."""
        self.store.put_file("terraform/.terraform.lock.hcl", lock_file)
        self.store.put_bytes("terraform/tfvars.json", tfvars_text.encode())

    def _pinned(self, key: str, sha256: str) -> bytes:
        """Bytes a manifest pinned (a code bundle, a wheel), checked against their sha256."""
        data = self.store.get_bytes(key)
        if data is None:
            raise StoreError(f"{self.store.uri(key)} is missing. Fix: rerun a run whose store still holds it")
        if hashlib.sha256(data).hexdigest() != sha256:
            raise StoreError(f"{self.store.uri(key)} does not match its pinned sha256 {sha256[:12]}…")
        return data


def data_listing_key(sha256: str) -> str:
    return f"code/data-{sha256}.json"


def bundle_key(sha256: str) -> str:
    """Also where the run dir keeps its copy: the run dir mirrors the store for the code."""
    return f"code/bundle-{sha256}.tar.gz"
