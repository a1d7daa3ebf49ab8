mock_provider "aws" {}

variables {
  name   = "dlinfra-test-run"
  run_id = "test-run"
  role   = "worker"
  nodes = {
    "worker-0" = { private_ip = "10.42.1.20", user_data = "#cloud-config\nruncmd:\n  - [echo, worker-0]\n" }
    "worker-1" = { private_ip = "10.42.1.21", user_data = "#cloud-config\nruncmd:\n  - [echo, worker-1]\n" }
  }
  instance = {
    ami_id               = "ami-0123456789abcdef0"
    instance_type        = "g4dn.xlarge"
    iam_instance_profile = "dlinfra-test-run-node"
  }
  network = {
    subnet_id          = "subnet-0abc"
    security_group_ids = ["sg-0abc"]
    subnet_cidr        = "10.42.1.0/24"
  }
}

run "one_instance_per_node_at_its_fixed_ip" {
  command = plan

  assert {
    condition     = length(aws_instance.this) == 2
    error_message = "one instance per node"
  }
  assert {
    condition     = aws_instance.this["worker-0"].private_ip == "10.42.1.20" && aws_instance.this["worker-1"].private_ip == "10.42.1.21"
    error_message = "each node must get its planned private IP"
  }
  assert {
    condition     = aws_instance.this["worker-1"].user_data_replace_on_change == true && aws_instance.this["worker-1"].iam_instance_profile == "dlinfra-test-run-node"
    error_message = "user data changes must replace the node; nodes use the instance profile"
  }
  assert {
    condition     = aws_instance.this["worker-0"].instance_initiated_shutdown_behavior == "terminate"
    error_message = "a node powering itself off must terminate"
  }
  assert {
    condition     = aws_instance.this["worker-0"].associate_public_ip_address == false
    error_message = "no public IP unless asked for"
  }
}

run "secure_defaults" {
  command = plan

  assert {
    condition     = aws_instance.this["worker-0"].metadata_options[0].http_tokens == "required" && aws_instance.this["worker-0"].metadata_options[0].http_put_response_hop_limit == 1
    error_message = "IMDSv2 must be required with hop limit 1"
  }
  assert {
    condition = (
      aws_instance.this["worker-0"].root_block_device[0].encrypted == true &&
      aws_instance.this["worker-0"].root_block_device[0].volume_type == "gp3" &&
      aws_instance.this["worker-0"].root_block_device[0].volume_size == 100
    )
    error_message = "root volumes must be encrypted gp3 of root_volume_gb"
  }
}

run "tags_identify_run_role_and_index" {
  command = plan

  assert {
    condition = (
      aws_instance.this["worker-1"].tags["dlinfra:run-id"] == "test-run" &&
      aws_instance.this["worker-1"].tags["dlinfra:role"] == "worker" &&
      aws_instance.this["worker-1"].tags["dlinfra:index"] == "1" &&
      aws_instance.this["worker-1"].tags["Name"] == "dlinfra-test-run-worker-1"
    )
    error_message = "instances must carry run id, role, index and Name tags"
  }
  assert {
    condition     = aws_instance.this["worker-1"].volume_tags["dlinfra:run-id"] == "test-run"
    error_message = "root volumes must carry the run id too"
  }
}

run "on_demand_by_default" {
  command = plan

  assert {
    condition     = length(aws_instance.this["worker-0"].instance_market_options) == 0 && length(aws_placement_group.this) == 0
    error_message = "no spot request and no placement group unless asked for"
  }
}

run "spot_and_placement_group" {
  command = plan

  variables {
    instance = {
      ami_id               = "ami-0123456789abcdef0"
      instance_type        = "g4dn.xlarge"
      iam_instance_profile = "dlinfra-test-run-node"
      spot                 = true
      placement_group      = true
      root_volume_gb       = 200
    }
  }

  assert {
    condition = (
      aws_instance.this["worker-0"].instance_market_options[0].market_type == "spot" &&
      aws_instance.this["worker-0"].instance_market_options[0].spot_options[0].spot_instance_type == "one-time" &&
      aws_instance.this["worker-0"].instance_market_options[0].spot_options[0].instance_interruption_behavior == "terminate"
    )
    error_message = "spot must be a one-time request that terminates on interruption"
  }
  assert {
    condition     = aws_placement_group.this[0].strategy == "cluster" && aws_instance.this["worker-0"].placement_group == "dlinfra-test-run-worker"
    error_message = "placement_group = true must place the nodes in a cluster placement group"
  }
  assert {
    condition     = aws_instance.this["worker-0"].root_block_device[0].volume_size == 200
    error_message = "root_volume_gb must size the root volume"
  }
}

run "a_node_marked_on_demand_leaves_a_spot_group" {
  command = plan

  variables {
    nodes = {
      "worker-0" = { private_ip = "10.42.1.20", user_data = "#cloud-config\n" }
      "worker-1" = { private_ip = "10.42.1.21", user_data = "#cloud-config\n", spot = false }
    }
    instance = {
      ami_id               = "ami-0123456789abcdef0"
      instance_type        = "g4dn.xlarge"
      iam_instance_profile = "dlinfra-test-run-node"
      spot                 = true
    }
  }

  assert {
    condition = (
      aws_instance.this["worker-0"].instance_market_options[0].market_type == "spot" &&
      length(aws_instance.this["worker-1"].instance_market_options) == 0
    )
    error_message = "nodes[*].spot = false must run that node on demand, the others stay spot"
  }
}

run "output_carries_ids_and_ips_only" {
  command = apply

  assert {
    condition     = output.instances["worker-0"].private_ip == "10.42.1.20" && output.instances["worker-0"].id == aws_instance.this["worker-0"].id
    error_message = "instances output must map node to id and private_ip"
  }
  assert {
    condition     = alltrue([for v in values(output.instances) : length(keys(v)) == 2]) && !strcontains(jsonencode(output.instances), "cloud-config")
    error_message = "instances output must not carry user data"
  }
}

run "rejects_ip_outside_subnet" {
  command = plan

  variables {
    nodes = {
      "worker-0" = { private_ip = "10.42.2.20", user_data = "" }
    }
  }

  expect_failures = [aws_instance.this]
}

run "rejects_reserved_ip" {
  command = plan

  variables {
    nodes = {
      "worker-0" = { private_ip = "10.42.1.1", user_data = "" }
    }
  }

  expect_failures = [aws_instance.this]
}

run "rejects_duplicate_ips" {
  command = plan

  variables {
    nodes = {
      "worker-0" = { private_ip = "10.42.1.20", user_data = "" }
      "worker-1" = { private_ip = "10.42.1.20", user_data = "" }
    }
  }

  expect_failures = [var.nodes]
}

run "rejects_malformed_ip" {
  command = plan

  variables {
    nodes = {
      "worker-0" = { private_ip = "10.42.1", user_data = "" }
    }
  }

  expect_failures = [var.nodes]
}

run "rejects_user_data_over_16_kib" {
  command = plan

  variables {
    nodes = {
      # 16385 bytes: one past the EC2 limit.
      "worker-0" = { private_ip = "10.42.1.20", user_data = format("%16385s", "") }
    }
  }

  expect_failures = [var.nodes]
}

run "accepts_user_data_of_exactly_16_kib" {
  command = plan

  variables {
    nodes = {
      "worker-0" = { private_ip = "10.42.1.20", user_data = format("%16384s", "") }
    }
  }
}

run "counts_user_data_in_bytes" {
  command = plan

  variables {
    nodes = {
      # 8193 two-byte characters = 16386 bytes, although only 8193 characters.
      "worker-0" = { private_ip = "10.42.1.20", user_data = replace(format("%8193s", ""), " ", "é") }
    }
  }

  expect_failures = [var.nodes]
}

run "rejects_node_name_without_index" {
  command = plan

  variables {
    nodes = {
      "worker" = { private_ip = "10.42.1.20", user_data = "" }
    }
  }

  expect_failures = [var.nodes]
}

run "rejects_empty_instance_type" {
  command = plan

  variables {
    instance = {
      ami_id               = "ami-0123456789abcdef0"
      instance_type        = ""
      iam_instance_profile = "dlinfra-test-run-node"
    }
  }

  expect_failures = [var.instance]
}

run "rejects_unknown_role" {
  command = plan

  variables {
    role = "master"
  }

  expect_failures = [var.role]
}
