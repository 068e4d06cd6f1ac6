//! The provider against moto, through its real gRPC services; boto3 checks the result.

mod support;

mod apigw;
mod datasources;
mod dynamodb;
mod events;
mod iam;
mod import;
mod lambda;
mod links;
mod reference;
mod s3;
mod secrets;
mod sns;
mod sqs;
mod ssm;
mod variables;
