//! The provider against moto, through its real gRPC services; boto3 checks the result.

mod support;

mod datasources;
mod sqs;
mod variables;
