//! I3 (DESIGN 4): server-owned operations never fail because of a transient version conflict.
//! Checked on every reply: a command the client sent without a version (the server owns its
//! read-modify-write) must not come back ABORTED or "under contention".

use tonic::{Code, Status};

/// The problem with a failed reply to `what` (sent with `expected`), if it failed on a conflict
/// the server should have retried.
pub fn failed_on_conflict(what: &str, expected: Option<u64>, status: &Status) -> Option<String> {
    let conflict = status.code() == Code::Aborted || status.message().contains("under contention");
    (expected.is_none() && conflict)
        .then(|| format!("a server-owned {what} failed on a conflict: {}", status.message()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflict_without_a_version_fires() {
        assert_eq!(
            failed_on_conflict("stop of sb1", None, &Status::aborted("version moved")).as_deref(),
            Some("a server-owned stop of sb1 failed on a conflict: version moved")
        );
        assert_eq!(
            failed_on_conflict("delete provider", None, &Status::unavailable("sb1 is under contention")).as_deref(),
            Some("a server-owned delete provider failed on a conflict: sb1 is under contention")
        );
    }

    #[test]
    fn a_stale_version_or_another_failure_is_quiet() {
        assert_eq!(failed_on_conflict("stop of sb1", Some(3), &Status::aborted("current 4")), None);
        assert_eq!(failed_on_conflict("stop of sb1", None, &Status::not_found("sb1")), None);
    }
}
