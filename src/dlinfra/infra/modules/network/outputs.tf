output "vpc_id" {
  description = "ID of the VPC the cluster runs in (created or given)."
  value       = local.vpc_id
}

output "subnet_id" {
  description = "ID of the cluster subnet. Available only once its routes (NAT or internet gateway, S3 endpoint) exist, so instances placed in it can reach package mirrors and S3 from their first boot."
  value       = local.subnet_id

  depends_on = [
    aws_route_table_association.cluster,
    aws_route.cluster_internet,
    aws_route.public_internet,
    aws_route_table_association.public,
    aws_vpc_endpoint.s3,
  ]
}

output "subnet_cidr" {
  description = "IPv4 CIDR of the cluster subnet; node private IPs must come from it."
  value       = local.subnet_cidr
}

output "security_group_id" {
  description = "ID of the cluster security group (TensorFlow gRPC between members, egress as `egress` allows, no SSH)."
  value       = aws_security_group.cluster.id

  depends_on = [
    aws_vpc_security_group_ingress_rule.tf_grpc,
    aws_vpc_security_group_egress_rule.all,
    aws_vpc_security_group_egress_rule.peers,
    aws_vpc_security_group_egress_rule.s3,
  ]
}

output "associate_public_ip" {
  description = "Whether instances in the cluster subnet must get a public IP to reach the internet (egress = \"public_ip\")."
  value       = local.public_ip
}

output "nat_public_ip" {
  description = "Public IP of the NAT gateway (egress = \"nat\"), null otherwise. Useful for allow-lists of package mirrors."
  value       = one(aws_eip.nat[*].public_ip)
}
