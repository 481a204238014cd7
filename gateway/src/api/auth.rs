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
        let presented = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).unwrap_or_default();
        if bool::from(presented.as_bytes().ct_eq(self.token.as_bytes())) && !presented.is_empty() {
            Ok(request)
        } else {
            Err(Status::unauthenticated("invalid bearer token"))
        }
    }
}
