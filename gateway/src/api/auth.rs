//! The public API's bearer token.

use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::{Request, Status};

/// Checks `authorization: Bearer <token>` on every public call. The token never appears in an
/// error, a log or a trace.
#[derive(Clone)]
pub struct BearerAuth {
    token: Arc<str>,
}

impl BearerAuth {
    pub fn new(token: &str) -> Self {
        Self { token: token.into() }
    }

    pub fn check<T>(&self, request: Request<T>) -> Result<Request<T>, Status> {
        let Some(value) = request.metadata().get("authorization") else {
            return Err(Status::unauthenticated("missing bearer token (metadata `authorization: Bearer <token>`)"));
        };
        match self.accepts(value.as_bytes()) {
            true => Ok(request),
            false => Err(Status::unauthenticated("invalid bearer token")),
        }
    }

    /// Whether an `authorization` header's value is `Bearer <the token>` (compared in constant
    /// time).
    pub fn accepts(&self, header: &[u8]) -> bool {
        let presented = header.strip_prefix(b"Bearer ").unwrap_or_default();
        bool::from(presented.ct_eq(self.token.as_bytes())) && !presented.is_empty()
    }
}
