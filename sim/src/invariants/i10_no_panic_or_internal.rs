//! I10 (DESIGN 4): no panic; no INTERNAL for any expected condition. Checked on every reply a
//! client gets, and after every step of the simulation (a host that failed, a task that panicked).

use std::fmt::Display;

use tonic::{Code, Status};

/// The problem with a failed reply to `what`, if it is INTERNAL.
pub fn internal(what: &str, status: &Status) -> Option<String> {
    (status.code() == Code::Internal).then(|| format!("{what}: INTERNAL: {}", status.message()))
}

/// The problem with a host whose run ended in `error`.
pub fn host_failed(error: &dyn Display) -> String {
    format!("a host failed: {error}")
}

/// The problem with a panic, as the panic hook described it.
pub fn panicked(message: &str) -> String {
    format!("panic: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_fires_and_other_codes_are_quiet() {
        assert_eq!(internal("get sb1", &Status::internal("boom")).as_deref(), Some("get sb1: INTERNAL: boom"));
        assert_eq!(internal("get sb1", &Status::not_found("sb1")), None);
        assert_eq!(internal("create provider", &Status::unavailable("down")), None);
    }

    #[test]
    fn a_failed_host_and_a_panic_are_described() {
        assert_eq!(host_failed(&"gateway0 exited"), "a host failed: gateway0 exited");
        assert_eq!(panicked("oops at gateway/src/lib.rs:1:1"), "panic: oops at gateway/src/lib.rs:1:1");
    }
}
