"""From a resolved spec to what each node needs: addresses, NodeConfig, cloud-init user-data."""

from dlinfra.render.addresses import AddressPlan, Node, plan_addresses
from dlinfra.render.cloud_init import node_config_from_user_data, render_cluster, render_user_data
from dlinfra.render.node_config import NodeConfig, StoreConfig, build_node_configs, tf_config

__all__ = [
    "AddressPlan",
    "Node",
    "NodeConfig",
    "StoreConfig",
    "build_node_configs",
    "node_config_from_user_data",
    "plan_addresses",
    "render_cluster",
    "render_user_data",
    "tf_config",
]
