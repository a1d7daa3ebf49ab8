"""Cloud-init user-data: one file per node, the only thing a node is given to boot from."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import jinja2
import yaml

from dlinfra.node.config import FINAL_EXIT_CODES, NODE_JSON_PATH, NodeConfig

VENV = "/opt/dlinfra"
WHEEL_DIR = "/opt/dlinfra-wheel"


@cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # YAML, not HTML
    )
    return env.get_template("user-data.yaml.j2")


def node_extras(config: NodeConfig) -> str:
    """dlinfra's extras a node installs: the GPU build of TensorFlow only where it trains on GPUs
    (3 GB of CUDA wheels), the CPU build everywhere else."""
    return "train-gpu,aws" if config.gpus else "train,aws"


def render_user_data(config: NodeConfig, install: str | None = None) -> str:
    """The user-data for one node. `install` is what a cloud node installs: the s3:// URI of this
    run's dlinfra wheel, or a release pin (``dlinfra==0.1.0``), each with the extras this node needs;
    local nodes already have dlinfra and get none."""
    node_json = json.dumps(config.model_dump(mode="json"), indent=2, sort_keys=True)
    wheel = pip_target = None
    if install:
        extras = node_extras(config)
        if install.startswith("s3://"):
            wheel = install.rsplit("/", 1)[-1]
            pip_target = f"{WHEEL_DIR}/{wheel}[{extras}]"
        else:
            name, pin, version = install.partition("==")
            pip_target = f"{name}[{extras}]{pin}{version}"
    return _template().render(
        config=config,
        node_json=node_json,
        node_json_path=NODE_JSON_PATH,
        install=install,
        wheel=wheel,
        wheel_dir=WHEEL_DIR,
        pip_target=pip_target,
        tensorflow_build=f"GPU (tensorflow[and-cuda]) for {config.gpus} GPU(s)"
        if config.gpus
        else "CPU (tensorflow-cpu)",
        venv=VENV,
        # the agent's own watchdog fires first; the OS one is the backstop a hung agent cannot skip
        shutdown_minutes=math.ceil(config.max_runtime / 60) + 5,
        final_exit_codes=FINAL_EXIT_CODES,
    )


def render_cluster(configs: dict[str, NodeConfig], install: str | None = None) -> dict[str, str]:
    return {name: render_user_data(cfg, install) for name, cfg in configs.items()}


def node_config_from_user_data(user_data: str) -> NodeConfig:
    """Take node.json back out of a node's user-data, exactly as cloud-init would write it."""
    doc = yaml.safe_load(user_data)
    for item in doc.get("write_files", []):
        if item.get("path") == NODE_JSON_PATH:
            return NodeConfig.model_validate_json(item["content"])
    raise ValueError(f"user-data has no {NODE_JSON_PATH} in write_files")
