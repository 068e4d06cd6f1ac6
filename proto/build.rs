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
    // Twice: the messages alone (for crates that only read and write them, with no gRPC
    // stack), and messages with their clients and servers (the `grpc` feature).
    for (dir, services) in [("messages", false), ("grpc", true)] {
        let out_dir = out.join(dir);
        std::fs::create_dir_all(&out_dir)?;
        tonic_prost_build::configure()
            .build_client(services)
            .build_server(services)
            .out_dir(&out_dir)
            .compile_fds(fds.clone())?;
    }
    Ok(())
}
