data "aws_partition" "current" {}

locals {
  partition  = data.aws_partition.current.partition
  bucket_arn = "arn:${local.partition}:s3:::${var.bucket}"

  # Session Manager's channels only. AmazonSSMManagedInstanceCore would also let every node read
  # every SSM parameter (and run documents) in the account.
  session_manager_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "RegisterWithSsm"
        Effect   = "Allow"
        Action   = "ssm:UpdateInstanceInformation"
        Resource = "arn:${local.partition}:ec2:*:*:instance/*"
      },
      {
        Sid    = "SessionChannels"
        Effect = "Allow"
        Action = [
          "ssmmessages:CreateControlChannel",
          "ssmmessages:CreateDataChannel",
          "ssmmessages:OpenControlChannel",
          "ssmmessages:OpenDataChannel",
        ]
        Resource = "*" # ssmmessages has no resource-level permissions
      },
    ]
  })

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
      # What pins the run (its code, the wheel nodes install, its Terraform inputs, its manifest) is
      # written by the CLI alone: one compromised node must not poison the instances that replace it.
      Sid    = "PinsAreReadOnly"
      Effect = "Deny"
      Action = ["s3:PutObject", "s3:PutObjectTagging"]
      Resource = [
        "${local.bucket_arn}/${var.prefix}/code/*",
        "${local.bucket_arn}/${var.prefix}/terraform/*",
        "${local.bucket_arn}/${var.prefix}/manifest.json",
      ]
    },
    {
      Sid       = "ListRunPrefix"
      Effect    = "Allow"
      Action    = "s3:ListBucket"
      Resource  = local.bucket_arn
      Condition = { StringLike = { "s3:prefix" = ["${var.prefix}/*"] } }
    },
  ]

  read_statements = length(var.read_objects) == 0 ? [] : [{
    Sid      = "ReadObjects"
    Effect   = "Allow"
    Action   = "s3:GetObject"
    Resource = [for object in var.read_objects : "arn:${local.partition}:s3:::${object}"]
  }]

  kms_statements = var.bucket_kms_key_arn == null ? [] : [{
    Sid      = "BucketKey"
    Effect   = "Allow"
    Action   = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"]
    Resource = var.bucket_kms_key_arn
  }]

  run_prefix_policy = jsonencode({
    Version   = "2012-10-17"
    Statement = concat(local.run_prefix_statements, local.kms_statements, local.read_statements)
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

resource "aws_iam_role_policy" "session_manager" {
  count = var.ssm_access ? 1 : 0

  name   = "session-manager"
  role   = aws_iam_role.this.id
  policy = local.session_manager_policy
}

################################################################################
# Instance profile
################################################################################

resource "aws_iam_instance_profile" "this" {
  name = var.name
  role = aws_iam_role.this.name

  tags = var.tags
}
