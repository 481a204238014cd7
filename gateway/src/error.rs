//! What the gateway's operations fail with, and its gRPC status.

use berth_core::Code;
use tonic::Status;

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Core(#[from] berth_core::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Driver(#[from] berth_drivers::DriverError),
    /// What every long-lived stream ends with when its gateway stops: the client is to reconnect
    /// (a watch from its cursor, an exec or logs from the offset it got to), to another gateway
    /// or to this one once it is back.
    #[error("the gateway is shutting down: reconnect, to another gateway or to this one once it is back")]
    ShuttingDown,
    /// What needs a sandbox's workspace on this host, asked of a gateway of another node than
    /// the one its run is placed on, by a way in that is not carried there.
    #[error("sandbox '{sandbox}' runs on node '{node}': its workspace is on that node's host, not this gateway's")]
    Elsewhere { sandbox: String, node: berth_core::NodeId },
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        let message = e.to_string();
        match e {
            ApiError::Core(e) => Status::new(code(e.code()), message),
            ApiError::Store(StoreError::Unavailable(_)) => Status::unavailable(message),
            // A record the store cannot read is damage or a bug, never an expected condition.
            ApiError::Store(StoreError::Corrupt(_)) => Status::internal(message),
            ApiError::Driver(berth_drivers::DriverError::Unavailable(_)) => Status::unavailable(message),
            ApiError::Driver(berth_drivers::DriverError::Failed(_)) => Status::failed_precondition(message),
            ApiError::ShuttingDown | ApiError::Elsewhere { .. } => Status::unavailable(message),
        }
    }
}

/// An error with its causes: its own text often says only that something failed (a TLS
/// handshake, a connection), its causes why.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(inner) = cause {
        message = format!("{message}: {inner}");
        cause = inner.source();
    }
    message
}

pub fn code(code: Code) -> tonic::Code {
    match code {
        Code::InvalidArgument => tonic::Code::InvalidArgument,
        Code::NotFound => tonic::Code::NotFound,
        Code::AlreadyExists => tonic::Code::AlreadyExists,
        Code::FailedPrecondition => tonic::Code::FailedPrecondition,
        Code::Aborted => tonic::Code::Aborted,
        Code::Unauthenticated => tonic::Code::Unauthenticated,
        Code::PermissionDenied => tonic::Code::PermissionDenied,
        Code::Unavailable => tonic::Code::Unavailable,
        Code::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        Code::Internal => tonic::Code::Internal,
        Code::ResourceExhausted => tonic::Code::ResourceExhausted,
    }
}
