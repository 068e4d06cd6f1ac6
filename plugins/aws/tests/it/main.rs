//! The provider against moto, through its real gRPC services; boto3 checks the result.

mod support;

mod iam;
mod lambda;
mod sqs;
