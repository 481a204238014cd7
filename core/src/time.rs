//! Time as the rules see it: always an argument, never read from a clock here.

use serde::{Deserialize, Serialize};

/// A point in time, in nanoseconds since the Unix epoch.
///
/// Two clocks use this type and are never compared with each other: the gateway's wall clock
/// (`created_at`, `updated_at`, supplied as an input) and the runtime's own clock (run start and
/// finish times, which fence stale exits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub const fn from_unix_nanos(nanos: i64) -> Self {
        Self(nanos)
    }
    pub const fn from_unix_millis(millis: i64) -> Self {
        Self(millis.saturating_mul(1_000_000))
    }
    pub const fn unix_nanos(self) -> i64 {
        self.0
    }
    pub const fn unix_millis(self) -> i64 {
        self.0.div_euclid(1_000_000)
    }
    /// `self + d`, saturating.
    pub fn plus(self, d: core::time::Duration) -> Self {
        Self(self.0.saturating_add(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)))
    }
    /// How long after `earlier` this is; zero if it is not after it.
    pub fn since(self, earlier: Timestamp) -> core::time::Duration {
        core::time::Duration::from_nanos(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_convert_to_milliseconds_rounding_down() {
        assert_eq!(Timestamp::from_unix_millis(1_700_000_000_123).unix_millis(), 1_700_000_000_123);
        assert_eq!(Timestamp::from_unix_nanos(1_999_999).unix_millis(), 1);
        // Before 1970, down is further into the past, not towards zero.
        assert_eq!(Timestamp::from_unix_nanos(-1).unix_millis(), -1);
        let t = Timestamp::from_unix_millis(5);
        assert_eq!(t.plus(core::time::Duration::from_millis(2)).since(t), core::time::Duration::from_millis(2));
        assert_eq!(t.since(t.plus(core::time::Duration::from_millis(2))), core::time::Duration::ZERO);
    }
}
