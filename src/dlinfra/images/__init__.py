"""Node images: the environment a node runs in (a venv with this exact dlinfra wheel and its
TensorFlow build), baked once by one recipe instead of pip-installed at every boot.

    recipe      the provisioning script, rendered from package data; its digest names the image
    local.py    mmdebstrap + the recipe in a chroot → kernel, initrd, rootfs (qemu VMs)
    wheelhouse  the wheels a recipe or a node installs, served to VMs from the host's loopback
    targets/aws/images.py   the same recipe on a builder instance → an AMI

Every image carries /etc/dlinfra/image.json (an ImageRecord); a booting node compares it with the
wheel and the lock it was told to run, installs nothing when both match, and only the difference
when the lock differs (a run with its own `training.requirements` on an image of dlinfra's alone).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import jinja2
from pydantic import BaseModel, ConfigDict

from dlinfra import __version__
from dlinfra.environment.lock import Flavor, Lock
from dlinfra.runs.bundle import file_sha256
from dlinfra.runs.run import home

FLAVORS: tuple[Flavor, ...] = ("cpu", "gpu")
IMAGE_JSON_PATH = "/etc/dlinfra/image.json"
IMAGE_LOCK_PATH = "/etc/dlinfra/image.lock"  # the lock the image was baked from
VENV = "/opt/dlinfra"
# The controller image's terraform, and its providers in one of terraform's implied local mirror
# directories on Linux (a CLI config with a provider_installation block would turn those off).
TERRAFORM_DIR = "/usr/local/bin"
PLUGINS_DIR = "/usr/local/share/terraform/plugins"


def images_home() -> Path:
    """Built local images and wheelhouses: $DLINFRA_IMAGE_CACHE, else the dlinfra home's images/
    (an image is a few GB and is keyed by content: one cache serves every run that matches it)."""
    return Path(os.environ.get("DLINFRA_IMAGE_CACHE") or home() / "images").absolute()


def pip_options(index_url: str | None, extra_ca: bool) -> str:
    """pip's options for a private mirror (aws.pip_index_url) and an extra CA (aws.pip_extra_ca)."""
    options = []
    if index_url:
        options.append(f"--index-url {shlex.quote(index_url)}")
        if index_url.startswith("http://"):  # pip ignores a plain-HTTP index unless told to trust it
            options.append(f"--trusted-host {shlex.quote(urlsplit(index_url).netloc)}")
    if extra_ca:  # pip trusts certifi's bundle, not the system's: name the system's
        options.append("--cert /etc/ssl/certs/ca-certificates.crt")
    return " ".join(options)


def flavor_for(gpus: int) -> Flavor:
    """The image a node needs: the GPU build of TensorFlow only where it trains on GPUs."""
    return "gpu" if gpus else "cpu"


class ImageRecord(BaseModel):
    """/etc/dlinfra/image.json: what an image holds, written by the recipe at the end of a build."""

    model_config = ConfigDict(extra="forbid")

    dlinfra_version: str
    flavor: Flavor
    wheel: str
    wheel_sha256: str
    recipe_digest: str
    builder: Literal["local", "aws"]
    tensorflow: str | None = None  # "tensorflow-cpu 2.21.0", filled in by the recipe from the venv
    lock_sha256: str | None = None  # the environment lock it holds exactly (None: an older image)


@dataclass(frozen=True)
class Recipe:
    """An image of `flavor`: exactly `lock` (every package, hash-pinned), then `wheel` (dlinfra);
    the controller's also terraform and the run stacks' providers (`tools`: their digest)."""

    flavor: Flavor
    wheel: Path
    lock: Lock
    tools: str | None = None

    @property
    def wheel_sha256(self) -> str:
        return file_sha256(self.wheel)

    @property
    def digest(self) -> str:
        """What goes into the image, not where pip fetches it from: the recipe itself, the flavor, the
        lock and the wheel. Equal digests mean equal node environments, on any backend."""
        h = hashlib.sha256()
        parts = (_template_source(), self.flavor, self.lock.sha256, self.wheel_sha256, __version__)
        for part in (*parts, *([self.tools] if self.tools else [])):
            h.update(part.encode() + b"\0")
        return h.hexdigest()

    def record(self, builder: Literal["local", "aws"]) -> ImageRecord:
        return ImageRecord(
            dlinfra_version=__version__,
            flavor=self.flavor,
            wheel=self.wheel.name,
            wheel_sha256=self.wheel_sha256,
            recipe_digest=self.digest,
            builder=builder,
            lock_sha256=self.lock.sha256,
        )

    def render(
        self,
        wheel_path: str,
        lock_path: str,
        pip_options: str,
        builder: Literal["local", "aws"],
        tools_dir: str | None = None,
    ) -> str:
        """The script for one backend: `wheel_path` and `lock_path` are where the wheel and the lock
        sit in the build environment, `pip_options` where pip finds the locked files (a copied-in
        wheelhouse, a private index), `tools_dir` the staged terraform tools (images.terraform_tools)."""
        if (tools_dir is None) != (self.tools is None):
            raise ValueError("a recipe with tools renders with their staged dir, and only then")
        record_json = json.dumps(self.record(builder).model_dump(mode="json"), sort_keys=True)
        if "'" in record_json:
            raise ValueError("an image record may not contain a single quote")  # it sits in '...'
        return _template().render(
            flavor=self.flavor,
            venv=VENV,
            wheel_path=wheel_path,
            lock_path=lock_path,
            pip_options=pip_options,
            record_json=record_json,
            digest=self.digest[:16],
            tools_dir=tools_dir,
            binary_dir=TERRAFORM_DIR,
            plugins_dir=PLUGINS_DIR,
            image_lock_path=IMAGE_LOCK_PATH,
        )


_TEMPLATES = Path(__file__).parent / "templates"


@cache
def _template_source() -> str:
    return (_TEMPLATES / "recipe.sh.j2").read_text(encoding="utf-8")


@cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # shell, not HTML
    )
    return env.get_template("recipe.sh.j2")
