"""Cloud-init user-data: one file per node, the only thing a node is given to boot from."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jinja2
import yaml

from dlinfra import __version__
from dlinfra.contract import LOCK_PATH, NO_RESTART_EXIT_CODES, NODE_JSON_PATH, NodeConfig
from dlinfra.errors import SpecError
from dlinfra.images import IMAGE_JSON_PATH, IMAGE_LOCK_PATH, VENV, pip_options

WHEEL_DIR = "/opt/dlinfra-wheel"


@dataclass(frozen=True)
class Install:
    """What a cloud node installs when its image does not already hold it: its flavor's lock from
    `locks` (flavor → (s3 URI, sha256)), then `source`: the s3:// URI of this run's dlinfra wheel
    (`wheel_sha256` its digest), or a release pin (``dlinfra==0.1.0``, in the lock itself).
    `index_url`, `extra_index` and `extra_ca` (PEM text): the mirror the lock was resolved from."""

    source: str
    wheel_sha256: str | None = None
    index_url: str | None = None
    extra_ca: str | None = None
    locks: dict[str, tuple[str, str]] = field(default_factory=dict)
    extra_index: tuple[str, ...] = ()

    @property
    def want(self) -> str:
        """How a baked image's record must name it for the node to skip installing."""
        return f"sha256:{self.wheel_sha256}" if self.wheel_sha256 else self.source

    def uv_options(self) -> str:
        options = [f"--index-url {shlex.quote(self.index_url)}"] if self.index_url else []
        options += [f"--extra-index-url {shlex.quote(url)}" for url in self.extra_index]
        if self.extra_ca:  # update-ca-certificates added it to the system's roots
            options.append("--native-tls")
        return "".join(f"{option} " for option in options)


@cache
def _template(name: str = "user-data.yaml.j2") -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # YAML, not HTML
    )
    # Every value a shell reads is quoted by this filter, never pasted: validation upstream is the
    # first wall, the quoting the second.
    env.filters["sh"] = shlex.quote
    return env.get_template(name)


def render_controller_user_data(
    bucket: str, region: str, idle_minutes: float, endpoint_url: str | None = None
) -> str:
    """The account controller's user-data: a systemd unit that runs `dlinfra controller run` for
    `bucket` at every boot (the image carries dlinfra, terraform and the AWS provider)."""
    arguments = ["--bucket", bucket, "--region", region, "--idle-minutes", f"{idle_minutes:g}"]
    if endpoint_url:
        arguments += ["--endpoint-url", endpoint_url]
    return _template("controller-user-data.yaml.j2").render(
        version=__version__, bucket=bucket, venv=VENV, arguments=shlex.join(arguments)
    )


def render_user_data(config: NodeConfig, install: Install | None = None) -> str:
    """The user-data for one node; local nodes run where they are made and get no `install`. Each
    node installs its flavor's lock: the GPU or the CPU build of TensorFlow."""
    node_json = json.dumps(config.model_dump(mode="json"), indent=2, sort_keys=True)
    wheel = lock_uri = lock_sha256 = None
    pip_install_options = ""
    if install:
        if install.source.endswith(".whl"):
            wheel = install.source.rsplit("/", 1)[-1]
        if config.flavor not in install.locks:
            raise ValueError(f"no {config.flavor} lock for node {config.name}")
        lock_uri, lock_sha256 = install.locks[config.flavor]
        options = pip_options(install.index_url, install.extra_ca is not None)
        for url in install.extra_index:
            options += f" {pip_options(url, False).replace('--index-url', '--extra-index-url')}"
        if options := options.strip():
            pip_install_options = options + " "
    return _template().render(
        config=config,
        node_json=node_json,
        node_json_path=NODE_JSON_PATH,
        image_json_path=IMAGE_JSON_PATH,
        image_lock_path=IMAGE_LOCK_PATH,
        install=install.source if install else None,
        want=install.want if install else None,
        flavor=config.flavor,
        wheel=wheel,
        wheel_sha256=install.wheel_sha256 if install else None,
        wheel_dir=WHEEL_DIR,
        lock_uri=lock_uri,
        lock_sha256=lock_sha256,
        lock_path=LOCK_PATH,
        lock_dir=str(Path(LOCK_PATH).parent),
        pip_options=pip_install_options,
        uv_options=install.uv_options() if install else "",
        extra_ca=install.extra_ca.strip() if install and install.extra_ca else None,
        tensorflow_build=f"GPU (tensorflow[and-cuda]) for {config.gpus} GPU(s)"
        if config.gpus
        else "CPU (tensorflow-cpu)",
        venv=VENV,
        # the agent's own watchdog fires first; the OS one is the backstop a hung agent cannot skip
        shutdown_minutes=math.ceil(config.runs_for / 60) + 5,
        final_exit_codes=NO_RESTART_EXIT_CODES,
    )


def render_cluster(
    configs: dict[str, NodeConfig], install: Install | None = None, limit: int | None = None
) -> dict[str, str]:
    """`limit`: the most bytes of user-data the target's machines accept (EC2: 16 KB); a node over
    it is a spec error now, not a failed apply later."""
    rendered = {name: render_user_data(cfg, install) for name, cfg in configs.items()}
    if limit is not None:
        sizes = {name: len(text.encode()) for name, text in rendered.items()}
        if (biggest := max(sizes, key=sizes.__getitem__, default=None)) and sizes[biggest] > limit:
            raise SpecError([_oversized(biggest, sizes[biggest], limit, configs[biggest], install)])
    return rendered


def check_fits(configs: dict[str, NodeConfig], limit: int | None) -> None:
    """Before the environment is resolved (seconds, and the network): the node whose spec weighs
    most, rendered without the install lines, already over `limit` is over it with them too."""
    if limit is None or not configs:
        return
    name = max(configs, key=lambda n: len(configs[n].model_dump_json()))
    size = len(render_user_data(configs[name], None).encode())
    if size > limit:
        raise SpecError([_oversized(name, size, limit, configs[name], None, "at least ")])


# What each spec field that can swell a user-data should become instead.
SHRINK = {
    "training.model": "define a long model in code (training.entrypoint) instead of training.model",
    "training.command": "give the script its long settings in a file beside it (the code travels in the "
    "store, not in user-data), and name that file on the command",
    "training.requirements": "list only the packages the program imports (the lock adds theirs), or "
    "bake them into an image (`dlinfra image build`)",
    "aws.pip_extra_ca": "give only the CA certificate the mirror needs (one is about 2 KB)",
    "aws.pip_index_url": "use a shorter index URL",
}


def _oversized(
    name: str, size: int, limit: int, config: NodeConfig, install: Install | None, at_least: str = ""
) -> str:
    """Name the spec field that weighs most in a user-data over the limit: each of training's own
    fields, so a long command is not blamed on the model."""
    training = config.training.model_dump(mode="json")
    parts = {f"training.{key}": len(json.dumps(value)) for key, value in training.items()}
    parts["aws.pip_extra_ca"] = len(install.extra_ca or "") if install else 0
    parts["aws.pip_index_url"] = len(install.index_url or "") if install else 0
    field = max(parts, key=parts.__getitem__)
    fix = SHRINK.get(field, f"shorten {field}")
    return (
        f"{field}: the user-data of node {name} is {at_least}{size:,} bytes and the target accepts at most "
        f"{limit:,} (EC2's user-data limit); {field} takes {parts[field]:,} of them. Fix: {fix}"
    )


def node_config_from_user_data(user_data: str) -> NodeConfig:
    """Take node.json back out of a node's user-data, exactly as cloud-init would write it."""
    doc = yaml.safe_load(user_data)
    for item in doc.get("write_files", []):
        if item.get("path") == NODE_JSON_PATH:
            return NodeConfig.model_validate_json(item["content"])
    raise ValueError(f"user-data has no {NODE_JSON_PATH} in write_files")
