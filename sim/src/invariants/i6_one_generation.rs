//! I6 (DESIGN 4): at most one generation authenticates per sandbox; after the rotating write is
//! acknowledged an older token never succeeds. Checked on each supervisor's answer against the
//! sandbox's committed generations.

use berth_core::SandboxId;
use tonic::Code;

/// A supervisor's session as I6 judges its answer.
pub struct Session<'a> {
    pub sandbox: &'a SandboxId,
    /// The generation its token carries.
    pub generation: u64,
    /// When it said hello, and when it was answered (simulated microseconds).
    pub sent: u64,
    pub answered: u64,
    /// The sandbox's committed generations, `(t, generation)` in commit order.
    pub generations: &'a [(u64, u64)],
}

/// The problem with accepting `session`, unless its generation was the committed one at some
/// moment between its hello and the answer.
pub fn accepted(session: &Session) -> Option<String> {
    let Session { generation, sent, answered, generations, .. } = *session;
    // The generation in force at the hello, and every one committed until the answer.
    let at_hello = generations.iter().rev().find(|(t, _)| *t <= sent).map(|(_, g)| *g);
    let current = at_hello == Some(generation)
        || generations.iter().any(|(t, g)| *t >= sent && *t <= answered && *g == generation);
    (!current).then(|| {
        format!("{} generation {generation} was accepted while another generation was current", session.sandbox)
    })
}

/// The problem with refusing `session` with `code`: PERMISSION_DENIED is right only once a newer
/// generation was committed, and a token the gateway issued is always recognised.
pub fn rejected(session: &Session, code: Code) -> Option<String> {
    let superseded = session.generations.iter().any(|(t, g)| *t <= session.answered && *g > session.generation);
    match code {
        Code::PermissionDenied if !superseded => Some(format!(
            "the supervisor of {} generation {} was rejected, but no newer generation was ever committed (hello sent at {} us): the runtime runs an identity the record does not hold",
            session.sandbox, session.generation, session.sent
        )),
        Code::Unauthenticated => Some(format!("a token the gateway issued for {} was not recognised", session.sandbox)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generation 1 committed at 10 us, generation 2 at 50 us.
    const ROTATED: &[(u64, u64)] = &[(10, 1), (50, 2)];

    fn session(sandbox: &SandboxId, generation: u64, sent: u64, answered: u64) -> Session<'_> {
        Session { sandbox, generation, sent, answered, generations: ROTATED }
    }

    #[test]
    fn an_older_generation_accepted_after_the_rotation_fires() {
        let id = SandboxId::new("abc");
        assert_eq!(
            accepted(&session(&id, 1, 60, 70)).as_deref(),
            Some("abc generation 1 was accepted while another generation was current")
        );
        assert_eq!(accepted(&session(&id, 1, 40, 70)), None, "current when it said hello");
        assert_eq!(accepted(&session(&id, 2, 40, 70)), None, "committed while it waited");
        assert_eq!(
            accepted(&session(&id, 2, 40, 45)).as_deref(),
            Some("abc generation 2 was accepted while another generation was current"),
            "not yet committed when accepted"
        );
    }

    #[test]
    fn a_refusal_needs_a_newer_generation() {
        let id = SandboxId::new("abc");
        assert_eq!(rejected(&session(&id, 1, 60, 70), Code::PermissionDenied), None);
        assert_eq!(
            rejected(&session(&id, 1, 20, 30), Code::PermissionDenied).as_deref(),
            Some(
                "the supervisor of abc generation 1 was rejected, but no newer generation was ever committed (hello sent at 20 us): the runtime runs an identity the record does not hold"
            ),
            "generation 2 was committed only after the refusal"
        );
        assert_eq!(
            rejected(&session(&id, 2, 60, 70), Code::Unauthenticated).as_deref(),
            Some("a token the gateway issued for abc was not recognised")
        );
        assert_eq!(rejected(&session(&id, 2, 60, 70), Code::Unavailable), None);
    }
}
