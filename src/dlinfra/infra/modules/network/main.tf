locals {
  create_vpc = var.existing_network == null
  nat        = local.create_vpc && var.egress == "nat"
  public_ip  = local.create_vpc && var.egress == "public_ip"
  igw        = local.nat || local.public_ip
  closed     = local.create_vpc && var.egress == "none" # no security group rule to the internet

  vpc_id      = local.create_vpc ? aws_vpc.this[0].id : var.existing_network.vpc_id
  subnet_id   = local.create_vpc ? aws_subnet.cluster[0].id : var.existing_network.subnet_id
  subnet_cidr = local.create_vpc ? var.subnet_cidr : data.aws_subnet.existing[0].cidr_block

  # CIDR arithmetic (Terraform has no cidrcontains): inner lies in outer when inner is at
  # least as long and inner's address, masked to outer's length, is outer's network address.
  vpc_len         = tonumber(split("/", var.vpc_cidr)[1])
  subnet_len      = tonumber(split("/", var.subnet_cidr)[1])
  public_len      = tonumber(split("/", var.public_subnet_cidr)[1])
  subnet_in_vpc   = local.subnet_len >= local.vpc_len && cidrhost("${split("/", var.subnet_cidr)[0]}/${local.vpc_len}", 0) == cidrhost(var.vpc_cidr, 0)
  public_in_vpc   = local.public_len >= local.vpc_len && cidrhost("${split("/", var.public_subnet_cidr)[0]}/${local.vpc_len}", 0) == cidrhost(var.vpc_cidr, 0)
  subnets_overlap = cidrhost("${split("/", var.subnet_cidr)[0]}/${min(local.subnet_len, local.public_len)}", 0) == cidrhost("${split("/", var.public_subnet_cidr)[0]}/${min(local.subnet_len, local.public_len)}", 0)
}

data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  # Through the endpoint, the cluster reaches its own results bucket and the objects it reads, and
  # no other S3 (a compromised node cannot ship data to a bucket of its choosing that way).
  s3_arn = "arn:${data.aws_partition.current.partition}:s3:::"
  s3_endpoint_policy = jsonencode({
    Version = "2012-10-17"
    Statement = concat(
      [{
        Sid       = "ResultsBucket"
        Effect    = "Allow"
        Principal = "*"
        Action = [
          "s3:GetObject", "s3:PutObject", "s3:PutObjectTagging", "s3:AbortMultipartUpload", "s3:ListBucket",
        ]
        Resource = ["${local.s3_arn}${var.s3_endpoint.bucket}", "${local.s3_arn}${var.s3_endpoint.bucket}/*"]
      }],
      length(var.s3_endpoint.read_objects) == 0 ? [] : [{
        Sid       = "ReadObjects"
        Effect    = "Allow"
        Principal = "*"
        Action    = "s3:GetObject"
        Resource  = [for object in var.s3_endpoint.read_objects : "${local.s3_arn}${object}"]
      }],
    )
  })
}

################################################################################
# VPC
################################################################################

resource "aws_vpc" "this" {
  #checkov:skip=CKV2_AWS_11:Transient per-run VPC whose only inbound path is intra-cluster gRPC; flow logs would need a log destination outliving the run. Pass existing_network to run in a VPC with flow logs.
  count = local.create_vpc ? 1 : 0

  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = merge(var.tags, { Name = var.name })
}

# Adopt the VPC's default security group and strip its rules: nothing may use it by accident.
resource "aws_default_security_group" "this" {
  count = local.create_vpc ? 1 : 0

  vpc_id = aws_vpc.this[0].id

  tags = merge(var.tags, { Name = "${var.name}-default-deny-all" })
}

################################################################################
# Cluster subnet
################################################################################

resource "aws_subnet" "cluster" {
  count = local.create_vpc ? 1 : 0

  vpc_id                  = aws_vpc.this[0].id
  cidr_block              = var.subnet_cidr
  availability_zone       = var.availability_zone
  map_public_ip_on_launch = false

  tags = merge(var.tags, { Name = "${var.name}-cluster" })

  lifecycle {
    precondition {
      condition     = local.subnet_in_vpc
      error_message = "subnet_cidr ${var.subnet_cidr} is not inside vpc_cidr ${var.vpc_cidr}: pick a subnet of the VPC range, e.g. cidrsubnet(vpc_cidr, 8, 1)."
    }
  }
}

resource "aws_route_table" "cluster" {
  count = local.create_vpc ? 1 : 0

  vpc_id = aws_vpc.this[0].id

  tags = merge(var.tags, { Name = "${var.name}-cluster" })
}

resource "aws_route_table_association" "cluster" {
  count = local.create_vpc ? 1 : 0

  subnet_id      = aws_subnet.cluster[0].id
  route_table_id = aws_route_table.cluster[0].id
}

################################################################################
# Internet egress (egress = "nat" or "public_ip")
################################################################################

resource "aws_internet_gateway" "this" {
  count = local.igw ? 1 : 0

  vpc_id = aws_vpc.this[0].id

  tags = merge(var.tags, { Name = var.name })
}

resource "aws_subnet" "public" {
  count = local.nat ? 1 : 0

  vpc_id                  = aws_vpc.this[0].id
  cidr_block              = var.public_subnet_cidr
  availability_zone       = aws_subnet.cluster[0].availability_zone
  map_public_ip_on_launch = false

  tags = merge(var.tags, { Name = "${var.name}-public" })

  lifecycle {
    precondition {
      condition     = local.public_in_vpc && !local.subnets_overlap
      error_message = "public_subnet_cidr ${var.public_subnet_cidr} must lie inside vpc_cidr ${var.vpc_cidr} and not overlap subnet_cidr ${var.subnet_cidr}."
    }
  }
}

resource "aws_route_table" "public" {
  count = local.nat ? 1 : 0

  vpc_id = aws_vpc.this[0].id

  tags = merge(var.tags, { Name = "${var.name}-public" })
}

resource "aws_route" "public_internet" {
  count = local.nat ? 1 : 0

  route_table_id         = aws_route_table.public[0].id
  destination_cidr_block = "0.0.0.0/0"
  gateway_id             = aws_internet_gateway.this[0].id
}

resource "aws_route_table_association" "public" {
  count = local.nat ? 1 : 0

  subnet_id      = aws_subnet.public[0].id
  route_table_id = aws_route_table.public[0].id
}

resource "aws_eip" "nat" {
  #checkov:skip=CKV2_AWS_19:The EIP belongs to the NAT gateway, not to an instance.
  count = local.nat ? 1 : 0

  domain = "vpc"

  tags = merge(var.tags, { Name = "${var.name}-nat" })

  depends_on = [aws_internet_gateway.this]
}

resource "aws_nat_gateway" "this" {
  count = local.nat ? 1 : 0

  allocation_id = aws_eip.nat[0].id
  subnet_id     = aws_subnet.public[0].id

  tags = merge(var.tags, { Name = var.name })

  depends_on = [aws_internet_gateway.this]
}

resource "aws_route" "cluster_internet" {
  count = local.igw ? 1 : 0

  route_table_id         = aws_route_table.cluster[0].id
  destination_cidr_block = "0.0.0.0/0"
  nat_gateway_id         = local.nat ? aws_nat_gateway.this[0].id : null
  gateway_id             = local.public_ip ? aws_internet_gateway.this[0].id : null
}

################################################################################
# S3 gateway endpoint (checkpoints and results never cross the NAT)
################################################################################

resource "aws_vpc_endpoint" "s3" {
  count = local.create_vpc ? 1 : 0

  vpc_id            = aws_vpc.this[0].id
  service_name      = "com.amazonaws.${data.aws_region.current.name}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.cluster[0].id]
  policy            = local.s3_endpoint_policy

  tags = merge(var.tags, { Name = "${var.name}-s3" })
}

################################################################################
# Existing network
################################################################################

data "aws_subnet" "existing" {
  count = local.create_vpc ? 0 : 1

  id = var.existing_network.subnet_id

  lifecycle {
    postcondition {
      condition     = self.vpc_id == var.existing_network.vpc_id
      error_message = "existing_network.subnet_id ${var.existing_network.subnet_id} is in ${self.vpc_id}, not in existing_network.vpc_id ${var.existing_network.vpc_id}."
    }
  }
}

################################################################################
# Security group: TensorFlow gRPC between cluster members only, no SSH
################################################################################

resource "aws_security_group" "cluster" {
  #checkov:skip=CKV2_AWS_5:Attached by the caller: its output security_group_id goes to the instance_group module's instances.
  name        = "${var.name}-cluster"
  description = "dlinfra cluster nodes: TensorFlow gRPC only between members of this group"
  vpc_id      = local.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-cluster" })
}

resource "aws_vpc_security_group_ingress_rule" "tf_grpc" {
  security_group_id            = aws_security_group.cluster.id
  description                  = "TensorFlow gRPC from cluster members"
  referenced_security_group_id = aws_security_group.cluster.id
  ip_protocol                  = "tcp"
  from_port                    = var.tf_ports.from
  to_port                      = var.tf_ports.to

  tags = merge(var.tags, { Name = "${var.name}-tf-grpc" })
}

# egress = none in a VPC of our own: no rule to the internet at all, only peers and the S3
# endpoint. Otherwise nodes reach package mirrors and data sets on hosts no list can name.
resource "aws_vpc_security_group_egress_rule" "all" {
  #checkov:skip=CKV_AWS_382:Only with egress nat or public_ip (or an existing network): nodes install packages (apt, pip) and fetch user data sets from arbitrary hosts; egress none has no such rule; inbound stays closed.
  count = local.closed ? 0 : 1

  security_group_id = aws_security_group.cluster.id
  description       = "Package installs, S3 and peers"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"

  tags = merge(var.tags, { Name = "${var.name}-egress" })
}

resource "aws_vpc_security_group_egress_rule" "peers" {
  count = local.closed ? 1 : 0

  security_group_id            = aws_security_group.cluster.id
  description                  = "TensorFlow gRPC to cluster members"
  referenced_security_group_id = aws_security_group.cluster.id
  ip_protocol                  = "tcp"
  from_port                    = var.tf_ports.from
  to_port                      = var.tf_ports.to

  tags = merge(var.tags, { Name = "${var.name}-egress-peers" })
}

resource "aws_vpc_security_group_egress_rule" "s3" {
  count = local.closed ? 1 : 0

  security_group_id = aws_security_group.cluster.id
  description       = "HTTPS to S3 through the gateway endpoint"
  prefix_list_id    = aws_vpc_endpoint.s3[0].prefix_list_id
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443

  tags = merge(var.tags, { Name = "${var.name}-egress-s3" })
}
