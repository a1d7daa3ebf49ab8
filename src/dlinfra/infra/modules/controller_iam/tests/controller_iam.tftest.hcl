mock_provider "aws" {
  mock_data "aws_partition" {
    defaults = { partition = "aws", dns_suffix = "amazonaws.com" }
  }
}

variables {
  bucket = "results-bucket"
}

run "only_ec2_assumes_the_role" {
  command = plan

  assert {
    condition     = jsondecode(aws_iam_role.this.assume_role_policy).Statement[0].Principal.Service == "ec2.amazonaws.com"
    error_message = "only EC2 may assume the controller role"
  }
  assert {
    condition     = aws_iam_instance_profile.this.name == "dlinfra-controller"
    error_message = "the instance profile is named like the role"
  }
}

run "objects_only_under_runs_controller_and_the_states" {
  command = plan

  assert {
    condition = toset(flatten([
      for s in jsondecode(aws_iam_role_policy.run_stacks.policy).Statement : s.Resource
      if length([for a in flatten([s.Action]) : a if startswith(a, "s3:") && a != "s3:ListBucket"]) > 0
      ])) == toset([
      "arn:aws:s3:::results-bucket/runs/*", "arn:aws:s3:::results-bucket/controller/*",
      "arn:aws:s3:::results-bucket/dlinfra/*",
    ])
    error_message = "object actions reach the runs, the controller's keys and the run states only"
  }
}

run "iam_only_on_run_node_roles" {
  command = plan

  assert {
    condition = alltrue([
      for s in jsondecode(aws_iam_role_policy.run_stacks.policy).Statement :
      alltrue([for r in flatten([s.Resource]) : endswith(r, "/dlinfra-*-node")])
      if length([for a in flatten([s.Action]) : a if startswith(a, "iam:")]) > 0
    ])
    error_message = "IAM actions only on dlinfra-*-node roles and instance profiles (never the controller's own)"
  }
}

run "every_ec2_write_is_conditioned_on_a_tag" {
  command = plan

  assert {
    condition = alltrue([
      for s in jsondecode(aws_iam_role_policy.run_stacks.policy).Statement :
      can(s.Condition)
      if length([for a in flatten([s.Action]) : a if startswith(a, "ec2:") && !startswith(a, "ec2:Describe") && a != "ec2:GetConsoleOutput"]) > 0
    ])
    error_message = "every EC2 action that creates or changes something needs a tag condition"
  }
}

run "ssm_only_the_public_ami_parameters_and_its_buckets_handover_key" {
  command = plan

  assert {
    condition = toset(flatten([
      for s in jsondecode(aws_iam_role_policy.run_stacks.policy).Statement : s.Resource
      if length([for a in flatten([s.Action]) : a if startswith(a, "ssm:")]) > 0
      ])) == toset([
      "arn:aws:ssm:*:*:parameter/aws/service/*",
      "arn:aws:ssm:*:*:parameter/dlinfra/controller/results-bucket/handover-key",
    ])
    error_message = "SSM reads reach the public AMI parameters and this bucket's hand-over key only"
  }
}

run "state_bucket_moves_the_states" {
  command = plan

  variables {
    state_bucket = "team-states"
  }

  assert {
    condition     = strcontains(aws_iam_role_policy.run_stacks.policy, "arn:aws:s3:::team-states/dlinfra/*")
    error_message = "the run states are in the state bucket"
  }
}

run "rejects_a_name_of_a_node_role" {
  command = plan

  variables {
    name = "dlinfra-x-node"
  }

  expect_failures = [var.name]
}
