//! The reconcile lease's tenure (DESIGN 3.6): how long a holder may rely on a grant, and when
//! it asks again. The gateway's lease keeper runs these rules on its own monotonic clock; the
//! times here are offsets on that clock.
//!
//! The store counts a grant's time-to-live from when it granted, which is after the holder
//! asked: counting from the request is always on the safe side, while counting from the answer
//! would trust a reply the store held back (L1). A tenth of the time-to-live is kept back for
//! clocks that run at slightly different rates.

use core::time::Duration;

/// Until when a grant asked for at `asked` (and answered at `answered`) may be relied on.
pub fn relied_until(asked: Duration, answered: Duration, ttl: Duration) -> Duration {
    let asked = if crate::bug!(TenureFromAnswer) { answered } else { asked };
    asked + ttl - ttl / 10
}

/// Whether a grant answered at `answered` can be relied on at all: an answer that arrives after
/// the tenure it would give has ended gives none.
pub fn reliable(asked: Duration, answered: Duration, ttl: Duration) -> bool {
    answered < relied_until(asked, answered, ttl)
}

/// When to ask again, at `now`: a third of the way into a time-to-live, or sooner if the
/// tenure held ends before that.
pub fn next_ask(now: Duration, ttl: Duration, tenure_until: Option<Duration>) -> Duration {
    let renew = now + ttl / 3;
    tenure_until.map_or(renew, |until| renew.min(until))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn a_grant_is_relied_on_for_nine_tenths_of_a_ttl_from_its_request() {
        assert_eq!(relied_until(s(100.0), s(100.5), TTL), s(109.0));
        assert!(reliable(s(100.0), s(108.9), TTL));
        assert!(!reliable(s(100.0), s(109.0), TTL), "an answer as late as the tenure gives none");
    }

    #[test]
    fn the_holder_asks_again_a_third_in_or_when_its_tenure_ends() {
        assert_eq!(next_ask(s(100.0), TTL, None), s(100.0) + TTL / 3);
        assert_eq!(next_ask(s(100.0), TTL, Some(s(109.0))), s(100.0) + TTL / 3);
        assert_eq!(next_ask(s(100.0), TTL, Some(s(101.0))), s(101.0));
    }
}
