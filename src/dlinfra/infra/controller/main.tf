locals {
  name     = "dlinfra-controller"
  tags     = merge(var.tags, { "dlinfra:purpose" = "controller" })
  emulated = var.endpoint_url != null
}

################################################################################
# Provider: real AWS, or every service at endpoint_url (moto, LocalStack)
################################################################################

provider "aws" {
  region = var.region

  # Null endpoints leave the provider's defaults (real AWS) in place.
  endpoints {
    ec2 = var.endpoint_url
    iam = var.endpoint_url
    s3  = var.endpoint_url
    sts = var.endpoint_url
  }

  skip_credentials_validation = local.emulated
  skip_requesting_account_id  = local.emulated
  skip_metadata_api_check     = local.emulated
  s3_use_path_style           = local.emulated

  default_tags {
    tags = local.tags
  }
}

################################################################################
# Identity: it may run the run stacks and nothing else (modules/controller_iam)
################################################################################

module "iam" {
  source = "../modules/controller_iam"

  name   = local.name
  bucket = var.bucket # the run stacks' state too (its dlinfra/ prefix): the VPC's S3 endpoint reaches no other bucket
}

################################################################################
# Network: its own small VPC, out through an internet gateway (no NAT gateway to pay for while it
# is stopped), S3 through the free gateway endpoint, and no inbound rule at all
################################################################################

module "network" {
  source = "../modules/network"

  name        = local.name
  vpc_cidr    = var.network.vpc_cidr
  subnet_cidr = var.network.subnet_cidr
  egress      = "public_ip"
  s3_endpoint = { bucket = var.bucket, read_objects = [] }
}

################################################################################
# The instance: stopped by itself when idle (a stopped instance costs its disk), started again by a
# deploy that hands a run over; its systemd unit starts the controller at every boot
################################################################################

resource "aws_instance" "this" {
  #checkov:skip=CKV_AWS_135:Current (Nitro) instance types are EBS-optimized by default; forcing the flag breaks older types.
  #checkov:skip=CKV_AWS_126:The controller logs to the bucket; 1-minute CloudWatch metrics would add cost with no consumer.
  #checkov:skip=CKV_AWS_88:A public IP for egress to the AWS APIs (no NAT gateway billed while it is stopped); its security group has no inbound rule.

  ami                    = var.ami_id
  instance_type          = var.instance_type
  iam_instance_profile   = module.iam.instance_profile_name
  subnet_id              = module.network.subnet_id
  vpc_security_group_ids = [module.network.security_group_id]
  key_name               = var.ssh_key_name

  associate_public_ip_address = true

  user_data                   = var.user_data
  user_data_replace_on_change = true

  # Idle, it stops itself and keeps its disk: the next hand-over starts it in seconds.
  instance_initiated_shutdown_behavior = "stop"

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  root_block_device {
    volume_type           = "gp3"
    volume_size           = 16
    encrypted             = true
    delete_on_termination = true
  }

  tags        = { Name = local.name, "dlinfra:role" = "controller" }
  volume_tags = merge(local.tags, { Name = local.name, "dlinfra:role" = "controller" })
}
