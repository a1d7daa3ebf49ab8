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
