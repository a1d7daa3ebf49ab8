"""A stand-in for EC2's instance metadata service (IMDSv2) on loopback, for spot notices, which
cannot exist off EC2. One server stands in for every node's instance: each node asks on its own path
(`DLINFRA_METADATA_ENDPOINT=http://127.0.0.1:PORT/{node}`), and each token is one instance session,
so a node's replacement (a new beacon life, a new token) is a fresh instance without the notice."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

NOTICE_SECONDS = 120  # what EC2 gives


class MetadataStandIn:
    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}  # token → node
        self.latest: dict[str, str] = {}  # node → its current session's token
        self.issued: dict[str, float] = {}  # token → when it was asked for (wall clock)
        self.interrupted: dict[str, float] = {}  # token → the instance-action's time
        self.rebalanced: dict[str, float] = {}  # token → the recommendation's time
        self.requests: list[tuple[str, str, str]] = []  # (method, node, path) in order
        self.answered: list[tuple[str, str]] = []  # (node, path) answered with a notice
        # (wall clock, node, what): every token, every look at a notice, every notice given; a notice
        # never seen is explained from this (bench_chaos prints it)
        self.trace: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def node_template(self) -> str:
        return self.url + "/{node}"

    def __enter__(self) -> MetadataStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _session(self, node: str, timeout: float = 120, since: float = 0.0) -> str:
        """The node's newest session, once it has one begun at `since` or later."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                token = self.latest.get(node)
                if token is not None and self.issued[token] >= since:
                    return token
            time.sleep(0.1)
        raise AssertionError(f"{node} asked the metadata service for no token since {since}")

    def interrupt(self, node: str, since: float = 0.0, timeout: float = 120) -> float:
        """From now on, `node`'s current instance answers a terminate instance-action; returns when.
        `since`: the start of the node's current life. A node restarted a moment ago has a beacon that
        has not asked for its token yet, and the notice must not go to the life before, which is gone
        (seed 411 of bench_chaos: a notice given to a dead session was never seen)."""
        token = self._session(node, timeout, since)
        now = time.time()
        with self._lock:
            self.interrupted[token] = now + NOTICE_SECONDS
            self.trace.append((now, node, f"notice given to token …{token[-6:]} (life since {since:.3f})"))
        return now

    def story(self, node: str, around: float, seconds: float = 20.0) -> list[str]:
        """What `node` asked and was given within `seconds` of `around`, one line each."""
        near = [(t, what) for t, n, what in list(self.trace) if n == node and abs(t - around) <= seconds]
        clock = lambda t: f"{time.strftime('%H:%M:%S', time.localtime(t))}.{int(t % 1 * 1000):03d}"  # noqa: E731
        return [f"{clock(t)} {what}" for t, what in near]

    def recommend_rebalance(self, node: str) -> float:
        token = self._session(node)
        now = time.time()
        with self._lock:
            self.rebalanced[token] = now
        return now

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _answer(self, code: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                node, _, path = self.path.lstrip("/").partition("/")
                owner.requests.append(("PUT", node, path))
                if path != "latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._answer(400)
                token = f"token-{node}-{time.monotonic_ns()}"
                with owner._lock:
                    owner.tokens[token] = node
                    owner.latest[node] = token
                    owner.issued[token] = time.time()
                    owner.trace.append((owner.issued[token], node, f"token …{token[-6:]} issued"))
                self._answer(200, token)

            def do_GET(self) -> None:
                node, _, path = self.path.lstrip("/").partition("/")
                owner.requests.append(("GET", node, path))
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                if owner.tokens.get(token) != node:  # IMDSv2: no valid token, no answer
                    return self._answer(401)
                stamp = "%Y-%m-%dT%H:%M:%SZ"
                if path == "latest/meta-data/spot/instance-action":
                    told = "the notice" if token in owner.interrupted else "none"
                    owner.trace.append((time.time(), node, f"asked with token …{token[-6:]}: {told}"))
                if path == "latest/meta-data/spot/instance-action" and token in owner.interrupted:
                    owner.answered.append((node, path))
                    when = time.strftime(stamp, time.gmtime(owner.interrupted[token]))
                    return self._answer(200, json.dumps({"action": "terminate", "time": when}))
                if path == "latest/meta-data/events/recommendations/rebalance" and token in owner.rebalanced:
                    owner.answered.append((node, path))
                    when = time.strftime(stamp, time.gmtime(owner.rebalanced[token]))
                    return self._answer(200, json.dumps({"noticeTime": when}))
                self._answer(404)

        return Handler
