output "builder_instance_id" {
  description = "Instance id of the builder (its console output shows the recipe's progress). Never carries user data."
  value       = aws_instance.builder.id
}

output "ami_id" {
  description = "The baked AMI, null until create_ami is true."
  value       = one(aws_ami_from_instance.this[*].id)
}

output "base_ami_id" {
  description = "AMI the builder started from (resolved from ami_ssm_parameter when base_ami_id was null); also tagged dlinfra:base-ami on the image."
  value       = local.base_ami_id
}
