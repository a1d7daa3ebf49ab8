"""Spot notices, seen by the beacon (never the trainer: a trainer blocked in TensorFlow cannot be
trusted to poll) and turned into a checkpoint, a clean exit and a replacement.

    noticed node's beacon   polls IMDSv2 (token first) for spot/instance-action and the rebalance
                            recommendation; on a notice it writes a Notice to the store, waits for a
                            checkpoint newer than the notice (bounded by EC2's deadline), stops its
                            trainer and exits EXIT_INTERRUPTED with status `interrupted`
    chief's beacon          lists the store's notices and, for a new one, drops a flag file in the
                            chief's work dir
    chief's trainer         checks that file (a stat) at each progress report and checkpoints now

In script mode nobody is asked: the script saves its own checkpoints, so the noticed node stops it at
once (SIGTERM to its group) and sends its checkpoint directory as it exits.

The store carries the notice because the chief is on another machine; the flag file keeps the
trainer's check free of network calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from dlinfra.contract import EXIT_INTERRUPTED, NodeConfig
from dlinfra.errors import StoreError
from dlinfra.runs.layout import RunStore
from dlinfra.runs.records import Notice

IMDS = "http://169.254.169.254"
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"  # the SDKs' override, honoured the same way
# An emulator hosting many nodes on one machine (tests, --emulate-instances) answers each node on its
# own path: this override may hold `{node}`, filled with the node's name. It wins over ENDPOINT_ENV.
NODE_ENDPOINT_ENV = "DLINFRA_METADATA_ENDPOINT"
INSTANCE_ACTION = "latest/meta-data/spot/instance-action"
REBALANCE = "latest/meta-data/events/recommendations/rebalance"
POLL_SECONDS = 2.0  # EC2 suggests every 5 s; the notice gives 120 s and a checkpoint needs some of them
TOKEN_TTL = 21600  # one token per beacon life: a new life (a replacement) is a new session
LEAVE_MARGIN = 15.0  # leave this long before EC2's deadline, checkpoint or not: the stop must land first
ACTED_REBALANCE_WAIT = 90.0  # a rebalance acted on has no deadline: how long a checkpoint may take
CHECKPOINT_FLAG = "checkpoint-now"


def metadata_endpoint(node: str, env: Mapping[str, str] = os.environ) -> str:
    if template := env.get(NODE_ENDPOINT_ENV):
        return template.replace("{node}", node).rstrip("/")
    return (env.get(ENDPOINT_ENV) or IMDS).rstrip("/")


def _utc(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


class Metadata:
    """An IMDSv2 client: a session token first (PUT), then GETs carrying it. 404: nothing announced."""

    def __init__(self, endpoint: str, timeout: float = 1.0):
        self.endpoint, self.timeout = endpoint, timeout
        self._token: str | None = None

    def _call(self, request: urllib.request.Request) -> str:
        with urllib.request.urlopen(request, timeout=self.timeout) as answer:
            return str(answer.read().decode())

    def token(self) -> str:
        if self._token is None:
            self._token = self._call(
                urllib.request.Request(
                    f"{self.endpoint}/latest/api/token",
                    method="PUT",
                    headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)},
                )
            )
        return self._token

    def get(self, path: str) -> str | None:
        for _ in range(2):  # an expired token (401) is renewed once
            request = urllib.request.Request(
                f"{self.endpoint}/{path}", headers={"X-aws-ec2-metadata-token": self.token()}
            )
            try:
                return self._call(request)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code != 401:
                    raise
                self._token = None
        return None

    def instance_action(self) -> tuple[str, float] | None:
        """(action, when) of a spot interruption notice."""
        if (text := self.get(INSTANCE_ACTION)) is None:
            return None
        found = json.loads(text)
        return str(found["action"]), _utc(found["time"])

    def rebalance(self) -> float | None:
        if (text := self.get(REBALANCE)) is None:
            return None
        return _utc(json.loads(text)["noticeTime"])


def holds_state(cfg: NodeConfig) -> bool:
    """Whether the run must resume from a checkpoint when this node leaves (a ps worker's steps are
    the ps's, and the coordinator reruns what it had in flight)."""
    return cfg.is_chief or cfg.role == "ps" or cfg.strategy == "multi_worker_mirrored"


class SpotWatch:
    """The noticed side: a daemon thread of the beacon of a spot node."""

    def __init__(self, cfg: NodeConfig, store: RunStore, stop_trainer: Callable[[], None]):
        self.cfg, self.store, self.stop_trainer = cfg, store, stop_trainer
        self.metadata = Metadata(metadata_endpoint(cfg.name))
        self.notice: Notice | None = None  # the one acted on
        self.rebalance: Notice | None = None
        self.leaving = threading.Event()  # the trainer is being stopped for the notice
        self._unreachable = False
        self._seen: dict[str, float] = {}  # kind → when first seen: a notice the store missed is retold

    def start(self) -> SpotWatch:
        threading.Thread(target=self._loop, name="spot-watch", daemon=True).start()
        return self

    @property
    def text(self) -> str | None:
        """What `dlinfra status` shows of it."""
        if self.notice is not None:
            when = f" at {time.strftime('%H:%M:%SZ', time.gmtime(self.notice.deadline))}"
            return f"spot {self.notice.action or self.notice.kind}" + (when if self.notice.deadline else "")
        return "rebalance recommended" if self.rebalance is not None else None

    def _loop(self) -> None:
        while self.notice is None:
            try:
                self.check()
            except StoreError as exc:  # the notice is seen and not yet told: the next poll tells it
                self._say(f"the store is out ({exc}): telling the notice again in {POLL_SECONDS:g} s")
            except Exception as exc:  # no metadata here, or it answered nonsense: keep the node going
                if not self._unreachable:
                    self._say(f"no instance metadata at {self.metadata.endpoint} ({exc}); retrying")
                self._unreachable = True
            time.sleep(POLL_SECONDS)

    def check(self) -> None:
        if (action := self.metadata.instance_action()) is not None:
            kind, deadline = action
            self._leave(
                Notice(
                    node=self.cfg.name,
                    kind="interruption",
                    noticed=self._seen.setdefault("interruption", time.time()),
                    action=kind,
                    deadline=deadline,
                    acted=True,
                )
            )
            return
        if self.rebalance is None and (when := self.metadata.rebalance()) is not None:
            acts = self.cfg.act_on_rebalance
            if "rebalance" not in self._seen:
                self._say(
                    "EC2 recommends rebalancing off this instance "
                    f"(notice {time.strftime('%H:%M:%SZ', time.gmtime(when))}); "
                    + ("leaving (cluster.spot.act_on_rebalance)" if acts else "logged only")
                )
            noticed = self._seen.setdefault("rebalance", time.time())
            rebalance = Notice(node=self.cfg.name, kind="rebalance", noticed=noticed, acted=acts)
            if acts:
                self._leave(rebalance)
            else:
                self.store.put_notice(rebalance)
            self.rebalance = rebalance

    def _leave(self, notice: Notice) -> None:
        """Told to the store first (a StoreError leaves it untold: the next poll tells it again), then
        a checkpoint newer than it awaited, then the trainer stopped."""
        chief = self.store.status(self.cfg.chief_name)
        notice.step_at_notice = chief.step if chief else None
        self.store.put_notice(notice)
        self.notice = notice
        if self.cfg.training.command:  # a script saves its own checkpoints: nobody to ask for one
            self._say(
                f"spot notice ({notice.action or notice.kind}): stopping the script now (SIGTERM, its "
                "checkpoint directory sent as it exits)"
            )
            self.leaving.set()
            self.stop_trainer()
            return
        self._say(f"spot notice ({notice.action or notice.kind}): asking the chief for a checkpoint now")
        deadline = (
            (notice.deadline - LEAVE_MARGIN) if notice.deadline else notice.noticed + ACTED_REBALANCE_WAIT
        )
        waited = checkpoint_since(self.store, notice.noticed, deadline)
        if waited == "ended":
            self._say("the run ended before this node had to leave")
            return
        if waited == "stored":
            self._say("a checkpoint newer than the notice is stored: leaving")
        else:
            self._say("no checkpoint newer than the notice before the deadline: leaving anyway")
        self.leaving.set()
        self.stop_trainer()

    def finish(self) -> int:
        """The trainer is gone: record how the node left, and the code that tells its supervisor."""
        assert self.notice is not None
        notice, now = self.notice, time.time()
        pointer, chief = None, None
        with contextlib.suppress(StoreError):  # the store is out: the exit code still tells
            pointer = self.store.latest_checkpoint()
            chief = self.store.status(self.cfg.chief_name)
        notice.left, notice.exit_code = now, EXIT_INTERRUPTED
        notice.checkpoint_step = pointer.step if pointer else None
        notice.checkpoint_time = pointer.time if pointer else None
        notice.step_at_left = chief.step if chief else None
        if self.cfg.training.command:
            notice.steps_lost = None  # what the script's own checkpoints hold is the script's to know
        else:
            held = notice.checkpoint_step or 0
            notice.steps_lost = max(0, (notice.step_at_left or 0) - held) if holds_state(self.cfg) else 0
        with contextlib.suppress(Exception):  # the store may be out; the exit code still tells
            self.store.put_notice(notice)
        self._say(f"interrupted: exiting with {EXIT_INTERRUPTED} after {now - notice.noticed:.1f}s of notice")
        return EXIT_INTERRUPTED

    def _say(self, text: str) -> None:
        print(f"beacon {self.cfg.name}: {text}", file=sys.stderr, flush=True)


class NoticeRelay:
    """The chief's side: a daemon thread of the chief's beacon that turns a new notice in the store
    into the flag file its trainer checks."""

    def __init__(self, store: RunStore, work: Path):
        self.store, self.flag = store, work / CHECKPOINT_FLAG
        self.seen: set[str] = set()

    def start(self) -> NoticeRelay:
        threading.Thread(target=self._loop, name="notice-relay", daemon=True).start()
        return self

    def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a store outage: the next poll retries
                self.relay()
            time.sleep(POLL_SECONDS)

    def relay(self) -> bool:
        """Flag a checkpoint for any notice acted on that this chief has not flagged and whose node
        has not left yet (a chief restarted mid-notice flags it again)."""
        wanted = False
        for key in self.store.notice_keys():
            if key in self.seen:
                continue
            notice = self.store.notice(key)
            if notice is None:
                continue
            self.seen.add(key)
            wanted |= notice.acted and notice.left is None
        if wanted:
            self.flag.write_text(str(time.time()), encoding="utf-8")
        return wanted


def checkpoint_since(store: RunStore, since: float, deadline: float) -> Literal["ended", "stored", "late"]:
    """Wait for the checkpoint asked for at `since` (node.spot's flag): `stored` once one newer is,
    `ended` if the run ends first, `late` at `deadline`."""
    while time.time() < deadline:
        with contextlib.suppress(StoreError):  # the store out a while: the deadline still holds
            if store.marker() is not None:
                return "ended"
            pointer = store.latest_checkpoint()
            if pointer is not None and (pointer.time or 0) >= since:
                return "stored"
        time.sleep(0.5)
    return "late"


def checkpoint_requested(work: Path) -> bool:
    """The trainer's check, at each progress report: one stat when nothing is asked."""
    try:
        work.joinpath(CHECKPOINT_FLAG).unlink()
    except FileNotFoundError:
        return False
    return True


def recorded(store: RunStore) -> dict[str, Any]:
    """The metrics' account of the run's spot notices."""
    notices = store.notices()
    return {
        "interruptions": [n for n in notices if n.acted],
        "rebalances": sum(1 for n in notices if n.kind == "rebalance"),
    }
