"""From a resolved spec to what each node needs: addresses, NodeConfig, cloud-init user-data."""

from dlinfra.render.addresses import AddressPlan, Node, loopback_plan, private_ip_plan
from dlinfra.render.cloud_init import (
    Install,
    check_fits,
    node_config_from_user_data,
    render_cluster,
    render_user_data,
)
from dlinfra.render.configs import build_node_configs

__all__ = [
    "AddressPlan",
    "Install",
    "Node",
    "build_node_configs",
    "check_fits",
    "loopback_plan",
    "node_config_from_user_data",
    "private_ip_plan",
    "render_cluster",
    "render_user_data",
]
