//! Generates the tonic/prost code and the descriptor set for reflection, without a system protoc.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["berth/v1/sandbox.proto", "berth/v1/supervisor.proto"];
    for f in files {
        println!("cargo:rerun-if-changed=proto/{f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("berth_descriptor.bin"), fds.encode_to_vec())?;
    // BTreeMap, not HashMap: map fields encode in one order, so a seeded run is byte-identical.
    tonic_prost_build::configure().btree_map(".").build_server(true).build_client(true).compile_fds(fds)?;
    Ok(())
}
