"""What a node's environment holds, and how its log is masked before the store gets it.

A node that is a process on the deploying machine (the local target, emulated instances) starts from
an allow-list, not from the shell that ran `dlinfra deploy`: that shell holds whatever its user holds
(AWS keys, a GitHub token, Terraform's TF_VAR_ secrets), and a script that prints its environment
would write them into its log, the run directory and the store. An instance gets none of them; a
local node gets what it needs to run and reach what the run reaches, plus the names the spec passes
(`training.pass_env`), and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from dlinfra.contract import NodeConfig

# What a node process needs of the shell: to find programs and its home (Keras' and TensorFlow's
# caches), to speak its locale and time, to load CUDA and see only the GPUs it is given, and to reach
# the network the deploying machine reaches (a proxy, an internal CA), as the store and https data
# need. A proxy URL with a password is masked in the store's copy of the log (errors.mask).
ALLOWED = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
    }
)
# dlinfra's own settings (DLINFRA_HOME, DLINFRA_CACHE, DLINFRA_METADATA_ENDPOINT, ...) and the locale's
ALLOWED_PREFIXES = ("DLINFRA_", "LC_")
AWS_PREFIX = "AWS_"
SCRATCH = "tmp"  # under the node's work dir: TMPDIR, so TensorFlow's autograph files go with the run


def reaches_s3(cfg: NodeConfig) -> bool:
    """Whether the node itself reads or writes S3 (its store, its data), as an instance does through
    its role: then, and only then, a local node gets the deploying shell's AWS settings."""
    urls = [cfg.store.url, cfg.data.url if cfg.data else None, cfg.training.dataset.uri]
    urls.append(cfg.training.dataset.eval_uri)
    return any(url and url.startswith("s3://") for url in urls)


def node_environ(shell: Mapping[str, str], cfg: NodeConfig, work: Path) -> dict[str, str]:
    """A local node's whole environment, from the deploying shell's: the allow-list, the AWS settings
    when the node reaches S3, the names the spec passes, and TMPDIR in the node's work dir (made here:
    Python falls back to /tmp when TMPDIR names no directory)."""
    passed = set(cfg.training.pass_env)
    aws = reaches_s3(cfg)
    env = {
        name: value
        for name, value in shell.items()
        if name in ALLOWED
        or name in passed
        or name.startswith(ALLOWED_PREFIXES)
        or (aws and name.startswith(AWS_PREFIX))
    }
    if not aws:
        env |= _no_aws_files(passed)
    scratch = work / SCRATCH
    scratch.mkdir(parents=True, exist_ok=True)
    return env | {"TMPDIR": str(scratch)}


def without_aws(environ: Mapping[str, str], passed: Iterable[str]) -> dict[str, str]:
    """A user's script's environment: the node's without its AWS settings (a local node's store
    credentials are its agent's, for the store) unless the spec passes them by name. On an instance
    there are none to drop: its script reaches S3 through the instance's role, as its agent does."""
    names = set(passed)
    kept = {k: v for k, v in environ.items() if not k.startswith(AWS_PREFIX) or k in names}
    return kept | _no_aws_files(names)


def _no_aws_files(passed: set[str]) -> dict[str, str]:
    """Nor the user's ~/.aws files, which HOME would lead the SDKs to, unless the spec passes AWS
    settings (a profile's name needs its files)."""
    if any(name.startswith(AWS_PREFIX) for name in passed):
        return {}
    return {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
