//! The provider against moto, through its real gRPC services; boto3 checks the result.

mod support;

mod reference;
mod apigw;
mod dynamodb;
mod secrets;
mod sqs;
mod ssm;
