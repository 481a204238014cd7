//! The gateway's wall clock, as a seam: production reads the system clock, the simulator
//! supplies simulated time. Durations and sleeps go through `tokio::time`, which the simulator
//! controls as well.

use berth_core::Timestamp;

pub trait Clock: Send + Sync + 'static {
    /// Now, on the gateway's wall clock (record `created_at` and `updated_at`).
    fn now(&self) -> Timestamp;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timestamp::from_unix_nanos(i64::try_from(since.as_nanos()).unwrap_or(i64::MAX))
    }
}
