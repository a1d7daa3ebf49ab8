mock_provider "aws" {
  mock_data "aws_partition" {
    defaults = { partition = "aws", dns_suffix = "amazonaws.com" }
  }
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
}

variables {
  run_id = "digits-20261122-073000-ab12"
  region = "us-east-1"
  ami_id = "ami-0123456789abcdef0"
  bucket = "dlinfra-results-test"
  prefix = "runs/digits-20261122-073000-ab12"
  roles = {
    chief = {
      instance_type = "m5.xlarge"
      nodes         = { "chief-0" = { private_ip = "10.42.1.10", user_data = "#cloud-config\n# chief-0\n" } }
    }
    worker = {
      instance_type   = "g4dn.xlarge"
      spot            = true
      placement_group = true
      nodes = {
        "worker-0" = { private_ip = "10.42.1.20", user_data = "#cloud-config\n# worker-0\n" }
        "worker-1" = { private_ip = "10.42.1.21", user_data = "#cloud-config\n# worker-1\n" }
      }
    }
    ps = {
      instance_type = "m5.xlarge"
      nodes         = { "ps-0" = { private_ip = "10.42.1.30", user_data = "#cloud-config\n# ps-0\n" } }
    }
  }
  tags = { team = "ml" }
}

run "explicit_ami_skips_the_ssm_lookup" {
  command = apply

  assert {
    condition     = length(data.aws_ssm_parameter.ami) == 0
    error_message = "the SSM parameter must not be read when ami_id is set"
  }
  assert {
    condition     = output.ami_id == "ami-0123456789abcdef0"
    error_message = "ami_id must be used as given"
  }
}

run "ssm_parameter_resolves_the_ami_when_no_id_is_given" {
  command = apply

  variables {
    ami_id = null
  }

  override_data {
    target = data.aws_ssm_parameter.ami[0]
    values = { insecure_value = "ami-0fromssm0000000000" }
  }

  assert {
    condition     = data.aws_ssm_parameter.ami[0].name == "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
    error_message = "the default AMI is the Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04)"
  }
  assert {
    condition     = output.ami_id == "ami-0fromssm0000000000"
    error_message = "the AMI must come from the SSM parameter"
  }
}

run "instances_output_lists_every_node_with_its_role_and_no_user_data" {
  command = apply

  assert {
    condition     = toset(keys(output.instances)) == toset(["chief-0", "worker-0", "worker-1", "ps-0"])
    error_message = "every node of every role must be in the output"
  }
  assert {
    condition = (
      output.instances["ps-0"].role == "ps" && output.instances["ps-0"].private_ip == "10.42.1.30" &&
      output.instances["worker-1"].role == "worker" && output.instances["worker-1"].private_ip == "10.42.1.21"
    )
    error_message = "each node carries its role and planned IP"
  }
  assert {
    condition     = alltrue([for v in values(output.instances) : toset(keys(v)) == toset(["id", "private_ip", "role"])])
    error_message = "instances output must carry id, private_ip and role only"
  }
  assert {
    condition     = !strcontains(jsonencode(output.instances), "cloud-config")
    error_message = "no output may carry user data"
  }
  assert {
    condition     = output.bucket == "dlinfra-results-test" && output.prefix == "runs/digits-20261122-073000-ab12" && output.instance_profile == "dlinfra-digits-20261122-073000-ab12-node"
    error_message = "store and identity outputs"
  }
}

run "composes_network_and_identity_for_the_run" {
  command = plan

  assert {
    condition     = module.network.subnet_cidr == "10.42.1.0/24"
    error_message = "the cluster subnet defaults to 10.42.1.0/24"
  }
  assert {
    condition     = length(module.role) == 3 && module.role["worker"].placement_group == "dlinfra-digits-20261122-073000-ab12-worker" && module.role["chief"].placement_group == null
    error_message = "one instance group per role, placement group only where asked"
  }
}

run "roles_may_be_absent" {
  command = apply

  variables {
    roles = {
      worker = {
        instance_type = "g4dn.xlarge"
        nodes = {
          "worker-0" = { private_ip = "10.42.1.20", user_data = "" }
          "worker-1" = { private_ip = "10.42.1.21", user_data = "" }
        }
      }
    }
  }

  assert {
    condition     = toset(keys(output.instances)) == toset(["worker-0", "worker-1"])
    error_message = "a workers-only cluster (MultiWorkerMirroredStrategy) must plan"
  }
}

run "existing_network_is_used_as_given" {
  command = apply

  variables {
    network = { vpc_id = "vpc-0abc", subnet_id = "subnet-0def" }
  }

  override_data {
    target = module.network.data.aws_subnet.existing[0]
    values = { vpc_id = "vpc-0abc", cidr_block = "10.42.1.0/24" }
  }

  assert {
    condition     = output.vpc_id == "vpc-0abc" && output.subnet_id == "subnet-0def"
    error_message = "an existing VPC and subnet must be used, not created"
  }
}

run "public_ip_egress_reaches_the_instances" {
  command = plan

  variables {
    network = { egress = "public_ip" }
  }

  assert {
    condition     = module.network.associate_public_ip == true
    error_message = "egress = public_ip must ask the instance groups for public IPs"
  }
}

run "rejects_duplicate_private_ips_across_roles" {
  command = plan

  variables {
    roles = {
      chief  = { instance_type = "m5.xlarge", nodes = { "chief-0" = { private_ip = "10.42.1.10", user_data = "" } } }
      worker = { instance_type = "m5.xlarge", nodes = { "worker-0" = { private_ip = "10.42.1.10", user_data = "" } } }
    }
  }

  expect_failures = [var.roles]
}

# A private IP outside the subnet fails the instance_group precondition inside module.role,
# which `expect_failures` cannot name from here: modules/instance_group/tests covers it, and
# tests/infra/test_hcl_static.py checks the message of a real `terraform plan` of this stack.

run "rejects_two_chiefs" {
  command = plan

  variables {
    roles = {
      chief = { instance_type = "m5.xlarge", nodes = {
        "chief-0" = { private_ip = "10.42.1.10", user_data = "" }
        "chief-1" = { private_ip = "10.42.1.11", user_data = "" }
      } }
    }
  }

  expect_failures = [var.roles]
}

run "rejects_unknown_role" {
  command = plan

  variables {
    roles = {
      master = { instance_type = "m5.xlarge", nodes = { "master-0" = { private_ip = "10.42.1.10", user_data = "" } } }
    }
  }

  expect_failures = [var.roles]
}

run "rejects_node_named_for_another_role" {
  command = plan

  variables {
    roles = {
      worker = { instance_type = "m5.xlarge", nodes = { "ps-0" = { private_ip = "10.42.1.10", user_data = "" } } }
    }
  }

  expect_failures = [var.roles]
}

run "rejects_role_without_nodes" {
  command = plan

  variables {
    roles = {
      worker = { instance_type = "m5.xlarge", nodes = {} }
    }
  }

  expect_failures = [var.roles]
}

run "rejects_empty_instance_type" {
  command = plan

  variables {
    roles = {
      worker = { instance_type = "", nodes = { "worker-0" = { private_ip = "10.42.1.10", user_data = "" } } }
    }
  }

  expect_failures = [var.roles]
}

run "rejects_user_data_over_16_kib" {
  command = plan

  variables {
    roles = {
      worker = { instance_type = "m5.xlarge", nodes = { "worker-0" = { private_ip = "10.42.1.10", user_data = format("%16385s", "") } } }
    }
  }

  expect_failures = [var.roles]
}

run "rejects_unknown_egress" {
  command = plan

  variables {
    network = { egress = "proxy" }
  }

  expect_failures = [var.network]
}

run "rejects_vpc_without_subnet" {
  command = plan

  variables {
    network = { vpc_id = "vpc-0abc" }
  }

  expect_failures = [var.network]
}

run "rejects_malformed_region" {
  command = plan

  variables {
    region = "US East"
  }

  expect_failures = [var.region]
}

run "rejects_run_id_with_uppercase" {
  command = plan

  variables {
    run_id = "Digits_Run"
  }

  expect_failures = [var.run_id]
}

run "rejects_prefix_with_leading_slash" {
  command = plan

  variables {
    prefix = "/runs/x"
  }

  expect_failures = [var.prefix]
}
