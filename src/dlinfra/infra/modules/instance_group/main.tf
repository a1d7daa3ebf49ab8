locals {
  node_tags = {
    for node in keys(var.nodes) : node => merge(var.tags, {
      Name             = "${var.name}-${node}"
      "dlinfra:run-id" = var.run_id
      "dlinfra:role"   = var.role
      "dlinfra:index"  = regex("[0-9]+$", node)
    })
  }

  # An address is usable when masking it to the subnet's length gives the subnet, and it is
  # none of the five addresses AWS reserves (network, router, DNS, future, broadcast).
  subnet_len = var.network.subnet_cidr == null ? null : split("/", var.network.subnet_cidr)[1]
  reserved   = var.network.subnet_cidr == null ? [] : [for i in [0, 1, 2, 3, -1] : cidrhost(var.network.subnet_cidr, i)]
  ip_usable = {
    for node, spec in var.nodes : node => var.network.subnet_cidr == null ? true : (
      cidrhost("${spec.private_ip}/${local.subnet_len}", 0) == cidrhost(var.network.subnet_cidr, 0) &&
      !contains(local.reserved, spec.private_ip)
    )
  }
}

################################################################################
# Placement group (optional: low-latency networking between the role's nodes)
################################################################################

resource "aws_placement_group" "this" {
  count = var.instance.placement_group ? 1 : 0

  name     = "${var.name}-${var.role}"
  strategy = "cluster"

  tags = merge(var.tags, { Name = "${var.name}-${var.role}", "dlinfra:run-id" = var.run_id, "dlinfra:role" = var.role })
}

################################################################################
# Instances (one per node, keyed by node name)
################################################################################

resource "aws_instance" "this" {
  for_each = var.nodes

  #checkov:skip=CKV_AWS_135:Current (Nitro) instance types are EBS-optimized by default; forcing the flag breaks older types.
  #checkov:skip=CKV_AWS_126:Transient nodes report progress through the store; 1-minute CloudWatch metrics would add cost with no consumer. Opt in with instance.detailed_monitoring.

  ami                    = var.instance.ami_id
  instance_type          = var.instance.instance_type
  iam_instance_profile   = var.instance.iam_instance_profile
  monitoring             = var.instance.detailed_monitoring
  placement_group        = one(aws_placement_group.this[*].name)
  subnet_id              = var.network.subnet_id
  vpc_security_group_ids = var.network.security_group_ids
  private_ip             = each.value.private_ip

  associate_public_ip_address = var.network.associate_public_ip

  user_data                   = each.value.user_data
  user_data_replace_on_change = true

  # The node agent powers off when training ends or max runtime is hit: that ends the bill.
  instance_initiated_shutdown_behavior = "terminate"

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  root_block_device {
    volume_type           = "gp3"
    volume_size           = var.instance.root_volume_gb
    encrypted             = true
    kms_key_id            = var.instance.root_volume_kms_key
    delete_on_termination = true
  }

  dynamic "instance_market_options" {
    for_each = coalesce(each.value.spot, var.instance.spot) ? { spot = "one-time" } : {}

    content {
      market_type = "spot"

      spot_options {
        spot_instance_type             = instance_market_options.value
        instance_interruption_behavior = "terminate"
      }
    }
  }

  tags        = local.node_tags[each.key]
  volume_tags = local.node_tags[each.key]

  lifecycle {
    precondition {
      condition     = local.ip_usable[each.key]
      error_message = "${each.key}: private_ip ${each.value.private_ip} is not a usable address of subnet ${coalesce(var.network.subnet_cidr, "?")}: use cidrhost(subnet_cidr, n) with n >= 4, below the broadcast address."
    }
  }
}
