"""The Python ↔ HCL contract: the only Python that knows the stacks' variable, output and resource
names. Everything else in the aws target speaks in nodes, roles and instance ids."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from dlinfra.contract import PREFLIGHT_PORT_OFFSET
from dlinfra.runs.store import parse_s3_url
from dlinfra.spec.dataset import is_listing

if TYPE_CHECKING:
    from dlinfra.prepare import Prepared
    from dlinfra.runs.manifest import ImagePin
    from dlinfra.spec.model import Spec

RUN_TAG = "dlinfra:run-id"  # on every resource of a run's stack: what its teardown looks for afterwards


def stack_tfvars(prepared: Prepared, images: dict[str, ImagePin | None] | None = None) -> dict[str, Any]:
    """The run stack's inputs (infra/stack/variables.tf): one instance group per role, one user-data
    and fixed private IP per node; `images` the roles that boot a baked AMI."""
    spec, run_id = prepared.spec, prepared.run.id
    bucket, prefix = parse_s3_url(prepared.run.manifest().store.url)
    shapes = spec.roles()
    roles: dict[str, Any] = {}
    for node in prepared.plan:
        group = roles.setdefault(
            node.role,
            {
                "instance_type": shapes[node.role].instance_type,
                "spot": shapes[node.role].spot,
                # gradient traffic flows between workers and ps: keep them on one low-latency spine
                # (emulators have no placement groups: moto lacks CreatePlacementGroup)
                "placement_group": node.role in ("worker", "ps") and not spec.aws.endpoint_url,
                "root_volume_gb": spec.aws.root_volume_gb,
                "ami_id": pin.id if (pin := (images or {}).get(node.role)) else None,
                "nodes": {},
            },
        )
        group["nodes"][node.name] = {"private_ip": node.host, "user_data": prepared.user_data[node.name]}
    return {
        "run_id": run_id,
        "region": spec.aws.region,
        "endpoint_url": spec.aws.endpoint_url,
        "ami_id": spec.aws.ami,
        # unset: the stack's default parameter (a null would override it)
        **({"ami_ssm_parameter": spec.aws.ami_ssm_parameter} if spec.aws.ami_ssm_parameter else {}),
        "network": spec.aws.network(),
        # + the tf.data dispatcher and the preflight link sinks
        "tf_ports": {"from": spec.cluster.port, "to": spec.cluster.port + PREFLIGHT_PORT_OFFSET},
        "bucket": bucket,
        "prefix": prefix,
        "roles": roles,
        "ssm_access": spec.aws.ssm_access,
        "read_objects": read_objects(spec),
        "tags": {**spec.aws.tags, RUN_TAG: run_id, "dlinfra:experiment": spec.name},
    }


def read_objects(spec: Spec) -> list[str]:
    """S3 objects outside the run prefix the nodes read ("bucket/key"): an s3:// data set; a packed
    one is every object under its prefix (the manifest and the shards it names: no listing), and your
    own files every object in the directories their globs match in (the run's listing names them)."""
    ds = spec.training.dataset
    uris = [uri for uri in (ds.uri, ds.eval_uri) if uri and uri.startswith("s3://")]
    if not ds.staged:
        return [f"{bucket}/{key}" for bucket, key in map(parse_s3_url, uris)]
    prefixes = [uri.rpartition("/")[0] if is_listing(uri) else uri for uri in uris]
    return sorted({f"{bucket}/{key}/*" for bucket, key in map(parse_s3_url, prefixes)})


def state_backend(spec: Spec, run_id: str) -> dict[str, Any] | None:
    """backend.tf.json of a run stack whose state lives in the spec's state bucket (one key per run)."""
    if not spec.aws.state_bucket:
        return None
    backend: dict[str, Any] = {
        "bucket": spec.aws.state_bucket,
        "key": f"dlinfra/{run_id}/terraform.tfstate",
        "region": spec.aws.region,
        "use_lockfile": True,
        "encrypt": True,  # the state holds every node's user-data
    }
    if spec.aws.endpoint_url:
        backend |= {
            "endpoints": {"s3": spec.aws.endpoint_url},
            "use_path_style": True,
            "skip_credentials_validation": True,
            "skip_requesting_account_id": True,
        }
    return {"terraform": {"backend": {"s3": backend}}}


def bucket_tfvars(bucket: str, region: str, endpoint_url: str | None) -> dict[str, Any]:
    """The results-bucket stack's inputs (infra/bucket/variables.tf)."""
    return {
        "bucket": bucket,
        "region": region,
        "endpoint_url": endpoint_url,
        "tags": {"dlinfra:purpose": "results"},
    }


def planned_ami(plan_json: dict[str, Any]) -> str | None:
    """The base AMI a plan resolved (the stack's `ami_id` output: aws.ami, or the SSM parameter's
    value read while planning); None when the plan could not know it."""
    output = plan_json.get("planned_values", {}).get("outputs", {}).get("ami_id", {})
    value = output.get("value")
    return value if isinstance(value, str) else None


def instances(outputs: dict[str, Any]) -> dict[str, dict[str, str]]:
    """node → {"id", "private_ip"}, from the run stack's outputs."""
    return {name: {"id": i["id"], "private_ip": i["private_ip"]} for name, i in outputs["instances"].items()}


def instance_address(node: str) -> str:
    """The Terraform address of a node's instance in the run stack (module per role, one per node)."""
    role = node.rsplit("-", 1)[0]
    return f'module.role["{role}"].aws_instance.this["{node}"]'


def on_demand(variables: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """The run stack's inputs with `nodes` on demand while the rest of their roles stay as they were:
    what a replacement applies when spot capacity is not there (cluster.workers.spot.fallback)."""
    out = copy.deepcopy(variables)
    for node in nodes:
        out["roles"][node.rsplit("-", 1)[0]]["nodes"][node]["spot"] = False
    return out


def on_demand_nodes(variables: dict[str, Any]) -> list[str]:
    """Nodes of spot roles that `on_demand` moved to on-demand capacity."""
    return sorted(
        name
        for group in variables["roles"].values()
        if group["spot"]
        for name, node in group["nodes"].items()
        if node.get("spot") is False
    )
