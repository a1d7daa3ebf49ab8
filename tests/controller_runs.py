"""What the controller's tests share: a results bucket of their own in moto, a run made the way
`deploy` makes one (its dir as a hand-over packs it), and a stand-in endpoint that only counts."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dlinfra.runs.run import Run
from dlinfra.spec.model import Spec
from support import FAKE_CREDS, aws_client


@pytest.fixture
def bucket(moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for key, value in FAKE_CREDS.items():
        monkeypatch.setenv(key, value)
    name = f"ctl-{tmp_path.name[-20:].lower().replace('_', '-')}".rstrip("-")
    aws_client(moto_endpoint, "s3").create_bucket(Bucket=name)
    return name


def make_run(home: Path, bucket: str, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("DLINFRA_HOME", str(home))
    spec = Spec.model_validate(
        {
            "name": "digits",
            "target": "aws",
            "storage": {"url": f"s3://{bucket}/runs"},
            "aws": {"endpoint_url": endpoint},
        }
    )
    run = Run.create(spec)
    (run.dir / "user-data").mkdir()
    (run.dir / "user-data" / "chief-0.yaml").write_text("#cloud-config\n")
    (run.dir / "tfvars.json").write_text("{}\n")
    stack = run.dir / "terraform" / "stack"
    (stack / ".terraform" / "providers").mkdir(parents=True)
    (stack / ".terraform" / "providers" / "aws").write_bytes(b"\0" * 1024)
    (stack / "main.tf").write_text("# the run's pinned HCL\n")
    (stack / "terraform.tfstate").write_text('{"local": "state"}\n')
    (run.dir / "logs").mkdir()
    (run.dir / "logs" / "chief-0.log").write_text("a log stays on the machine that ran it\n")
    return run


@contextmanager
def counting_endpoint() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on a free port that answers every request 500 and records it: an endpoint
    a planted record names, which nothing may ever contact."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
