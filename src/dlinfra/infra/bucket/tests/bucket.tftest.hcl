mock_provider "aws" {}

variables {
  region = "us-east-1"
  bucket = "dlinfra-results-test"
}

run "creates_the_results_bucket_with_storage_defaults" {
  command = apply

  assert {
    condition     = output.bucket == "dlinfra-results-test"
    error_message = "the bucket output must name the bucket"
  }
}

run "real_aws_denies_requests_without_tls" {
  command = plan

  assert {
    condition     = module.storage.deny_insecure_transport == true
    error_message = "against real AWS the TLS-only bucket policy must be attached"
  }
}

run "plain_http_emulator_gets_no_tls_only_policy" {
  command = plan

  variables {
    endpoint_url = "http://127.0.0.1:5000"
  }

  assert {
    condition     = module.storage.deny_insecure_transport == false
    error_message = "an http:// emulator cannot satisfy aws:SecureTransport"
  }
}

run "rejects_invalid_bucket_name" {
  command = plan

  variables {
    bucket = "results_bucket"
  }

  expect_failures = [var.bucket]
}

run "rejects_malformed_endpoint" {
  command = plan

  variables {
    endpoint_url = "127.0.0.1:5000"
  }

  expect_failures = [var.endpoint_url]
}
