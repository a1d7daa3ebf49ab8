data "aws_partition" "current" {}

locals {
  partition  = data.aws_partition.current.partition
  bucket_arn = "arn:${local.partition}:s3:::${var.bucket}"

  # Managed policies keyed by a stable name; only Session Manager for now.
  managed_policies = var.ssm_access ? {
    ssm = "arn:${local.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
  } : {}

  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "EC2AssumeRole"
      Effect    = "Allow"
      Action    = "sts:AssumeRole"
      Principal = { Service = "ec2.${data.aws_partition.current.dns_suffix}" }
    }]
  })

  run_prefix_statements = [
    {
      Sid    = "RunPrefixObjects"
      Effect = "Allow"
      Action = [
        "s3:GetObject",
        "s3:PutObject",
        "s3:PutObjectTagging",
        "s3:AbortMultipartUpload",
      ]
      Resource = "${local.bucket_arn}/${var.prefix}/*"
    },
    {
      Sid       = "ListRunPrefix"
      Effect    = "Allow"
      Action    = "s3:ListBucket"
      Resource  = local.bucket_arn
      Condition = { StringLike = { "s3:prefix" = ["${var.prefix}/*"] } }
    },
  ]

  kms_statements = var.bucket_kms_key_arn == null ? [] : [{
    Sid      = "BucketKey"
    Effect   = "Allow"
    Action   = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"]
    Resource = var.bucket_kms_key_arn
  }]

  run_prefix_policy = jsonencode({
    Version   = "2012-10-17"
    Statement = concat(local.run_prefix_statements, local.kms_statements)
  })
}

################################################################################
# Role
################################################################################

resource "aws_iam_role" "this" {
  name               = var.name
  description        = "dlinfra node: read/write s3://${var.bucket}/${var.prefix}/ only"
  assume_role_policy = local.assume_role_policy

  tags = var.tags
}

resource "aws_iam_role_policy" "run_prefix" {
  name   = "run-prefix"
  role   = aws_iam_role.this.id
  policy = local.run_prefix_policy
}

resource "aws_iam_role_policy_attachment" "managed" {
  for_each = local.managed_policies

  role       = aws_iam_role.this.name
  policy_arn = each.value
}

################################################################################
# Instance profile
################################################################################

resource "aws_iam_instance_profile" "this" {
  name = var.name
  role = aws_iam_role.this.name

  tags = var.tags
}
