output "instances" {
  description = "Every node of the run: node name to { id, private_ip, role }. Never carries user data."
  value = merge([
    for role, group in module.role : {
      for node, instance in group.instances : node => {
        id         = instance.id
        private_ip = instance.private_ip
        role       = role
      }
    }
  ]...)
}

output "vpc_id" {
  description = "VPC of the cluster."
  value       = module.network.vpc_id
}

output "subnet_id" {
  description = "Cluster subnet."
  value       = module.network.subnet_id
}

output "security_group_id" {
  description = "Cluster security group."
  value       = module.network.security_group_id
}

output "bucket" {
  description = "Results bucket the nodes write to (not managed by this stack)."
  value       = var.bucket
}

output "prefix" {
  description = "Key prefix of this run in the bucket."
  value       = var.prefix
}

output "instance_profile" {
  description = "Instance profile of the nodes (role scoped to s3://bucket/prefix/)."
  value       = module.node_iam.instance_profile_name
}

output "ami_id" {
  description = "AMI the nodes were launched from (resolved from ami_ssm_parameter when ami_id was null); record it to rerun on the same image."
  value       = local.ami_id
}
