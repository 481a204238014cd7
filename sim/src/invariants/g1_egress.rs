//! G1 (DESIGN 10, issue 18): the policy a run gets is the one committed with its generation,
//! and never more than the one in force. A connection the egress proxy opened for run `G` of a
//! sandbox must be allowed by a provider attached when `G` was committed and still attached at
//! some moment between the request and the connection, while `G` was the sandbox's current
//! generation. And the proxy is not stricter than that: a request refused while, for its whole
//! span, the provider was attached since `G`'s commit and `G` was current is a violation too.
//!
//! The model is the store's committed history of the sandbox ([`Version`]s), not the record's
//! own `egress_providers`, and the rules are read here ([`allows`]), not by berth-core's
//! allow-list: the proxy is checked against what the API said, not against itself.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use berth_core::{Intent, Sandbox, SandboxId};

use super::{Checker, Fact, Found, Invariant};

/// G1's evidence: the store's committed history of each sandbox, kept only where what G1 looks
/// at changed, and each provider's rules as its create asked for them.
pub struct Egress {
    versions: BTreeMap<SandboxId, Vec<Version>>,
    endpoints: fn(&str) -> Vec<String>,
}

impl Egress {
    pub fn new(endpoints: fn(&str) -> Vec<String>) -> Self {
        Self { versions: BTreeMap::new(), endpoints }
    }

    fn commit(&mut self, t: u64, id: &SandboxId, after: Option<&Sandbox>) {
        let generation = after.map(|s| s.generation);
        let deleting = after.is_none_or(|s| s.intent == Intent::Deleted);
        let no_providers = BTreeSet::new();
        let providers = after.map_or(&no_providers, |s| &*s.providers);
        let history = self.versions.entry(id.clone()).or_default();
        let same =
            |last: &Version| (last.generation, &last.providers, last.deleting) == (generation, providers, deleting);
        if !history.last().is_some_and(same) {
            history.push(Version { t, generation, providers: providers.clone(), deleting });
        }
    }
}

impl Checker for Egress {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        match fact {
            Fact::Sandbox { t, before, after, .. } => {
                if let Some(id) = after.or(*before).map(|s| s.id.clone()) {
                    self.commit(*t, &id, *after);
                }
            }
            Fact::Egress { opened, request } => {
                let history = self.versions.get(&SandboxId::new(request.sandbox)).map_or(&[][..], Vec::as_slice);
                let problem = if *opened {
                    opened_outside_policy(history, request, self.endpoints)
                } else {
                    refused_within_policy(history, request, self.endpoints)
                };
                found.extend(problem.map(|p| (Invariant::G1, p)));
            }
            _ => {}
        }
    }
}

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
    /// What the run asked for: a name or an address.
    pub destination: &'a str,
    /// Where the connection went, or where the destination resolves (`None`: nowhere).
    pub addr: Option<IpAddr>,
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

/// Whether `rule`, as a provider's endpoints hold it, lets a connection asked for
/// `destination` go to `addr` (DESIGN 10), read here apart from berth-core's allow-list so that
/// the two are compared: a name matches in any case, and a name with a trailing dot is no host
/// name; `*.suffix` matches the names below the suffix, not the suffix itself nor a name that
/// only ends in its text; a block matches the address the connection goes to, whatever was
/// asked for; and no name takes a run to a loopback address (the proxy's own host).
pub fn allows(rule: &str, destination: &str, addr: Option<IpAddr>) -> bool {
    if let Some((net, len)) = rule.split_once('/') {
        let (Ok(net), Ok(len), Some(IpAddr::V4(addr))) = (net.parse::<Ipv4Addr>(), len.parse::<u32>(), addr) else {
            return false;
        };
        let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
        return u32::from(addr) & mask == u32::from(net) & mask;
    }
    let name = destination.to_ascii_lowercase();
    if name.ends_with('.') || name.parse::<IpAddr>().is_ok() || addr.is_some_and(|a| a.is_loopback()) {
        return false;
    }
    match rule.strip_prefix("*.") {
        Some(suffix) => name.strip_suffix(suffix).is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => name == rule,
    }
}

/// Of `providers`, those whose endpoints (`endpoints` gives each one's rules) allow `request`.
fn allowing<'a>(
    providers: &'a BTreeSet<String>,
    request: &Request,
    endpoints: impl Fn(&str) -> Vec<String>,
) -> Vec<&'a String> {
    let allowed = |p: &&String| endpoints(p).iter().any(|rule| allows(rule, request.destination, request.addr));
    providers.iter().filter(allowed).collect()
}

/// The problem with a connection the proxy opened for `request`, if the policy did not allow it.
pub fn opened_outside_policy(
    history: &[Version],
    request: &Request,
    endpoints: impl Fn(&str) -> Vec<String>,
) -> Option<String> {
    let Request { sandbox, generation, destination, addr, asked, answered } = *request;
    let committed = match at_commit(history, generation) {
        Some(providers) => providers,
        None => return Some(format!("{sandbox}'s generation {generation}, never committed, reached {destination}")),
    };
    let candidates = allowing(committed, request, endpoints);
    if candidates.is_empty() {
        return Some(format!(
            "{sandbox}'s generation {generation} reached {destination} ({addr:?}), which no provider attached when \
             that generation was committed allows (attached then: {committed:?})"
        ));
    }
    let allowed = during(history, asked, answered)
        .iter()
        .any(|v| v.generation == Some(generation) && candidates.iter().any(|p| v.providers.contains(*p)));
    (!allowed).then(|| {
        format!(
            "{sandbox}'s generation {generation} reached {destination} ({asked}..{answered} µs) while no version \
             current then had a provider allowing it ({candidates:?}) attached to that generation"
        )
    })
}

/// The problem with the proxy's refusal of `request`, if the policy allowed it throughout.
pub fn refused_within_policy(
    history: &[Version],
    request: &Request,
    endpoints: impl Fn(&str) -> Vec<String>,
) -> Option<String> {
    let Request { sandbox, generation, destination, asked, answered, .. } = *request;
    let committed = history.iter().position(|v| v.generation == Some(generation))?;
    let span = during(history, asked, answered);
    // Attached without a break from the generation's commit to the answer, the generation
    // current all the while, never Deleting.
    let kept = |provider: &String| {
        let since_commit = history[committed..].iter().take_while(|v| v.t <= answered);
        since_commit
            .chain(span)
            .all(|v| v.generation == Some(generation) && v.providers.contains(provider) && !v.deleting)
    };
    let kept_by = allowing(&history[committed].providers, request, endpoints).into_iter().find(|p| kept(p))?;
    (!span.is_empty()).then(|| {
        format!(
            "{sandbox}'s generation {generation} was refused {destination} ({asked}..{answered} µs), which {kept_by} \
             allows, attached since that generation was committed"
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
        let addr = Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
        Request { sandbox: "sb0", generation, destination: "p0.test", addr, asked, answered }
    }

    fn endpoints(provider: &str) -> Vec<String> {
        vec![format!("{provider}.test")]
    }

    fn opened(history: &[Version], request: &Request) -> Option<String> {
        opened_outside_policy(history, request, endpoints)
    }

    fn refused(history: &[Version], request: &Request) -> Option<String> {
        refused_within_policy(history, request, endpoints)
    }

    #[test]
    fn the_checker_judges_each_request_against_the_writes_it_was_fed() {
        use berth_core::Phase;

        use crate::invariants::{feed, sandbox, write};
        let mut ready = sandbox("sb0", Intent::Running, Phase::Ready, 1);
        ready.providers = std::sync::Arc::new(["p0".to_string()].into());
        let mut detached = ready.clone();
        detached.providers = Default::default();
        let id = ready.id.to_string();
        // Written at 1 s, p0 detached at 3 s; requests in between and after.
        let ask = |asked: u64, destination| Request {
            sandbox: &id,
            generation: 1,
            destination,
            addr: Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))),
            asked: asked * 1_000_000,
            answered: asked * 1_000_000 + 1_000,
        };
        let (inside, after, other) = (ask(2, "p0.test"), ask(4, "p0.test"), ask(2, "xp0.test"));
        let found = feed(
            &mut Egress::new(endpoints),
            &[
                write(1, None, Some(&ready)),
                Fact::Egress { opened: true, request: &inside },
                Fact::Egress { opened: false, request: &other },
                Fact::Egress { opened: false, request: &inside },
                write(3, Some(&ready), Some(&detached)),
                Fact::Egress { opened: true, request: &after },
                Fact::Egress { opened: false, request: &after },
            ],
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("G1: ") && found[0].contains("was refused p0.test"), "{found:?}");
        assert!(found[1].contains("reached p0.test") && found[1].contains("no version current"), "{found:?}");
    }

    #[test]
    fn rules_are_read_to_their_edges() {
        let at = |a: &str| Some(a.parse::<IpAddr>().unwrap());
        let far = at("192.0.2.9");
        assert!(allows("p0.test", "P0.Test", far), "names compare in any case");
        assert!(!allows("p0.test", "p0.test.", far), "a trailing dot is no host name");
        assert!(allows("*.p0.test", "api.p0.test", far) && allows("*.p0.test", "a.b.p0.test", far));
        assert!(!allows("*.p0.test", "p0.test", far), "a suffix is not its own name");
        assert!(!allows("*.p0.test", "xp0.test", far), "the suffix's text without its dot");
        assert!(!allows("*.p0.test", "lo.p0.test", at("127.0.0.1")), "a name never reaches loopback");
        assert!(allows("10.1.2.4/30", "in-p0.test", at("10.1.2.5")), "a block allows where a name goes");
        for (addr, inside) in [("10.1.2.3", false), ("10.1.2.4", true), ("10.1.2.7", true), ("10.1.2.8", false)] {
            assert_eq!(allows("10.1.2.4/30", addr, at(addr)), inside, "{addr}");
            assert!(!allows("10.1.2.4", addr, at(addr)), "a name rule never matches an address");
        }
        assert!(allows("0.0.0.0/0", "anything.test", far));
    }

    #[test]
    fn a_destination_no_attached_provider_allows_is_never_reached_and_may_be_refused() {
        let history = [v(0, 1, &["p0"])];
        let other = Request { destination: "xp0.test", ..request(1, 10, 20) };
        assert!(opened(&history, &other).unwrap().contains("which no provider attached"));
        assert_eq!(refused(&history, &other), None);
        assert!(refused(&history, &request(1, 10, 20)).unwrap().contains("which p0 allows"));
    }

    #[test]
    fn an_attach_widens_only_the_next_generation() {
        // Generation 1 without p0; p0 attached at 20; generation 2 at 40.
        let history = [v(0, 1, &[]), v(20, 1, &["p0"]), v(40, 2, &["p0"])];
        assert!(opened(&history, &request(1, 25, 30)).unwrap().contains("which no provider attached"));
        assert_eq!(opened(&history, &request(2, 45, 50)), None);
        assert!(opened(&history, &request(3, 45, 50)).unwrap().contains("never committed"));
        // Refusing generation 1 is right; refusing generation 2 while it holds p0 is not.
        assert_eq!(refused(&history, &request(1, 25, 30)), None);
        assert!(refused(&history, &request(2, 45, 50)).is_some());
    }

    #[test]
    fn a_detach_closes_at_once_and_a_connection_decided_before_it_stands() {
        // p0 attached at generation 1's commit, detached at 30.
        let history = [v(0, 1, &["p0"]), v(30, 1, &[])];
        assert_eq!(opened(&history, &request(1, 10, 20)), None);
        assert_eq!(opened(&history, &request(1, 25, 35)), None, "decided before the detach");
        assert!(opened(&history, &request(1, 31, 40)).unwrap().contains("no version current"));
        assert_eq!(refused(&history, &request(1, 25, 35)), None, "either answer is right");
        assert!(refused(&history, &request(1, 10, 20)).is_some());
        // Detached and attached again: closed until the next start, so a refusal is right.
        let again = [v(0, 1, &["p0"]), v(30, 1, &[]), v(40, 1, &["p0"])];
        assert_eq!(refused(&again, &request(1, 45, 50)), None);
        assert_eq!(opened(&again, &request(1, 45, 50)), None, "allowed by the model, stricter is fine");
    }

    #[test]
    fn a_run_replaced_or_removed_reaches_nothing() {
        let history = [
            v(0, 1, &["p0"]),
            v(30, 2, &["p0"]),
            Version { t: 50, generation: None, providers: BTreeSet::new(), deleting: true },
        ];
        assert!(opened(&history, &request(1, 35, 40)).is_some(), "generation 1 was replaced");
        assert!(opened(&history, &request(2, 55, 60)).is_some(), "the record is gone");
        assert_eq!(refused(&history, &request(2, 45, 55)), None);
    }
}
