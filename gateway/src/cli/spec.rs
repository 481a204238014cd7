//! Arguments several commands take: a sandbox's spec and policies, waiting, versions.

use std::time::Duration;

use berth_proto::v1 as pb;
use clap::{Args, ValueEnum};

use super::client::Failed;

#[derive(Args)]
pub(super) struct Wait {
    /// Return once the gateway accepted the command, without waiting for the target phase.
    #[arg(long)]
    pub(super) no_wait: bool,
    /// Give up waiting after this long.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub(super) timeout: Duration,
}

impl Wait {
    /// Waits until `read` finds `kind` `name` gone (NOT_FOUND).
    pub(super) async fn until_gone<T, Read>(
        &self,
        kind: &str,
        name: &str,
        mut read: impl FnMut() -> Read,
    ) -> Result<(), Failed>
    where
        Read: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let until = tokio::time::Instant::now() + self.timeout;
        loop {
            match read().await {
                Err(s) if s.code() == tonic::Code::NotFound => return Ok(()),
                Err(s) => return Err(s.into()),
                Ok(_) if tokio::time::Instant::now() >= until => {
                    return Err(Failed(format!(
                        "timed out after {:?} waiting for {kind} '{name}' to go",
                        self.timeout
                    )));
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// What a sandbox runs, and its policies: for a sandbox or a template.
#[derive(Args)]
pub(super) struct SpecArgs {
    /// The image to run (the process driver runs COMMAND on this host and ignores it).
    /// [default: the gateway's, `host`]
    #[arg(long)]
    image: Option<String>,
    /// An environment variable, KEY=VALUE (repeatable).
    #[arg(long = "env", short, value_parser = pair)]
    env: Vec<(String, String)>,
    /// A label, KEY=VALUE (repeatable).
    #[arg(long = "label", short, value_parser = pair)]
    labels: Vec<(String, String)>,
    #[command(flatten)]
    lifetime: LifetimeArgs,
    #[command(flatten)]
    restart: RestartArgs,
    #[command(flatten)]
    limits: LimitArgs,
    /// Where its runs may connect, through Berth's egress proxy: a host name, `*.suffix` or a
    /// CIDR block (repeatable). Without one, nowhere.
    #[arg(long = "allow")]
    allow: Vec<String>,
    /// A volume its runs see, NAME:/path or NAME:/path:ro (repeatable). The volume must exist
    /// (`berth volume create`).
    #[arg(long = "volume", value_parser = mount)]
    volumes: Vec<pb::VolumeMount>,
    /// A port the preview proxy serves without a token, PORT:public (repeatable). Every other
    /// port is reached with its URL's token (`berth sandbox url`).
    #[arg(long = "port", value_parser = port_spec)]
    ports: Vec<pb::PortSpec>,
    /// A label its node must have, KEY=VALUE (repeatable): it runs only on nodes registered
    /// with every one (`berth-gateway --node-label`).
    #[arg(long = "node-selector", value_parser = pair)]
    node_selector: Vec<(String, String)>,
}

/// `--port PORT:public`.
fn port_spec(s: &str) -> Result<pb::PortSpec, String> {
    let bad = || format!("{s:?} is not PORT:public (a private port needs no flag)");
    let (port, "public") = s.split_once(':').ok_or_else(bad)? else { return Err(bad()) };
    let port: u16 = port.parse().ok().filter(|p| *p != 0).ok_or_else(bad)?;
    Ok(pb::PortSpec { port: port.into(), public: true })
}

/// `--volume NAME:/path[:ro]`.
fn mount(s: &str) -> Result<pb::VolumeMount, String> {
    let bad = || format!("{s:?} is not NAME:/path or NAME:/path:ro");
    let (volume, rest) = s.split_once(':').ok_or_else(bad)?;
    let (path, read_only) = match rest.rsplit_once(':') {
        Some((path, "ro")) => (path, true),
        Some((path, "rw")) => (path, false),
        _ => (rest, false),
    };
    if volume.is_empty() || path.is_empty() {
        return Err(bad());
    }
    Ok(pb::VolumeMount { volume: volume.to_string(), path: path.to_string(), read_only })
}

/// What the run may use; the runtime enforces it.
#[derive(Args)]
struct LimitArgs {
    /// CPU cores, fractional (0.5, 1.5): the CPU time it gets per wall-clock time.
    #[arg(long, value_parser = cpus)]
    cpus: Option<i64>,
    /// Memory, swap included: bytes, or with a suffix (512Mi, 2G). A run needing more is killed
    /// and ends in Error OutOfMemory.
    #[arg(long, value_parser = bytes)]
    memory: Option<i64>,
    /// Processes and threads together, the supervisor's few included.
    #[arg(long)]
    pids: Option<i64>,
}

impl LimitArgs {
    fn wire(&self) -> Option<pb::ResourceLimits> {
        let limits = pb::ResourceLimits { cpu_millis: self.cpus, memory_bytes: self.memory, pids: self.pids };
        (limits != pb::ResourceLimits::default()).then_some(limits)
    }
}

/// `--cpus` in thousandths of a core.
fn cpus(s: &str) -> Result<i64, String> {
    match s.parse::<f64>() {
        Ok(cores) if cores.is_finite() && cores > 0.0 => Ok((cores * 1000.0).round() as i64),
        _ => Err(format!("{s:?} is not a positive number of cores")),
    }
}

/// A byte count: a number with an optional suffix, k M G T (powers of 1000) or Ki Mi Gi Ti
/// (of 1024), with or without a trailing B.
fn bytes(s: &str) -> Result<i64, String> {
    let bad = || format!("{s:?} is not a size: a number of bytes, or with a suffix (512Mi, 2G)");
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let number: i64 = s[..digits].parse().map_err(|_| bad())?;
    let suffix = s[digits..].trim().trim_end_matches(['B', 'b']);
    let scale: i64 = match suffix {
        "" => 1,
        "k" | "K" => 1000,
        "Ki" => 1 << 10,
        "M" => 1000 * 1000,
        "Mi" => 1 << 20,
        "G" => 1000 * 1000 * 1000,
        "Gi" => 1 << 30,
        "T" => 1000 * 1000 * 1000 * 1000,
        "Ti" => 1 << 40,
        _ => return Err(bad()),
    };
    number.checked_mul(scale).ok_or_else(bad)
}

impl SpecArgs {
    /// The labels alone (a sandbox made from a snapshot takes the rest of its spec).
    pub(super) fn labels(self: Box<Self>) -> std::collections::BTreeMap<String, String> {
        self.labels.into_iter().collect()
    }

    pub(super) fn wire(self: Box<Self>, command: Vec<String>) -> pb::SandboxSpec {
        pb::SandboxSpec {
            image: self.image.unwrap_or_default(),
            command,
            env: self.env.into_iter().collect(),
            labels: self.labels.into_iter().collect(),
            lifetime: Some(self.lifetime.wire()),
            restart: Some(self.restart.wire()),
            limits: self.limits.wire(),
            egress: (!self.allow.is_empty()).then_some(pb::EgressPolicy { allow: self.allow }),
            volumes: self.volumes,
            ports: self.ports,
            node_selector: self.node_selector.into_iter().collect(),
        }
    }
}

#[derive(Args)]
struct LifetimeArgs {
    /// The deadline is this long after the create (a pool member's: after its claim), and
    /// after every renew and start.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// While it is meant to run, expire it after this long without activity (no exec, attach
    /// or logs follow; an open exec holds it off). Counted from the create (a pool member's:
    /// its claim) and every start.
    #[arg(long, value_parser = humantime::parse_duration)]
    idle_timeout: Option<Duration>,
    /// What the deadline does when it passes, and the idle timeout unless --on-idle says:
    /// stop (workspace kept), delete, or pause (memory kept; a resume thaws it).
    #[arg(long, value_enum, default_value_t = OnExpiryArg::Stop)]
    on_expiry: OnExpiryArg,
    /// What the idle timeout does when it passes. [default: as --on-expiry]
    #[arg(long, value_enum, requires = "idle_timeout")]
    on_idle: Option<OnExpiryArg>,
}

#[derive(Clone, Copy, ValueEnum)]
enum OnExpiryArg {
    Stop,
    Delete,
    Pause,
}

impl OnExpiryArg {
    fn wire(self) -> i32 {
        let action = match self {
            OnExpiryArg::Stop => pb::OnExpiry::Stop,
            OnExpiryArg::Delete => pb::OnExpiry::Delete,
            OnExpiryArg::Pause => pb::OnExpiry::Pause,
        };
        action as i32
    }
}

#[derive(Args)]
struct RestartArgs {
    /// Start a new generation when the run ends by itself: never, on a failure, or always.
    #[arg(long, value_enum, default_value_t = RestartArg::Never)]
    restart: RestartArg,
    /// The most restarts since the last create or start; then it stays ended with the count.
    #[arg(long, requires = "restart")]
    max_restarts: Option<u32>,
    /// The wait before the first restart; it doubles with each one. [default: 1s]
    #[arg(long, value_parser = humantime::parse_duration)]
    restart_backoff: Option<Duration>,
    /// The longest wait between restarts. [default: 5m]
    #[arg(long, value_parser = humantime::parse_duration)]
    restart_max_backoff: Option<Duration>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RestartArg {
    Never,
    OnFailure,
    Always,
}

pub(super) fn wire_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn unix_millis(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => wire_millis(d),
        Err(e) => -wire_millis(e.duration()),
    }
}

impl LifetimeArgs {
    fn wire(&self) -> pb::Lifetime {
        pb::Lifetime {
            ttl_ms: self.ttl.map(wire_millis),
            idle_timeout_ms: self.idle_timeout.map(wire_millis),
            on_expiry: self.on_expiry.wire(),
            on_idle: self.on_idle.map(OnExpiryArg::wire),
        }
    }
}

impl RestartArgs {
    fn wire(&self) -> pb::RestartPolicy {
        pb::RestartPolicy {
            mode: match self.restart {
                RestartArg::Never => pb::RestartMode::Never,
                RestartArg::OnFailure => pb::RestartMode::OnFailure,
                RestartArg::Always => pb::RestartMode::Always,
            } as i32,
            max_restarts: self.max_restarts,
            backoff_ms: self.restart_backoff.map(wire_millis),
            max_backoff_ms: self.restart_max_backoff.map(wire_millis),
        }
    }
}

#[derive(Args)]
pub(super) struct Versioned {
    /// Fail with ABORTED unless the record still has this resource version.
    #[arg(long)]
    pub(super) expected_version: Option<u64>,
}

pub(super) fn pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn cpus_are_thousandths_of_a_core() {
        assert_eq!(cpus("1.5"), Ok(1500));
        assert_eq!(cpus("0.25"), Ok(250));
        assert_eq!(cpus("2"), Ok(2000));
        for bad in ["0", "-1", "NaN", "inf", "one"] {
            assert!(cpus(bad).unwrap_err().contains(bad), "{bad}");
        }
    }

    #[test]
    pub(super) fn sizes_take_decimal_and_binary_suffixes() {
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("512Mi"), Ok(512 << 20));
        assert_eq!(bytes("512MiB"), Ok(512 << 20));
        assert_eq!(bytes("2G"), Ok(2_000_000_000));
        assert_eq!(bytes("1Ti"), Ok(1 << 40));
        assert_eq!(bytes("3k"), Ok(3000));
        for bad in ["", "Mi", "1.5G", "12 parsecs", "-1", "9999999999Ti"] {
            assert!(bytes(bad).unwrap_err().contains("is not a size"), "{bad}");
        }
    }

    #[test]
    fn a_port_flag_makes_a_port_public() {
        assert_eq!(port_spec("8080:public"), Ok(pb::PortSpec { port: 8080, public: true }));
        for bad in ["8080", "8080:private", "0:public", "70000:public", "x:public"] {
            assert!(port_spec(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn volumes_are_a_name_a_path_and_maybe_ro() {
        let m = |volume: &str, path: &str, read_only| pb::VolumeMount {
            volume: volume.into(),
            path: path.into(),
            read_only,
        };
        assert_eq!(mount("data:/data"), Ok(m("data", "/data", false)));
        assert_eq!(mount("data:/srv/data:ro"), Ok(m("data", "/srv/data", true)));
        assert_eq!(mount("data:/srv/data:rw"), Ok(m("data", "/srv/data", false)));
        // The path is checked by the gateway, which names the field.
        assert_eq!(mount("data:relative"), Ok(m("data", "relative", false)));
        for bad in ["data", ":/data", "data:", "data::ro"] {
            assert!(mount(bad).unwrap_err().contains("NAME:/path"), "{bad}");
        }
    }
}
