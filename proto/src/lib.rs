//! berth-proto: Berth's wire format. The public API (`Sandboxes`, `Providers`) and the
//! supervisor API (`Supervisor`), generated from `proto/berth/v1/*.proto` with protox and
//! tonic-prost-build, plus the descriptor set that gRPC reflection serves, and [`carry`]: a
//! connection's bytes over a stream of these messages, as egress, ingress and port-forward
//! carry them.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("berth.v1");
    include!(concat!(env!("OUT_DIR"), "/berth.v1.serde.rs"));
    include!(concat!(env!("OUT_DIR"), "/clients/berth.v1.rs"));
}

pub mod carry;
pub mod codec;
pub mod ingress;

/// The encoded `FileDescriptorSet` of every Berth service, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/berth_descriptor.bin"));
