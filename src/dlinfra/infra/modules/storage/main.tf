locals {
  sse_algorithm = var.kms_key_arn == null ? "AES256" : "aws:kms"

  # Checkpoint expiry rules keyed by a stable name: the tag rule plus one per literal prefix.
  checkpoint_rules = var.retention.checkpoint_days == 0 ? {} : merge(
    { "expire-checkpoints-tagged" = { prefix = null, tag_key = var.retention.checkpoint_tag.key, tag_value = var.retention.checkpoint_tag.value } },
    { for p in var.retention.checkpoint_prefixes : "expire-checkpoints-${trimsuffix(replace(p, "/", "-"), "-")}" => { prefix = p, tag_key = null, tag_value = null } },
  )
}

################################################################################
# Bucket
################################################################################

resource "aws_s3_bucket" "this" {
  #checkov:skip=CKV_AWS_18:Access logging needs a second, log-only bucket; enable it on the account's log bucket when policy requires it.
  #checkov:skip=CKV_AWS_144:Cross-region replication doubles storage for reproducible experiment results; opt in per account.
  #checkov:skip=CKV2_AWS_62:No consumer of S3 event notifications; the CLI polls the run's status objects.
  #checkov:skip=CKV_AWS_145:SSE-S3 (AES256) is the default so nodes need no KMS grant; pass kms_key_arn for SSE-KMS.
  bucket        = var.bucket
  force_destroy = var.force_destroy

  tags = var.tags
}

resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket = aws_s3_bucket.this.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

################################################################################
# Encryption and transport
################################################################################

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = local.sse_algorithm
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = var.kms_key_arn != null
  }
}

resource "aws_s3_bucket_policy" "tls_only" {
  count = var.deny_insecure_transport ? 1 : 0

  bucket = aws_s3_bucket.this.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "DenyInsecureTransport"
      Effect    = "Deny"
      Principal = "*"
      Action    = "s3:*"
      Resource  = [aws_s3_bucket.this.arn, "${aws_s3_bucket.this.arn}/*"]
      Condition = { Bool = { "aws:SecureTransport" = "false" } }
    }]
  })

  depends_on = [aws_s3_bucket_public_access_block.this]
}

################################################################################
# Versioning and lifecycle
################################################################################

resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = var.retention.abort_incomplete_upload_days
    }
  }

  rule {
    id     = "expire-noncurrent-versions"
    status = var.retention.noncurrent_version_days > 0 ? "Enabled" : "Disabled"

    filter {}

    noncurrent_version_expiration {
      noncurrent_days = max(var.retention.noncurrent_version_days, 1)
    }
  }

  dynamic "rule" {
    for_each = local.checkpoint_rules

    content {
      id     = rule.key
      status = "Enabled"

      filter {
        prefix = rule.value.prefix

        dynamic "tag" {
          for_each = rule.value.tag_key == null ? {} : { (rule.value.tag_key) = rule.value.tag_value }

          content {
            key   = tag.key
            value = tag.value
          }
        }
      }

      expiration {
        days = var.retention.checkpoint_days
      }
    }
  }

  depends_on = [aws_s3_bucket_versioning.this]
}
