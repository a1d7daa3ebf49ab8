"""What EC2 still holds with a run's tag once its stack is destroyed: resources Terraform never knew
of. A create EC2 cannot make idempotent (AllocateAddress takes no client token) that the provider
sent again after an answer that never reached it leaves a second resource outside the state, and
`terraform destroy` cannot see it. The bill of a transient cluster must stop with the run, so the
teardown looks by the run's tag, removes what it safely can, and names the rest."""

from __future__ import annotations

from typing import Any

from dlinfra.targets.aws.tfvars import RUN_TAG

GONE = {"shutting-down", "terminated", "deleting", "deleted", "failed"}


def sweep(ec2: Any, run_id: str) -> list[str]:
    """One sentence per kind of resource found: removed, or left with the reason and the fix.
    Only the teardown's own EC2 actions are used (its role allows them already)."""
    tagged = [{"Name": f"tag:{RUN_TAG}", "Values": [run_id]}]

    def ours(resource: dict[str, Any]) -> bool:
        # the filter asks, each resource's own tags decide: an endpoint that ignores a filter (moto's
        # NAT gateways do) must not make this remove another run's resources
        return {"Key": RUN_TAG, "Value": run_id} in resource.get("Tags", [])

    said = []
    instances = [
        i["InstanceId"]
        for r in ec2.describe_instances(Filters=tagged)["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] not in GONE and ours(i)
    ]
    if instances:
        ec2.terminate_instances(InstanceIds=instances)
        said.append(f"terminated instances {', '.join(instances)}")
    gateways = [
        n["NatGatewayId"]
        for n in ec2.describe_nat_gateways(Filters=tagged)["NatGateways"]
        if n["State"] not in GONE and ours(n)
    ]
    for gateway in gateways:
        ec2.delete_nat_gateway(NatGatewayId=gateway)
    if gateways:
        said.append(f"deleted NAT gateways {', '.join(gateways)}")
    addresses = [a for a in ec2.describe_addresses(Filters=tagged)["Addresses"] if ours(a)]
    free = [a["AllocationId"] for a in addresses if not a.get("AssociationId")]
    for allocation in free:
        ec2.release_address(AllocationId=allocation)
    if free:
        said.append(f"released Elastic IPs {', '.join(free)}")
    held = [a["AllocationId"] for a in addresses if a.get("AssociationId")]
    if held:  # a NAT gateway deleting or an instance terminating lets go of it in a minute or two
        said.append(
            f"Elastic IPs {', '.join(held)} are still associated: run `dlinfra destroy {run_id}` again in "
            "a few minutes to release them"
        )
    vpcs = [v["VpcId"] for v in ec2.describe_vpcs(Filters=tagged)["Vpcs"] if ours(v)]
    if vpcs:
        said.append(
            f"VPCs {', '.join(vpcs)} remain (their subnets and gateways with them): run "
            f"`dlinfra destroy {run_id}` again; if they stay, delete them in the EC2 console"
        )
    return said
