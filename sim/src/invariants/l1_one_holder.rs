//! L1 (several gateways on one store): one gateway holds each lease at a time, and one
//! reconciles a node's runtime at a time. Checked on the store's side at each grant of the
//! reconcile lease and of the node's (terms never go back, a term has one holder, a new holder
//! only once the last one's lapsed or was released), and on the gateway's side at each poll and
//! watch of the runtime (only by the node lease's holder, within its time-to-live).

use std::collections::BTreeMap;

use super::{Checker, Fact, Found, Invariant};
use crate::gateway::LEASE_TTL;
use crate::world::micros;

/// The name the reconcile lease goes by in the facts.
pub const RECONCILE_LEASE: &str = "the reconcile lease";

/// The name node `node`'s lease goes by in the facts.
pub fn node_lease(node: &str) -> String {
    format!("node {node}'s lease")
}

/// What the store did with the reconcile lease: a grant (a take-over or a renewal) to
/// `holder`, or a release (`None`).
#[derive(Clone, Debug)]
pub struct Grant {
    pub t: u64,
    pub holder: Option<String>,
    pub term: u64,
}

/// L1's evidence: the store's last grant or release of each lease.
#[derive(Default)]
pub struct Lease {
    last: BTreeMap<String, Grant>,
}

impl Checker for Lease {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        match *fact {
            Fact::Lease { t, lease, holder, term, released } => {
                if released {
                    self.last.insert(lease.to_string(), Grant { t, holder: None, term });
                    return;
                }
                let last = self.last.insert(lease.to_string(), Grant { t, holder: Some(holder.to_string()), term });
                if !renews(last.as_ref(), holder, term) {
                    let problem = takeover_problem(last.as_ref(), holder, term, t);
                    found.extend(problem.map(|p| (Invariant::L1, format!("{lease}: {p}"))));
                }
            }
            Fact::Reconciling { t, gateway, node, what } => {
                let last = self.last.get(&node_lease(node));
                found.extend(reconciling_problem(last, gateway, what, t).map(|p| (Invariant::L1, p)));
            }
            _ => {}
        }
    }
}

/// Whether a grant of `term` to `holder` renews the `last` one.
pub fn renews(last: Option<&Grant>, holder: &str, term: u64) -> bool {
    last.is_some_and(|last| last.holder.as_deref() == Some(holder) && term == last.term)
}

/// The problem with a grant of `term` to `holder` at `t` that does not renew the `last` one.
pub fn takeover_problem(last: Option<&Grant>, holder: &str, term: u64, t: u64) -> Option<String> {
    let last = last?;
    if term <= last.term {
        Some(format!("the lease went from {:?} in term {} to {holder} in term {term}", last.holder, last.term))
    } else if last.holder.is_some() && t < last.t + micros(LEASE_TTL) {
        Some(format!(
            "{holder} took the lease in term {term} while {:?}'s term {}, renewed at {} us, had not lapsed",
            last.holder, last.term, last.t
        ))
    } else {
        None
    }
}

/// The problem with `gateway` reconciling (`what` it did) at `t`, unless the store's `last` grant
/// is its own and less than a time-to-live old.
pub fn reconciling_problem(last: Option<&Grant>, gateway: &str, what: &str, t: u64) -> Option<String> {
    let problem = match last {
        None => Some("no gateway ever held the lease".to_string()),
        Some(g) if g.holder.as_deref() != Some(gateway) => {
            Some(format!("the lease is {:?}'s (term {}) since {} us", g.holder, g.term, g.t))
        }
        Some(g) => (t >= g.t + micros(LEASE_TTL))
            .then(|| format!("its lease (term {}), last renewed at {} us, has lapsed", g.term, g.t)),
    };
    problem.map(|problem| format!("{gateway} ran reconcile ({what}) but {problem}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::NODE;

    const TTL: u64 = LEASE_TTL.as_micros() as u64;

    fn grant(t: u64, holder: Option<&str>, term: u64) -> Grant {
        Grant { t, holder: holder.map(str::to_string), term }
    }

    #[test]
    fn a_takeover_before_the_lease_lapsed_or_to_an_old_term_fires() {
        let held = grant(1_000, Some("gateway0"), 3);
        assert!(renews(Some(&held), "gateway0", 3));
        assert!(!renews(Some(&held), "gateway1", 3));
        assert_eq!(
            takeover_problem(Some(&held), "gateway1", 4, 1_000 + TTL - 1).as_deref(),
            Some(
                "gateway1 took the lease in term 4 while Some(\"gateway0\")'s term 3, renewed at 1000 us, had not lapsed"
            )
        );
        assert_eq!(
            takeover_problem(Some(&held), "gateway1", 3, 1_000 + TTL).as_deref(),
            Some("the lease went from Some(\"gateway0\") in term 3 to gateway1 in term 3")
        );
        assert_eq!(takeover_problem(Some(&held), "gateway1", 4, 1_000 + TTL), None);
        assert_eq!(takeover_problem(Some(&grant(1_000, None, 3)), "gateway1", 4, 1_001), None, "released");
        assert_eq!(takeover_problem(None, "gateway0", 1, 0), None);
    }

    #[test]
    fn the_checker_keeps_the_last_grant_and_judges_each_takeover_and_reconcile_by_it() {
        let node = node_lease(NODE);
        let lease = |t, holder, term, released| Fact::Lease { t, lease: &node, holder, term, released };
        let reconciling = |t, gateway| Fact::Reconciling { t, gateway, node: NODE, what: "list" };
        let found = crate::invariants::feed(
            &mut Lease::default(),
            &[
                reconciling(0, "gateway0"),
                lease(10, "gateway0", 1, false),
                reconciling(20, "gateway0"),
                lease(30, "gateway1", 2, false),
                lease(40, "gateway0", 2, true),
                lease(50, "gateway1", 3, false),
                reconciling(60, "gateway0"),
                reconciling(70, "gateway1"),
            ],
        );
        assert_eq!(
            found,
            [
                "L1: gateway0 ran reconcile (list) but no gateway ever held the lease",
                "L1: node sim-host's lease: gateway1 took the lease in term 2 while Some(\"gateway0\")'s term 1, renewed at 10 us, had not lapsed",
                "L1: gateway0 ran reconcile (list) but the lease is Some(\"gateway1\")'s (term 3) since 50 us",
            ]
        );
    }

    #[test]
    fn reconciling_without_a_live_lease_fires() {
        let held = grant(1_000, Some("gateway0"), 3);
        assert_eq!(reconciling_problem(Some(&held), "gateway0", "list", 1_000 + TTL - 1), None);
        assert_eq!(
            reconciling_problem(Some(&held), "gateway0", "list", 1_000 + TTL).as_deref(),
            Some("gateway0 ran reconcile (list) but its lease (term 3), last renewed at 1000 us, has lapsed")
        );
        assert_eq!(
            reconciling_problem(Some(&held), "gateway1", "watch", 1_001).as_deref(),
            Some("gateway1 ran reconcile (watch) but the lease is Some(\"gateway0\")'s (term 3) since 1000 us")
        );
        assert_eq!(
            reconciling_problem(None, "gateway1", "watch", 0).as_deref(),
            Some("gateway1 ran reconcile (watch) but no gateway ever held the lease")
        );
    }
}
