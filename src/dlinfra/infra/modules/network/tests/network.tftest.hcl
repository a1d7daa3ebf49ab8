mock_provider "aws" {
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }
}

variables {
  name        = "dlinfra-test-run"
  s3_endpoint = { bucket = "results-bucket" }
}

run "s3_endpoint_reaches_the_results_bucket_alone" {
  command = plan

  assert {
    condition = (
      length(jsondecode(aws_vpc_endpoint.s3[0].policy).Statement) == 1 &&
      toset(jsondecode(aws_vpc_endpoint.s3[0].policy).Statement[0].Resource) == toset([
        "arn:aws:s3:::results-bucket", "arn:aws:s3:::results-bucket/*",
      ]) &&
      !contains(jsondecode(aws_vpc_endpoint.s3[0].policy).Statement[0].Action, "s3:DeleteObject")
    )
    error_message = "the S3 endpoint must let through the results bucket and nothing else"
  }
}

run "s3_endpoint_lets_read_objects_through_for_get_only" {
  command = plan

  variables {
    s3_endpoint = { bucket = "results-bucket", read_objects = ["datasets/cifar-10-python.tar.gz"] }
  }

  assert {
    condition = (
      jsondecode(aws_vpc_endpoint.s3[0].policy).Statement[1].Action == "s3:GetObject" &&
      jsondecode(aws_vpc_endpoint.s3[0].policy).Statement[1].Resource == ["arn:aws:s3:::datasets/cifar-10-python.tar.gz"]
    )
    error_message = "a read object is reachable for GetObject only"
  }
}

run "s3_endpoint_lets_a_packed_data_prefix_through" {
  command = plan

  variables {
    s3_endpoint = { bucket = "results-bucket", read_objects = ["datasets/imagenet/*"] }
  }

  assert {
    condition     = jsondecode(aws_vpc_endpoint.s3[0].policy).Statement[1].Resource == ["arn:aws:s3:::datasets/imagenet/*"]
    error_message = "a packed data set's prefix is reachable for GetObject"
  }
}

run "rejects_a_wildcard_read_object" {
  command = plan

  variables {
    s3_endpoint = { bucket = "results-bucket", read_objects = ["datasets/*"] }
  }

  expect_failures = [var.s3_endpoint]
}

run "default_creates_private_subnet_behind_nat" {
  command = plan

  assert {
    condition     = length(aws_vpc.this) == 1 && aws_vpc.this[0].cidr_block == "10.42.0.0/16"
    error_message = "the default network must create one VPC with vpc_cidr"
  }
  assert {
    condition     = aws_subnet.cluster[0].cidr_block == "10.42.1.0/24" && aws_subnet.cluster[0].map_public_ip_on_launch == false
    error_message = "the cluster subnet must use subnet_cidr and never map public IPs"
  }
  assert {
    condition     = length(aws_nat_gateway.this) == 1 && length(aws_eip.nat) == 1 && length(aws_subnet.public) == 1
    error_message = "egress = nat needs a public subnet, an EIP and a NAT gateway"
  }
  assert {
    condition     = aws_subnet.public[0].cidr_block == "10.42.0.0/24"
    error_message = "the NAT subnet must use public_subnet_cidr"
  }
  assert {
    condition     = aws_route.cluster_internet[0].destination_cidr_block == "0.0.0.0/0" && aws_route.cluster_internet[0].gateway_id == null
    error_message = "the cluster route table must send internet traffic to the NAT, not to the internet gateway"
  }
  assert {
    condition     = aws_vpc_endpoint.s3[0].service_name == "com.amazonaws.us-east-1.s3" && aws_vpc_endpoint.s3[0].vpc_endpoint_type == "Gateway"
    error_message = "an S3 gateway endpoint must serve the cluster route table"
  }
  assert {
    condition     = output.associate_public_ip == false
    error_message = "nodes behind a NAT need no public IP"
  }
  assert {
    condition     = length(aws_default_security_group.this) == 1
    error_message = "the VPC's default security group must be adopted and emptied"
  }
}

run "security_group_opens_only_tf_ports_to_itself" {
  command = plan

  assert {
    condition = (
      aws_vpc_security_group_ingress_rule.tf_grpc.from_port == 2222 &&
      aws_vpc_security_group_ingress_rule.tf_grpc.to_port == 2223 &&
      aws_vpc_security_group_ingress_rule.tf_grpc.ip_protocol == "tcp" &&
      aws_vpc_security_group_ingress_rule.tf_grpc.cidr_ipv4 == null
    )
    error_message = "ingress must be TCP 2222-2223 with no CIDR source"
  }
  assert {
    condition     = aws_vpc_security_group_egress_rule.all[0].ip_protocol == "-1" && aws_vpc_security_group_egress_rule.all[0].cidr_ipv4 == "0.0.0.0/0"
    error_message = "egress must be open so nodes can install packages"
  }
}

run "ingress_references_the_group_itself" {
  command = apply

  assert {
    condition     = aws_vpc_security_group_ingress_rule.tf_grpc.referenced_security_group_id == aws_security_group.cluster.id
    error_message = "the gRPC rule must reference the cluster security group itself"
  }
  assert {
    condition     = output.security_group_id == aws_security_group.cluster.id && output.subnet_cidr == "10.42.1.0/24"
    error_message = "outputs must expose the security group and the subnet CIDR"
  }
}

run "custom_tf_ports" {
  command = plan

  variables {
    tf_ports = { from = 5000, to = 5010 }
  }

  assert {
    condition     = aws_vpc_security_group_ingress_rule.tf_grpc.from_port == 5000 && aws_vpc_security_group_ingress_rule.tf_grpc.to_port == 5010
    error_message = "tf_ports must set the ingress range"
  }
}

run "public_ip_egress_skips_the_nat" {
  command = plan

  variables {
    egress = "public_ip"
  }

  assert {
    condition     = length(aws_nat_gateway.this) == 0 && length(aws_eip.nat) == 0 && length(aws_subnet.public) == 0
    error_message = "egress = public_ip must not create a NAT gateway"
  }
  assert {
    condition     = length(aws_internet_gateway.this) == 1 && aws_route.cluster_internet[0].nat_gateway_id == null
    error_message = "egress = public_ip routes the cluster subnet to the internet gateway"
  }
  assert {
    condition     = output.associate_public_ip == true
    error_message = "egress = public_ip must ask for public IPs on instances"
  }
}

run "no_egress_keeps_only_the_s3_endpoint" {
  command = plan

  variables {
    egress = "none"
  }

  assert {
    condition     = length(aws_internet_gateway.this) == 0 && length(aws_nat_gateway.this) == 0 && length(aws_route.cluster_internet) == 0
    error_message = "egress = none must create no internet path"
  }
  assert {
    condition     = length(aws_vpc_endpoint.s3) == 1
    error_message = "egress = none still needs the S3 endpoint"
  }
}

run "existing_network_creates_only_the_security_group" {
  command = plan

  variables {
    existing_network = { vpc_id = "vpc-0abc", subnet_id = "subnet-0def" }
  }

  override_data {
    target = data.aws_subnet.existing[0]
    values = { vpc_id = "vpc-0abc", cidr_block = "172.31.16.0/20" }
  }

  assert {
    condition     = length(aws_vpc.this) == 0 && length(aws_subnet.cluster) == 0 && length(aws_vpc_endpoint.s3) == 0 && length(aws_internet_gateway.this) == 0
    error_message = "an existing network must not be duplicated"
  }
  assert {
    condition     = aws_security_group.cluster.vpc_id == "vpc-0abc"
    error_message = "the security group must live in the given VPC"
  }
  assert {
    condition     = output.subnet_id == "subnet-0def" && output.subnet_cidr == "172.31.16.0/20" && output.vpc_id == "vpc-0abc"
    error_message = "outputs must pass the existing network through, CIDR read from the subnet"
  }
}

run "existing_subnet_must_be_in_existing_vpc" {
  command = plan

  variables {
    existing_network = { vpc_id = "vpc-0abc", subnet_id = "subnet-0def" }
  }

  override_data {
    target = data.aws_subnet.existing[0]
    values = { vpc_id = "vpc-0other", cidr_block = "172.31.16.0/20" }
  }

  expect_failures = [data.aws_subnet.existing]
}

run "rejects_unknown_egress" {
  command = plan

  variables {
    egress = "vpn"
  }

  expect_failures = [var.egress]
}

run "rejects_malformed_cidr" {
  command = plan

  variables {
    subnet_cidr = "10.42.1.0"
  }

  expect_failures = [var.subnet_cidr]
}

run "rejects_subnet_outside_vpc" {
  command = plan

  variables {
    subnet_cidr = "10.99.1.0/24"
  }

  expect_failures = [aws_subnet.cluster]
}

run "rejects_public_subnet_overlapping_cluster_subnet" {
  command = plan

  variables {
    public_subnet_cidr = "10.42.1.0/25"
  }

  expect_failures = [aws_subnet.public]
}

run "rejects_half_an_existing_network" {
  command = plan

  variables {
    existing_network = { vpc_id = "vpc-0abc", subnet_id = "" }
  }

  expect_failures = [var.existing_network]
}

run "rejects_inverted_port_range" {
  command = plan

  variables {
    tf_ports = { from = 2223, to = 2222 }
  }

  expect_failures = [var.tf_ports]
}

run "egress_none_opens_nothing_to_the_internet" {
  command = plan

  variables {
    egress = "none"
  }

  assert {
    condition     = length(aws_vpc_security_group_egress_rule.all) == 0
    error_message = "egress = none must have no rule to 0.0.0.0/0"
  }
  assert {
    condition = (
      length(aws_vpc_security_group_egress_rule.peers) == 1 &&
      aws_vpc_security_group_egress_rule.s3[0].from_port == 443 &&
      aws_vpc_security_group_egress_rule.s3[0].to_port == 443
    )
    error_message = "egress = none still reaches peers on the TF ports and S3 over HTTPS"
  }
}

run "egress_nat_keeps_the_open_rule" {
  command = plan

  assert {
    condition     = length(aws_vpc_security_group_egress_rule.all) == 1 && length(aws_vpc_security_group_egress_rule.peers) == 0
    error_message = "egress = nat needs the open egress rule for package mirrors"
  }
}
