//! Provider `aws`, built on aws-sdk-rust and tested against moto. Not yet started.
