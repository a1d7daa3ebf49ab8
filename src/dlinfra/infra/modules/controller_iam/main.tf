data "aws_partition" "current" {}

locals {
  partition  = data.aws_partition.current.partition
  bucket_arn = "arn:${local.partition}:s3:::${var.bucket}"
  state_arn  = "arn:${local.partition}:s3:::${coalesce(var.state_bucket, var.bucket)}"
  # Run stacks name their node role and its instance profile "dlinfra-<run-id>-node"
  # (stack/main.tf): the only IAM the controller may make, change or pass.
  node_role_arns = [
    "arn:${local.partition}:iam::*:role/dlinfra-*-node",
    "arn:${local.partition}:iam::*:instance-profile/dlinfra-*-node",
  ]
  run_tag = "dlinfra:run-id"

  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "EC2AssumeRole"
      Effect    = "Allow"
      Action    = "sts:AssumeRole"
      Principal = { Service = "ec2.${data.aws_partition.current.dns_suffix}" }
    }]
  })

  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        # every run's store: its lease (owner.json), markers, statuses, hand-overs and logs
        Sid      = "RunStores"
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:PutObjectTagging"]
        Resource = ["${local.bucket_arn}/runs/*", "${local.bucket_arn}/controller/*"]
      },
      {
        Sid       = "ListRunStores"
        Effect    = "Allow"
        Action    = "s3:ListBucket"
        Resource  = local.bucket_arn
        Condition = { StringLike = { "s3:prefix" = ["runs/*", "controller/*"] } }
      },
      {
        # each run stack's Terraform state and its lock file (tfvars.state_backend's keys)
        Sid      = "RunStates"
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
        Resource = "${local.state_arn}/dlinfra/*"
      },
      {
        Sid       = "ListRunStates"
        Effect    = "Allow"
        Action    = "s3:ListBucket"
        Resource  = local.state_arn
        Condition = { StringLike = { "s3:prefix" = ["dlinfra/*"] } }
      },
      {
        # Describe calls have no resource-level permissions: Terraform's refreshes need them
        Sid      = "Describe"
        Effect   = "Allow"
        Action   = ["ec2:Describe*", "ec2:GetConsoleOutput"]
        Resource = "*"
      },
      {
        # a run's resources are created only carrying its run tag (the stack's default_tags)
        Sid    = "CreateTaggedRunResources"
        Effect = "Allow"
        Action = [
          "ec2:AllocateAddress", "ec2:CreateInternetGateway", "ec2:CreateNatGateway",
          "ec2:CreateRouteTable", "ec2:CreateSecurityGroup", "ec2:CreateSubnet", "ec2:CreateVpc",
          "ec2:CreateVpcEndpoint", "ec2:RunInstances", "ec2:CreateVolume",
        ]
        Resource  = "*"
        Condition = { StringLike = { "aws:RequestTag/${local.run_tag}" = "*" } }
      },
      {
        # tags only as part of those creates, or on what already carries a run tag
        Sid       = "TagAtCreate"
        Effect    = "Allow"
        Action    = "ec2:CreateTags"
        Resource  = "*"
        Condition = { StringLike = { "ec2:CreateAction" = ["Create*", "AllocateAddress", "RunInstances"] } }
      },
      {
        Sid    = "ChangeRunResources"
        Effect = "Allow"
        Action = [
          "ec2:AssociateRouteTable", "ec2:AttachInternetGateway", "ec2:AuthorizeSecurityGroupEgress",
          "ec2:AuthorizeSecurityGroupIngress", "ec2:CreateRoute", "ec2:CreateTags", "ec2:DeleteInternetGateway",
          "ec2:DeleteNatGateway", "ec2:DeleteRoute", "ec2:DeleteRouteTable", "ec2:DeleteSecurityGroup",
          "ec2:DeleteSubnet", "ec2:DeleteTags", "ec2:DeleteVpc", "ec2:DeleteVpcEndpoints",
          "ec2:DetachInternetGateway", "ec2:DisassociateAddress", "ec2:DisassociateRouteTable",
          "ec2:ModifySubnetAttribute", "ec2:ModifyVpcAttribute", "ec2:ModifyVpcEndpoint",
          "ec2:ReleaseAddress", "ec2:RevokeSecurityGroupEgress", "ec2:RevokeSecurityGroupIngress",
          "ec2:TerminateInstances", "ec2:ModifyInstanceAttribute", "ec2:DeleteVolume",
        ]
        Resource  = "*"
        Condition = { StringLike = { "aws:ResourceTag/${local.run_tag}" = "*" } }
      },
      {
        Sid      = "RunNodeRoles"
        Effect   = "Allow"
        Resource = local.node_role_arns
        Action = [
          "iam:AddRoleToInstanceProfile", "iam:CreateInstanceProfile", "iam:CreateRole",
          "iam:DeleteInstanceProfile", "iam:DeleteRole", "iam:DeleteRolePolicy", "iam:GetInstanceProfile",
          "iam:GetRole", "iam:GetRolePolicy", "iam:ListAttachedRolePolicies", "iam:ListInstanceProfilesForRole",
          "iam:ListRolePolicies", "iam:PutRolePolicy", "iam:RemoveRoleFromInstanceProfile",
          "iam:TagInstanceProfile", "iam:TagRole", "iam:UntagRole",
        ]
      },
      {
        Sid       = "PassRunNodeRolesToEc2"
        Effect    = "Allow"
        Action    = "iam:PassRole"
        Resource  = local.node_role_arns[0]
        Condition = { StringEquals = { "iam:PassedToService" = "ec2.${data.aws_partition.current.dns_suffix}" } }
      },
      {
        # the base AMI's public parameter (aws.ami_ssm_parameter)
        Sid      = "AmiParameters"
        Effect   = "Allow"
        Action   = ["ssm:GetParameter", "ssm:GetParameters"]
        Resource = "arn:${local.partition}:ssm:*:*:parameter/aws/service/*"
      },
      {
        # the bucket's hand-over key (dlinfra.runs.sealing): it reads it, and no other secret
        Sid      = "HandoverKey"
        Effect   = "Allow"
        Action   = "ssm:GetParameter"
        Resource = "arn:${local.partition}:ssm:*:*:parameter/dlinfra/controller/${var.bucket}/handover-key"
      },
      {
        # idle: it stops its own instance, and no other
        Sid       = "StopItself"
        Effect    = "Allow"
        Action    = "ec2:StopInstances"
        Resource  = "*"
        Condition = { StringEquals = { "aws:ResourceTag/dlinfra:role" = "controller" } }
      },
    ]
  })
}

################################################################################
# Role
################################################################################

resource "aws_iam_role" "this" {
  name               = var.name
  description        = "dlinfra controller: runs the run stacks of s3://${var.bucket}/runs/ and nothing else"
  assume_role_policy = local.assume_role_policy

  tags = var.tags
}

resource "aws_iam_role_policy" "run_stacks" {
  #checkov:skip=CKV_AWS_355:EC2 writes are bounded by dlinfra:run-id tag conditions (an ARN pattern adds nothing), Describe has no resource level
  name   = "run-stacks"
  role   = aws_iam_role.this.id
  policy = local.policy
}

################################################################################
# Instance profile
################################################################################

resource "aws_iam_instance_profile" "this" {
  name = var.name
  role = aws_iam_role.this.name

  tags = var.tags
}
