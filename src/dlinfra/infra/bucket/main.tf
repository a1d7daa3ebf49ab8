locals {
  emulated = var.endpoint_url != null
  # An emulator on plain http:// enforces bucket policies but cannot satisfy aws:SecureTransport.
  plain_http_emulator = local.emulated && startswith(coalesce(var.endpoint_url, "https://"), "http://")
}

################################################################################
# Provider: real AWS, or every service at endpoint_url (moto, LocalStack)
################################################################################

provider "aws" {
  region = var.region

  # Null endpoints leave the provider's defaults (real AWS) in place.
  endpoints {
    iam = var.endpoint_url
    s3  = var.endpoint_url
    sts = var.endpoint_url
  }

  skip_credentials_validation = local.emulated
  skip_requesting_account_id  = local.emulated
  skip_metadata_api_check     = local.emulated
  s3_use_path_style           = local.emulated

  default_tags {
    tags = var.tags
  }
}

################################################################################
# Results bucket (long-lived: outlives every run's stack)
################################################################################

module "storage" {
  source = "../modules/storage"

  bucket                  = var.bucket
  deny_insecure_transport = !local.plain_http_emulator
}
