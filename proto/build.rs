//! Generates the tonic/prost code and the descriptor set for reflection, without a system protoc.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "berth/v1/sandbox.proto",
        "berth/v1/exec.proto",
        "berth/v1/logs.proto",
        "berth/v1/files.proto",
        "berth/v1/templates.proto",
        "berth/v1/snapshots.proto",
        "berth/v1/volumes.proto",
        "berth/v1/nodes.proto",
        "berth/v1/gateway.proto",
        "berth/v1/supervisor.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed=proto/{f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("berth_descriptor.bin"), fds.encode_to_vec())?;
    // BTreeMap, not HashMap: map fields encode in one order, so a seeded run is byte-identical.
    // The messages and the servers, whose codec answers INVALID_ARGUMENT for an undecodable
    // request (see codec.rs)...
    tonic_prost_build::configure()
        .btree_map(".")
        .build_server(true)
        .build_client(false)
        .codec_path("crate::codec::RequestCodec")
        .compile_fds(fds.clone())?;
    // The proto3 JSON mapping of every message, for the HTTP/JSON API: field names as the
    // protos spell them, unknown fields refused.
    pbjson_build::Builder::new()
        .register_descriptors(&fds.encode_to_vec())?
        .btree_map(["."])
        .preserve_proto_field_names()
        .build(&[".berth.v1"])?;
    // ...then the clients apart, with prost's codec, over the messages above.
    let clients = out.join("clients");
    std::fs::create_dir_all(&clients)?;
    tonic_prost_build::configure()
        .extern_path(".berth.v1", "crate::v1")
        .build_server(false)
        .build_client(true)
        .out_dir(&clients)
        .compile_fds(fds)?;
    Ok(())
}
