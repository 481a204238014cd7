//! Resource limits (DESIGN 10): what a sandbox's run may use of CPU, memory and processes.
//!
//! The runtime enforces them (a container's cgroup, or the process driver's); Berth only checks
//! that they are sensible, and a driver that cannot enforce one refuses the spec at admission
//! ([`crate::Error::Unenforceable`]): a limit is never silently left unenforced.

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Each is `None` for no limit (the runtime's default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResourceLimits {
    /// CPU time per wall-clock time, in thousandths of a core: 1500 is one and a half cores.
    pub cpu_millis: Option<u64>,
    /// Memory, in bytes, swap included: a run that needs more is killed (OutOfMemory).
    pub memory_bytes: Option<u64>,
    /// Processes and threads together, the supervisor's included.
    pub pids: Option<u64>,
}

impl ResourceLimits {
    /// What a run killed for memory used more than (DESIGN 10), as its failure (or an exec's
    /// end) says it: its limit, or what the host had.
    pub fn memory_bound(&self) -> String {
        match self.memory_bytes {
            Some(bytes) => format!("its memory limit of {bytes} bytes"),
            None => "the memory the host had for it".to_string(),
        }
    }
}

/// The smallest CPU share a runtime schedules (a 1 ms quota per 100 ms period).
pub const MIN_CPU_MILLIS: u64 = 10;
pub const MAX_CPU_MILLIS: u64 = 1024 * 1000;
/// Below this the supervisor itself cannot run (Docker refuses less than 6 MiB).
pub const MIN_MEMORY_BYTES: u64 = 16 << 20;
pub const MAX_MEMORY_BYTES: u64 = 1 << 50;
/// The supervisor's own threads, the command and an exec or two.
pub const MIN_PIDS: u64 = 16;
/// The kernel's largest pid_max.
pub const MAX_PIDS: u64 = 1 << 22;

/// The CFS period a CPU share's quota is counted in, in microseconds (the kernel's default, and
/// what `docker run --cpus` and `podman run --cpus` use).
pub const CPU_PERIOD_US: u64 = 100_000;

/// The CPU time per [`CPU_PERIOD_US`] that `cpu_millis` thousandths of a core get.
pub fn cfs_quota_us(cpu_millis: u64) -> u64 {
    cpu_millis.saturating_mul(CPU_PERIOD_US / 1000)
}

/// Refuses a CPU share past the `cpus` of the host that would run it: Docker refuses one at
/// create, Podman and a cgroup of Berth's own would grant what the host has, and a limit is
/// never silently less than asked.
pub fn fit_host(limits: &ResourceLimits, cpus: u64, driver: &'static str) -> Result<(), Error> {
    match limits.cpu_millis {
        Some(millis) if millis > cpus.saturating_mul(1000) => Err(Error::Unenforceable {
            field: "spec.limits.cpu_millis".into(),
            driver,
            reason: format!("{millis} thousandths of a core is more than the host has ({cpus} CPUs)"),
        }),
        _ => Ok(()),
    }
}

impl ResourceLimits {
    pub fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }
}

/// Each limit within its bounds, named by its wire field.
pub fn validate(limits: &ResourceLimits) -> Result<(), Error> {
    let within = |field: &str, value: Option<u64>, min: u64, max: u64, unit: &str| match value {
        Some(v) if v < min || v > max => {
            Err(Error::invalid(field, format!("must be between {min} and {max} {unit}, got {v}")))
        }
        _ => Ok(()),
    };
    within("spec.limits.cpu_millis", limits.cpu_millis, MIN_CPU_MILLIS, MAX_CPU_MILLIS, "thousandths of a core")?;
    within("spec.limits.memory_bytes", limits.memory_bytes, MIN_MEMORY_BYTES, MAX_MEMORY_BYTES, "bytes")?;
    within("spec.limits.pids", limits.pids, MIN_PIDS, MAX_PIDS, "processes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(limits: ResourceLimits) -> Option<String> {
        match validate(&limits) {
            Ok(()) => None,
            Err(Error::Invalid { field, .. }) => Some(field),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn every_limit_admits_its_bounds_and_refuses_past_them() {
        let none = ResourceLimits::default();
        assert!(none.is_unlimited());
        assert_eq!(field(none), None);
        for (cpu, ok) in [(MIN_CPU_MILLIS, true), (MAX_CPU_MILLIS, true), (MIN_CPU_MILLIS - 1, false), (0, false)] {
            let limits = ResourceLimits { cpu_millis: Some(cpu), ..none };
            assert_eq!(field(limits).is_none(), ok, "cpu {cpu}");
        }
        assert_eq!(
            field(ResourceLimits { cpu_millis: Some(MAX_CPU_MILLIS + 1), ..none }).unwrap(),
            "spec.limits.cpu_millis"
        );
        for (bytes, ok) in
            [(MIN_MEMORY_BYTES, true), (MAX_MEMORY_BYTES, true), (MIN_MEMORY_BYTES - 1, false), (u64::MAX, false)]
        {
            let limits = ResourceLimits { memory_bytes: Some(bytes), ..none };
            assert_eq!(field(limits).is_none(), ok, "memory {bytes}");
        }
        assert_eq!(field(ResourceLimits { memory_bytes: Some(1), ..none }).unwrap(), "spec.limits.memory_bytes");
        for (pids, ok) in [(MIN_PIDS, true), (MAX_PIDS, true), (MIN_PIDS - 1, false), (MAX_PIDS + 1, false)] {
            let limits = ResourceLimits { pids: Some(pids), ..none };
            assert_eq!(field(limits).is_none(), ok, "pids {pids}");
        }
        assert_eq!(field(ResourceLimits { pids: Some(0), ..none }).unwrap(), "spec.limits.pids");
    }

    #[test]
    fn a_cpu_share_fits_a_host_up_to_all_of_its_cpus() {
        let cpu = |millis| ResourceLimits { cpu_millis: Some(millis), ..ResourceLimits::default() };
        assert_eq!(fit_host(&ResourceLimits::default(), 1, "docker"), Ok(()));
        assert_eq!(fit_host(&cpu(2000), 2, "docker"), Ok(()));
        match fit_host(&cpu(2001), 2, "podman") {
            Err(Error::Unenforceable { field, driver, reason }) => {
                assert_eq!((field.as_str(), driver), ("spec.limits.cpu_millis", "podman"));
                assert!(reason.contains("2001") && reason.contains("2 CPUs"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(cfs_quota_us(1500), 150_000);
        assert_eq!(cfs_quota_us(MIN_CPU_MILLIS), 1_000);
    }
}
