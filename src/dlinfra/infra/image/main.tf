locals {
  name     = "dlinfra-image-${substr(var.image.digest, 0, 16)}"
  tags     = merge(var.tags, { "dlinfra:image-digest" = var.image.digest })
  emulated = var.endpoint_url != null

  base_ami_id = var.base_ami_id != null ? var.base_ami_id : data.aws_ssm_parameter.ami[0].insecure_value

  existing_network = var.network.vpc_id == null ? null : {
    vpc_id    = var.network.vpc_id
    subnet_id = var.network.subnet_id
  }

  # What a node or `dlinfra image list` reads back from the AMI (find_baked filters on them).
  ami_tags = {
    Name                   = var.image.name
    "dlinfra:version"      = var.image.version
    "dlinfra:flavor"       = var.image.flavor
    "dlinfra:wheel-sha256" = var.image.wheel_sha256
    "dlinfra:lock-sha256"  = var.image.lock_sha256
    "dlinfra:base-ami"     = local.base_ami_id
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
# Base image (the lookup is skipped entirely when base_ami_id is given)
################################################################################

data "aws_ssm_parameter" "ami" {
  count = var.base_ami_id == null ? 1 : 0

  name = var.ami_ssm_parameter
}

################################################################################
# Network: the builder pip-installs, so it needs egress; nothing may reach it
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
  s3_endpoint        = { bucket = var.bucket }
}

################################################################################
# Builder identity: reads the wheel and writes the completion marker under prefix only
################################################################################

module "builder_iam" {
  source = "../modules/node_iam"

  name       = "${local.name}-builder"
  bucket     = var.bucket
  prefix     = var.prefix
  ssm_access = var.ssm_access
}

################################################################################
# Builder: one instance that runs the recipe from its user data
################################################################################

resource "aws_instance" "builder" {
  #checkov:skip=CKV_AWS_135:Current (Nitro) instance types are EBS-optimized by default; forcing the flag breaks older types.
  #checkov:skip=CKV_AWS_126:A builder lives for one recipe run and reports to the bucket; 1-minute CloudWatch metrics would have no consumer.

  ami                    = local.base_ami_id
  instance_type          = var.instance_type
  iam_instance_profile   = module.builder_iam.instance_profile_name
  monitoring             = false
  subnet_id              = module.network.subnet_id
  vpc_security_group_ids = [module.network.security_group_id]

  associate_public_ip_address = module.network.associate_public_ip

  user_data                   = var.user_data
  user_data_replace_on_change = true

  # The user data's watchdog powers an orphaned builder off (its CLI died): that ends the bill.
  instance_initiated_shutdown_behavior = "terminate"

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  root_block_device {
    volume_type           = "gp3"
    volume_size           = var.root_volume_gb
    encrypted             = true
    delete_on_termination = true
  }

  tags = { Name = "${local.name}-builder" }
  # Root volumes get no provider default_tags.
  volume_tags = merge(local.tags, { Name = "${local.name}-builder" })

  lifecycle {
    # The builder is imaged exactly as it ran the recipe: the create_ami apply must never replace
    # it. Emulators read this back differently (moto: true), which would force a replacement.
    ignore_changes = [associate_public_ip_address]
  }
}

################################################################################
# The image (an artifact: the caller removes it from this state before destroying the builder)
################################################################################

resource "aws_ami_from_instance" "this" {
  count = var.create_ami ? 1 : 0

  name               = var.image.name
  description        = "dlinfra ${var.image.version} node image (${var.image.flavor}), recipe ${substr(var.image.digest, 0, 12)}"
  source_instance_id = aws_instance.builder.id

  tags = local.ami_tags
}
