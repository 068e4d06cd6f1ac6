//! The provider against moto, through its real gRPC services; boto3 checks the result.

mod support;

mod events;
mod s3;
mod sns;
mod sqs;
