//! N1 (DESIGN 10, issue 18): the policy a run gets is the one committed with its generation,
//! and never more than the one in force. A connection the egress proxy opened for run `G` of a
//! sandbox must be allowed by a provider attached when `G` was committed and still attached at
//! some moment between the request and the connection, while `G` was the sandbox's current
//! generation. And the proxy is not stricter than that: a request refused while, for its whole
//! span, the provider was attached since `G`'s commit and `G` was current is a violation too.
//!
//! The model is the store's committed history of the sandbox ([`Version`]s), not the record's
//! own `egress_providers`: the rule is checked against what the API said, not against itself.

use std::collections::BTreeSet;

/// One committed version of a sandbox record, as far as egress is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// When the store committed it (simulated microseconds).
    pub t: u64,
    /// `None`: the record was removed.
    pub generation: Option<u64>,
    pub providers: BTreeSet<String>,
    /// Deleting: its providers may be deleted under it.
    pub deleting: bool,
}

/// One request a run made through the proxy, for `provider`'s endpoint.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    pub sandbox: &'a str,
    pub generation: u64,
    pub provider: &'a str,
    /// When the run asked, and when the connection arrived (or the refusal came back).
    pub asked: u64,
    pub answered: u64,
}

/// The versions current at some moment in `[from, to]`: the one current at `from`, and those
/// committed after it up to `to`.
fn during(history: &[Version], from: u64, to: u64) -> &[Version] {
    let first = history.iter().rposition(|v| v.t <= from).unwrap_or(0);
    let last = history.iter().rposition(|v| v.t <= to).map_or(0, |i| i + 1);
    &history[first..last.max(first)]
}

/// The providers attached as generation `g` was committed.
fn at_commit(history: &[Version], g: u64) -> Option<&BTreeSet<String>> {
    history.iter().find(|v| v.generation == Some(g)).map(|v| &v.providers)
}

/// The problem with a connection the proxy opened for `request`, if the policy did not allow it.
pub fn opened_outside_policy(history: &[Version], request: &Request) -> Option<String> {
    let Request { sandbox, generation, provider, asked, answered } = *request;
    let committed = match at_commit(history, generation) {
        Some(providers) => providers,
        None => return Some(format!("{sandbox}'s generation {generation}, never committed, reached {provider}")),
    };
    if !committed.contains(provider) {
        return Some(format!(
            "{sandbox}'s generation {generation} reached {provider}'s endpoint, not attached when that generation \
             was committed (attached then: {committed:?})"
        ));
    }
    let allowed = during(history, asked, answered)
        .iter()
        .any(|v| v.generation == Some(generation) && v.providers.contains(provider));
    (!allowed).then(|| {
        format!(
            "{sandbox}'s generation {generation} reached {provider}'s endpoint ({asked}..{answered} µs) while no \
             version current then had {provider} attached to that generation"
        )
    })
}

/// The problem with the proxy's refusal of `request`, if the policy allowed it throughout.
pub fn refused_within_policy(history: &[Version], request: &Request) -> Option<String> {
    let Request { sandbox, generation, provider, asked, answered } = *request;
    let committed = history.iter().position(|v| v.generation == Some(generation))?;
    if !history[committed].providers.contains(provider) {
        return None;
    }
    // Attached without a break from the generation's commit to the answer, the generation
    // current all the while, never Deleting.
    let span = during(history, asked, answered);
    let since_commit = history[committed..].iter().take_while(|v| v.t <= answered);
    let kept = since_commit
        .chain(span)
        .all(|v| v.generation == Some(generation) && v.providers.contains(provider) && !v.deleting);
    (kept && !span.is_empty()).then(|| {
        format!(
            "{sandbox}'s generation {generation} was refused {provider}'s endpoint ({asked}..{answered} µs), attached \
             since that generation was committed"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(t: u64, generation: u64, providers: &[&str]) -> Version {
        Version {
            t,
            generation: Some(generation),
            providers: providers.iter().map(|p| p.to_string()).collect(),
            deleting: false,
        }
    }

    fn request(generation: u64, asked: u64, answered: u64) -> Request<'static> {
        Request { sandbox: "sb0", generation, provider: "p0", asked, answered }
    }

    #[test]
    fn an_attach_widens_only_the_next_generation() {
        // Generation 1 without p0; p0 attached at 20; generation 2 at 40.
        let history = [v(0, 1, &[]), v(20, 1, &["p0"]), v(40, 2, &["p0"])];
        assert!(opened_outside_policy(&history, &request(1, 25, 30)).unwrap().contains("not attached when"));
        assert_eq!(opened_outside_policy(&history, &request(2, 45, 50)), None);
        assert!(opened_outside_policy(&history, &request(3, 45, 50)).unwrap().contains("never committed"));
        // Refusing generation 1 is right; refusing generation 2 while it holds p0 is not.
        assert_eq!(refused_within_policy(&history, &request(1, 25, 30)), None);
        assert!(refused_within_policy(&history, &request(2, 45, 50)).is_some());
    }

    #[test]
    fn a_detach_closes_at_once_and_a_connection_decided_before_it_stands() {
        // p0 attached at generation 1's commit, detached at 30.
        let history = [v(0, 1, &["p0"]), v(30, 1, &[])];
        assert_eq!(opened_outside_policy(&history, &request(1, 10, 20)), None);
        assert_eq!(opened_outside_policy(&history, &request(1, 25, 35)), None, "decided before the detach");
        assert!(opened_outside_policy(&history, &request(1, 31, 40)).unwrap().contains("no version current"));
        assert_eq!(refused_within_policy(&history, &request(1, 25, 35)), None, "either answer is right");
        assert!(refused_within_policy(&history, &request(1, 10, 20)).is_some());
        // Detached and attached again: closed until the next start, so a refusal is right.
        let again = [v(0, 1, &["p0"]), v(30, 1, &[]), v(40, 1, &["p0"])];
        assert_eq!(refused_within_policy(&again, &request(1, 45, 50)), None);
        assert_eq!(opened_outside_policy(&again, &request(1, 45, 50)), None, "allowed by the model, stricter is fine");
    }

    #[test]
    fn a_run_replaced_or_removed_reaches_nothing() {
        let history = [
            v(0, 1, &["p0"]),
            v(30, 2, &["p0"]),
            Version { t: 50, generation: None, providers: BTreeSet::new(), deleting: true },
        ];
        assert!(opened_outside_policy(&history, &request(1, 35, 40)).is_some(), "generation 1 was replaced");
        assert!(opened_outside_policy(&history, &request(2, 55, 60)).is_some(), "the record is gone");
        assert_eq!(refused_within_policy(&history, &request(2, 45, 55)), None);
    }
}
