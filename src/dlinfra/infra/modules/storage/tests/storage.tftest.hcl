mock_provider "aws" {}

variables {
  bucket = "dlinfra-results-test"
}

run "private_encrypted_versioned_by_default" {
  command = plan

  assert {
    condition = (
      aws_s3_bucket_public_access_block.this.block_public_acls &&
      aws_s3_bucket_public_access_block.this.block_public_policy &&
      aws_s3_bucket_public_access_block.this.ignore_public_acls &&
      aws_s3_bucket_public_access_block.this.restrict_public_buckets
    )
    error_message = "every public access block setting must be on"
  }
  assert {
    condition     = one(one(aws_s3_bucket_server_side_encryption_configuration.this.rule).apply_server_side_encryption_by_default).sse_algorithm == "AES256"
    error_message = "SSE-S3 by default"
  }
  assert {
    condition     = aws_s3_bucket_versioning.this.versioning_configuration[0].status == "Enabled"
    error_message = "versioning must be on"
  }
  assert {
    condition     = aws_s3_bucket_ownership_controls.this.rule[0].object_ownership == "BucketOwnerEnforced"
    error_message = "ACLs must be disabled (BucketOwnerEnforced)"
  }
  assert {
    condition     = aws_s3_bucket.this.force_destroy == false
    error_message = "the results bucket must not be force-destroyed by default"
  }
}

run "plain_http_is_denied" {
  command = apply

  assert {
    condition = (
      jsondecode(aws_s3_bucket_policy.tls_only[0].policy).Statement[0].Effect == "Deny" &&
      jsondecode(aws_s3_bucket_policy.tls_only[0].policy).Statement[0].Condition.Bool["aws:SecureTransport"] == "false"
    )
    error_message = "requests without TLS must be denied"
  }
  assert {
    condition     = output.bucket == "dlinfra-results-test" && output.bucket_arn == aws_s3_bucket.this.arn
    error_message = "outputs must expose the bucket name and ARN"
  }
}

run "tls_policy_can_be_turned_off_for_plain_http_emulators" {
  command = plan

  variables {
    deny_insecure_transport = false
  }

  assert {
    condition     = length(aws_s3_bucket_policy.tls_only) == 0
    error_message = "deny_insecure_transport = false must drop the TLS-only policy"
  }
}

run "lifecycle_expires_noncurrent_versions_and_tagged_checkpoints" {
  command = plan

  assert {
    condition     = length(aws_s3_bucket_lifecycle_configuration.this.rule) == 3
    error_message = "abort-uploads, noncurrent-versions and the checkpoint tag rule"
  }
  assert {
    condition     = [for r in aws_s3_bucket_lifecycle_configuration.this.rule : r.noncurrent_version_expiration[0].noncurrent_days if r.id == "expire-noncurrent-versions"] == [30]
    error_message = "noncurrent versions expire after 30 days by default"
  }
  assert {
    condition = [
      for r in aws_s3_bucket_lifecycle_configuration.this.rule : [r.expiration[0].days, r.filter[0].tag[0].key, r.filter[0].tag[0].value]
      if r.id == "expire-checkpoints-tagged"
    ] == [[14, "dlinfra:kind", "checkpoint"]]
    error_message = "objects tagged dlinfra:kind=checkpoint expire after 14 days by default"
  }
  assert {
    condition     = [for r in aws_s3_bucket_lifecycle_configuration.this.rule : r.abort_incomplete_multipart_upload[0].days_after_initiation if r.id == "abort-incomplete-uploads"] == [7]
    error_message = "incomplete multipart uploads are aborted after 7 days"
  }
}

run "checkpoint_prefixes_add_prefix_rules" {
  command = plan

  variables {
    retention = { checkpoint_prefixes = ["checkpoints/"], checkpoint_days = 3 }
  }

  assert {
    condition = [
      for r in aws_s3_bucket_lifecycle_configuration.this.rule : [r.expiration[0].days, r.filter[0].prefix]
      if r.id == "expire-checkpoints-checkpoints"
    ] == [[3, "checkpoints/"]]
    error_message = "a literal checkpoint prefix gets its own expiry rule"
  }
}

run "checkpoint_days_zero_keeps_checkpoints" {
  command = plan

  variables {
    retention = { checkpoint_days = 0 }
  }

  assert {
    condition     = length(aws_s3_bucket_lifecycle_configuration.this.rule) == 2
    error_message = "checkpoint_days = 0 must drop the checkpoint rules"
  }
}

run "kms_key_switches_to_sse_kms" {
  command = plan

  variables {
    kms_key_arn = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
  }

  assert {
    condition = (
      one(one(aws_s3_bucket_server_side_encryption_configuration.this.rule).apply_server_side_encryption_by_default).sse_algorithm == "aws:kms" &&
      one(aws_s3_bucket_server_side_encryption_configuration.this.rule).bucket_key_enabled == true
    )
    error_message = "a KMS key must switch to SSE-KMS with a bucket key"
  }
}

run "rejects_invalid_bucket_name" {
  command = plan

  variables {
    bucket = "Not_A_Bucket"
  }

  expect_failures = [var.bucket]
}

run "rejects_wildcard_checkpoint_prefix" {
  command = plan

  variables {
    retention = { checkpoint_prefixes = ["runs/*/checkpoints/"] }
  }

  expect_failures = [var.retention]
}

run "rejects_negative_days" {
  command = plan

  variables {
    retention = { noncurrent_version_days = -1 }
  }

  expect_failures = [var.retention]
}
