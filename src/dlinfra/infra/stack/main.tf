locals {
  name     = "dlinfra-${var.run_id}"
  tags     = merge(var.tags, { "dlinfra:run-id" = var.run_id })
  emulated = var.endpoint_url != null

  ami_id = var.ami_id != null ? var.ami_id : data.aws_ssm_parameter.ami[0].insecure_value

  existing_network = var.network.vpc_id == null ? null : {
    vpc_id    = var.network.vpc_id
    subnet_id = var.network.subnet_id
  }
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
    ssm = var.endpoint_url
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
# Machine image (the lookup is skipped entirely when ami_id is given)
################################################################################

data "aws_ssm_parameter" "ami" {
  count = var.ami_id == null ? 1 : 0

  name = var.ami_ssm_parameter
}

################################################################################
# Network
################################################################################

module "network" {
  source = "../modules/network"

  name               = local.name
  vpc_cidr           = var.network.vpc_cidr
  subnet_cidr        = var.network.subnet_cidr
  public_subnet_cidr = var.network.public_subnet_cidr
  egress             = var.network.egress
  availability_zone  = var.network.availability_zone
  existing_network   = local.existing_network
  tf_ports           = var.tf_ports
  s3_endpoint        = { bucket = var.bucket, read_objects = var.read_objects }
}

################################################################################
# Node identity (the bucket already exists; the role reaches only the run prefix)
################################################################################

module "node_iam" {
  source = "../modules/node_iam"

  name               = "${local.name}-node"
  bucket             = var.bucket
  prefix             = var.prefix
  bucket_kms_key_arn = var.bucket_kms_key_arn
  ssm_access         = var.ssm_access
  read_objects       = var.read_objects
}

################################################################################
# Instances: one group per role
################################################################################

module "role" {
  source   = "../modules/instance_group"
  for_each = var.roles

  name   = local.name
  run_id = var.run_id
  role   = each.key
  nodes  = each.value.nodes

  instance = {
    ami_id               = coalesce(each.value.ami_id, local.ami_id)
    instance_type        = each.value.instance_type
    iam_instance_profile = module.node_iam.instance_profile_name
    spot                 = each.value.spot
    placement_group      = each.value.placement_group
    root_volume_gb       = each.value.root_volume_gb
  }

  network = {
    subnet_id           = module.network.subnet_id
    subnet_cidr         = module.network.subnet_cidr
    security_group_ids  = [module.network.security_group_id]
    associate_public_ip = module.network.associate_public_ip
  }

  # Root volumes get no provider default_tags; pass the run's tags explicitly.
  tags = local.tags
}
