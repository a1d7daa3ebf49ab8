mock_provider "aws" {
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }
  mock_data "aws_region" {
    defaults = {
      name = "us-east-1"
    }
  }
}

variables {
  region        = "us-east-1"
  bucket        = "dlinfra-results-test"
  ami_id        = "ami-0123456789abcdef0"
  instance_type = "t3.micro"
  user_data     = "#cloud-config\n"
}

run "one_small_instance_under_the_controller_role_that_stops_itself" {
  command = plan

  assert {
    condition     = aws_instance.this.instance_type == "t3.micro" && aws_instance.this.instance_initiated_shutdown_behavior == "stop"
    error_message = "an idle controller powers off into stopped (its disk kept), not terminated"
  }

  assert {
    condition     = aws_instance.this.iam_instance_profile == "dlinfra-controller"
    error_message = "the instance runs under the controller's own role (modules/controller_iam)"
  }

  assert {
    condition     = aws_instance.this.tags["dlinfra:role"] == "controller" && !contains(keys(aws_instance.this.tags), "dlinfra:run-id")
    error_message = "tagged as the controller (what its role may stop), never as a run (what its role may terminate)"
  }

  assert {
    condition     = aws_instance.this.metadata_options[0].http_tokens == "required" && aws_instance.this.root_block_device[0].encrypted
    error_message = "IMDSv2 only, encrypted root volume"
  }
}

run "out_through_an_internet_gateway_not_a_nat_gateway" {
  command = plan

  assert {
    condition     = module.network.associate_public_ip
    error_message = "egress through an internet gateway (a public IP), no NAT gateway"
  }
}

run "rejects_an_ami_that_is_not_an_id" {
  command = plan

  variables {
    ami_id = "debian-12"
  }

  expect_failures = [var.ami_id]
}
