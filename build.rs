//! Compiles `proto/` with protox (pure Rust, no system `protoc`) and generates
//! the tonic client and server. The encoded descriptor set is written next to
//! the generated code so the server can offer gRPC reflection.
use std::{env, fs, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/petstore.proto", "proto/google/type/date.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }

    let file_descriptors = protox::compile(protos, ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // compile_fds ignores file_descriptor_set_path, so encode it ourselves.
    fs::write(
        out_dir.join("petstore_descriptor.bin"),
        file_descriptors.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(file_descriptors)?;
    Ok(())
}
