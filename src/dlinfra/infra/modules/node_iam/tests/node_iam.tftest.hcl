mock_provider "aws" {
  mock_data "aws_partition" {
    defaults = { partition = "aws", dns_suffix = "amazonaws.com" }
  }
}

variables {
  name   = "dlinfra-test-run-node"
  bucket = "results-bucket"
  prefix = "runs/test-run"
}

run "policy_reaches_only_the_run_prefix" {
  command = plan

  assert {
    condition     = jsondecode(aws_iam_role_policy.run_prefix.policy).Statement[0].Resource == "arn:aws:s3:::results-bucket/runs/test-run/*"
    error_message = "object actions must be limited to the run prefix"
  }
  assert {
    condition = toset(jsondecode(aws_iam_role_policy.run_prefix.policy).Statement[0].Action) == toset([
      "s3:GetObject", "s3:PutObject", "s3:PutObjectTagging", "s3:AbortMultipartUpload",
    ])
    error_message = "object actions must be exactly get/put/tag/abort"
  }
  assert {
    condition = (
      jsondecode(aws_iam_role_policy.run_prefix.policy).Statement[1].Effect == "Deny" &&
      toset(jsondecode(aws_iam_role_policy.run_prefix.policy).Statement[1].Resource) == toset([
        "arn:aws:s3:::results-bucket/runs/test-run/code/*",
        "arn:aws:s3:::results-bucket/runs/test-run/terraform/*",
        "arn:aws:s3:::results-bucket/runs/test-run/manifest.json",
      ]) &&
      contains(jsondecode(aws_iam_role_policy.run_prefix.policy).Statement[1].Action, "s3:PutObject")
    )
    error_message = "nodes must not write the run's pins (code, terraform inputs, manifest)"
  }
  assert {
    condition = (
      jsondecode(aws_iam_role_policy.run_prefix.policy).Statement[2].Action == "s3:ListBucket" &&
      jsondecode(aws_iam_role_policy.run_prefix.policy).Statement[2].Resource == "arn:aws:s3:::results-bucket" &&
      jsondecode(aws_iam_role_policy.run_prefix.policy).Statement[2].Condition.StringLike["s3:prefix"] == ["runs/test-run/*"]
    )
    error_message = "listing must be limited to the run prefix by an s3:prefix condition"
  }
  assert {
    condition     = length(jsondecode(aws_iam_role_policy.run_prefix.policy).Statement) == 3
    error_message = "no KMS statement without a KMS key"
  }
  assert {
    condition     = !strcontains(aws_iam_role_policy.run_prefix.policy, "\"*\"") && !strcontains(aws_iam_role_policy.run_prefix.policy, "s3:*")
    error_message = "the policy must not contain wildcard actions or resources"
  }
}

run "role_is_for_ec2_only" {
  command = plan

  assert {
    condition     = jsondecode(aws_iam_role.this.assume_role_policy).Statement[0].Principal.Service == "ec2.amazonaws.com"
    error_message = "only EC2 may assume the node role"
  }
  assert {
    condition     = aws_iam_instance_profile.this.name == "dlinfra-test-run-node"
    error_message = "the instance profile is named like the role"
  }
}

run "ssm_access_is_off_by_default" {
  command = plan

  assert {
    condition     = length(aws_iam_role_policy.session_manager) == 0
    error_message = "nodes get no Session Manager access unless asked"
  }
}

run "ssm_access_grants_session_channels_only" {
  command = plan

  variables {
    ssm_access = true
  }

  assert {
    condition = toset(flatten([
      for s in jsondecode(aws_iam_role_policy.session_manager[0].policy).Statement : s.Action
      ])) == toset([
      "ssm:UpdateInstanceInformation",
      "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
      "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel",
    ])
    error_message = "ssm_access must grant Session Manager's channels and nothing else (no ssm:GetParameter*)"
  }
}

run "kms_key_adds_key_statement" {
  command = plan

  variables {
    bucket_kms_key_arn = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
  }

  assert {
    condition     = jsondecode(aws_iam_role_policy.run_prefix.policy).Statement[3].Resource == "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    error_message = "a KMS-encrypted bucket needs the key, and only that key"
  }
}

run "rejects_prefix_with_trailing_slash" {
  command = plan

  variables {
    prefix = "runs/test-run/"
  }

  expect_failures = [var.prefix]
}

run "rejects_prefix_with_wildcard" {
  command = plan

  variables {
    prefix = "runs/*"
  }

  expect_failures = [var.prefix]
}

run "rejects_invalid_bucket_name" {
  command = plan

  variables {
    bucket = "Results_Bucket"
  }

  expect_failures = [var.bucket]
}

run "rejects_overlong_role_name" {
  command = plan

  variables {
    name = "dlinfra-a-very-long-experiment-name-that-goes-on-and-on-20261122-073000-ab12-node"
  }

  expect_failures = [var.name]
}
