mock_provider "aws" {
  mock_data "aws_partition" {
    defaults = { partition = "aws", dns_suffix = "amazonaws.com" }
  }
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
}

variables {
  region = "us-east-1"
  image = {
    name         = "dlinfra-0.1.0-cpu-0123456789ab"
    digest       = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    version      = "0.1.0"
    flavor       = "cpu"
    wheel_sha256 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
    lock_sha256  = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
  }
  base_ami_id = "ami-0123456789abcdef0"
  user_data   = "#cloud-config\nruncmd:\n  - [sh, /usr/local/lib/dlinfra/image-recipe.sh]\n"
  bucket      = "dlinfra-results-test"
  prefix      = "runs/images/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
  tags        = { team = "ml" }
}

run "launches_one_builder_and_no_image_by_default" {
  command = apply

  assert {
    condition     = output.ami_id == null && length(aws_ami_from_instance.this) == 0
    error_message = "no AMI may be registered before the builder reported completion"
  }
  assert {
    condition     = output.builder_instance_id == aws_instance.builder.id && aws_instance.builder.ami == "ami-0123456789abcdef0"
    error_message = "the builder starts from base_ami_id"
  }
  assert {
    condition     = length(data.aws_ssm_parameter.ami) == 0 && output.base_ami_id == "ami-0123456789abcdef0"
    error_message = "the SSM parameter must not be read when base_ami_id is set"
  }
  assert {
    condition     = aws_instance.builder.user_data == var.user_data
    error_message = "the builder boots from the given user data"
  }
}

run "builder_requires_imdsv2_encrypts_its_root_and_terminates_on_shutdown" {
  command = plan

  assert {
    condition     = aws_instance.builder.metadata_options[0].http_tokens == "required"
    error_message = "IMDSv2 must be required"
  }
  assert {
    condition     = aws_instance.builder.root_block_device[0].encrypted == true && aws_instance.builder.root_block_device[0].volume_type == "gp3"
    error_message = "the root volume (and so the AMI's snapshot) must be encrypted gp3"
  }
  assert {
    condition     = aws_instance.builder.instance_initiated_shutdown_behavior == "terminate"
    error_message = "an orphaned builder that powers off must end its bill"
  }
  assert {
    condition     = module.network.associate_public_ip == false
    error_message = "behind a NAT gateway (the default) the builder gets no public IP"
  }
}

run "builder_role_is_named_from_the_digest" {
  command = plan

  assert {
    condition     = module.builder_iam.role_name == "dlinfra-image-0123456789abcdef-builder"
    error_message = "the builder's role is named from the digest"
  }
}

run "create_ami_registers_the_image_with_its_tags" {
  command = apply

  variables {
    create_ami = true
  }

  assert {
    condition     = output.ami_id == aws_ami_from_instance.this[0].id && aws_ami_from_instance.this[0].source_instance_id == aws_instance.builder.id
    error_message = "the AMI is taken from the builder"
  }
  assert {
    condition     = aws_ami_from_instance.this[0].name == "dlinfra-0.1.0-cpu-0123456789ab"
    error_message = "the AMI is named from image.name"
  }
  assert {
    condition = (
      aws_ami_from_instance.this[0].tags["dlinfra:version"] == "0.1.0" &&
      aws_ami_from_instance.this[0].tags["dlinfra:flavor"] == "cpu" &&
      aws_ami_from_instance.this[0].tags["dlinfra:wheel-sha256"] == var.image.wheel_sha256 &&
      aws_ami_from_instance.this[0].tags["dlinfra:lock-sha256"] == var.image.lock_sha256 &&
      aws_ami_from_instance.this[0].tags["dlinfra:base-ami"] == "ami-0123456789abcdef0"
    )
    error_message = "the AMI carries version, flavor, wheel and lock sha256 and base AMI tags"
  }
}

run "ssm_parameter_resolves_the_base_ami_when_no_id_is_given" {
  command = apply

  variables {
    base_ami_id = null
  }

  override_data {
    target = data.aws_ssm_parameter.ami[0]
    values = { insecure_value = "ami-0fromssm0000000000" }
  }

  assert {
    condition     = data.aws_ssm_parameter.ami[0].name == "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
    error_message = "the default base is the run nodes' Deep Learning AMI"
  }
  assert {
    condition     = aws_instance.builder.ami == "ami-0fromssm0000000000" && output.base_ami_id == "ami-0fromssm0000000000"
    error_message = "the builder must start from the SSM parameter's AMI"
  }
}

run "public_ip_egress_gives_the_builder_a_public_ip" {
  command = plan

  # A fresh builder: an existing one keeps its public IP setting (ignore_changes).
  state_key = "public_ip"

  variables {
    network = { egress = "public_ip" }
  }

  assert {
    condition     = aws_instance.builder.associate_public_ip_address == true
    error_message = "egress = public_ip must give the builder a public IP to reach package mirrors"
  }
}

run "rejects_a_digest_that_is_not_sha256" {
  command = plan

  variables {
    image = {
      name         = "dlinfra-0.1.0-cpu-0123456789ab"
      digest       = "0123abcd"
      version      = "0.1.0"
      flavor       = "cpu"
      wheel_sha256 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
      lock_sha256  = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
    }
  }

  expect_failures = [var.image]
}

run "rejects_an_unknown_flavor" {
  command = plan

  variables {
    image = {
      name         = "dlinfra-0.1.0-tpu-0123456789ab"
      digest       = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
      version      = "0.1.0"
      flavor       = "tpu"
      wheel_sha256 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
      lock_sha256  = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
    }
  }

  expect_failures = [var.image]
}

run "rejects_an_invalid_ami_name" {
  command = plan

  variables {
    image = {
      name         = "dlinfra-0.1.0+local-cpu"
      digest       = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
      version      = "0.1.0+local"
      flavor       = "cpu"
      wheel_sha256 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
      lock_sha256  = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
    }
  }

  expect_failures = [var.image]
}

run "rejects_user_data_over_16_kib" {
  command = plan

  variables {
    user_data = format("%16385s", "")
  }

  expect_failures = [var.user_data]
}

run "rejects_malformed_base_ami" {
  command = plan

  variables {
    base_ami_id = "ubuntu-24.04"
  }

  expect_failures = [var.base_ami_id]
}

run "rejects_prefix_with_leading_slash" {
  command = plan

  variables {
    prefix = "/runs/images/x"
  }

  expect_failures = [var.prefix]
}
