"""What the benchmarks that drive the aws target share: a moto server on a free loopback port, and a
terraform CLI config that installs the AWS provider from the local mirror (offline)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

MIRROR = Path(os.environ.get("DLINFRA_TF_PROVIDER_MIRROR", "/opt/tf-plugins"))


def start_moto() -> tuple[Any, str]:
    """The running server (stop it when done) and its endpoint URL."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request would bury the figures
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def terraform_rc(work: Path) -> Path:
    """A CLI config (TF_CLI_CONFIG_FILE) caching plugins in `work`, from the mirror when present."""
    rc = work / "terraform.tfrc"
    lines = [f'plugin_cache_dir = "{work}"']
    if MIRROR.is_dir():
        lines += ["provider_installation {", f'  filesystem_mirror {{ path = "{MIRROR}" }}', "}"]
    rc.write_text("\n".join(lines) + "\n")
    return rc
