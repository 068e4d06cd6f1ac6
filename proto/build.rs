//! Generates Rust code for the .proto files with protox (a pure-Rust protobuf
//! compiler), so building needs no `protoc` on the machine.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "trellis/plugin/v1/types.proto",
        "trellis/plugin/v1/plugin.proto",
        "trellis/engine/v1/engine.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // Kept for gRPC reflection.
    std::fs::write(
        out.join("trellis_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
