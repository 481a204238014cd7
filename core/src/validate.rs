//! Input validation: the limits every entry point applies before a command is decided, so the
//! gateway, the simulator and the fuzzers reject the same inputs with the same field names.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::Error;
use crate::record::Secret;
use crate::spec::{Mount, PortSpec, SandboxSpec, WORKSPACE};

/// What the gateway's configuration bounds: an input to the rules like any other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The longest TTL, and the furthest deadline, a sandbox may have.
    pub max_ttl: core::time::Duration,
    /// The most Ready sandboxes one template's pool may keep.
    pub max_pool: u32,
    /// The most snapshots the store may hold, a fork's own included (DESIGN 12.2).
    pub max_snapshots: u32,
    /// The most bytes the store's snapshots may hold together; a snapshot is refused once they
    /// reach it.
    pub max_snapshot_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_ttl: core::time::Duration::from_secs(30 * 24 * 3600),
            max_pool: 100,
            max_snapshots: 100,
            max_snapshot_bytes: 50 << 30,
        }
    }
}

/// Most providers one sandbox can reference.
pub const MAX_PROVIDERS: usize = 32;
/// Most credentials one provider can hold.
pub const MAX_CREDENTIALS: usize = 64;
/// Largest encoded spec (image, command, environment and labels together), in bytes.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;
pub const MAX_IMAGE_BYTES: usize = 512;
pub const MAX_ARG_BYTES: usize = 16 * 1024;
pub const MAX_ENV_NAME_BYTES: usize = 256;
pub const MAX_VALUE_BYTES: usize = 32 * 1024;
pub const MAX_LABELS: usize = 64;
/// Labels Berth sets itself (a pool member's); a spec or a claim cannot set them.
pub const RESERVED_LABEL_PREFIX: &str = "berth.";
/// Room left in a DNS label for a template's pool members' names: the template's name, '-', 8
/// hex digits.
pub const MAX_TEMPLATE_NAME: usize = 54;
/// Environment names the runtime sets itself; a spec or provider cannot set them.
pub const RESERVED_ENV_PREFIX: &str = "BERTH_";

/// A DNS label: 1 to 63 lowercase letters, digits and '-', starting and ending alphanumeric.
pub fn dns_label(field: &str, value: &str) -> Result<(), Error> {
    let bytes = value.as_bytes();
    if bytes.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if bytes.len() > 63 {
        return Err(Error::invalid(field, format!("must be at most 63 characters, got {}", bytes.len())));
    }
    if let Some(bad) = value.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')) {
        return Err(Error::invalid(
            field,
            format!("{bad:?} is not allowed: use lowercase letters, digits and '-' (a DNS label)"),
        ));
    }
    if !bytes[0].is_ascii_alphanumeric() || !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
        return Err(Error::invalid(field, "must start and end with a letter or digit (a DNS label)"));
    }
    Ok(())
}

/// A template's name: a DNS label its pool members' names are made from.
pub fn template_name(field: &str, name: &str) -> Result<(), Error> {
    dns_label(field, name)?;
    if name.len() > MAX_TEMPLATE_NAME {
        return Err(Error::Invalid {
            field: field.to_string(),
            reason: format!(
                "must be at most {MAX_TEMPLATE_NAME} characters, so that its pool members' names fit a DNS label"
            ),
        });
    }
    Ok(())
}

/// An environment variable name: `[A-Za-z_][A-Za-z0-9_]*`, not reserved.
pub fn env_name(field: &str, name: &str) -> Result<(), Error> {
    let mut chars = name.chars();
    let valid = match chars.next() {
        Some(first) => {
            (first.is_ascii_alphabetic() || first == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    };
    if !valid || name.len() > MAX_ENV_NAME_BYTES {
        return Err(Error::invalid(
            field,
            format!(
                "{name:?} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*, at most {MAX_ENV_NAME_BYTES} bytes)"
            ),
        ));
    }
    if name.starts_with(RESERVED_ENV_PREFIX) {
        return Err(Error::invalid(
            field,
            format!("{name:?} is reserved: names starting with {RESERVED_ENV_PREFIX} are set by Berth"),
        ));
    }
    Ok(())
}

pub(crate) fn no_nul(field: &str, value: &str) -> Result<(), Error> {
    if value.contains('\0') {
        return Err(Error::invalid(field, "must not contain NUL bytes"));
    }
    Ok(())
}

fn label_part(field: &str, value: &str, allow_empty: bool) -> Result<(), Error> {
    if value.is_empty() {
        return if allow_empty { Ok(()) } else { Err(Error::invalid(field, "must not be empty")) };
    }
    let ok = value.len() <= 63
        && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !ok {
        return Err(Error::invalid(
            field,
            format!(
                "{value:?} must be at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
            ),
        ));
    }
    Ok(())
}

/// A label selector or label key and value.
pub fn label(key: &str, value: &str) -> Result<(), Error> {
    label_part("spec.labels", key, false)?;
    label_part(&format!("spec.labels[{key}]"), value, true)
}

/// A label a user sets (in a spec, or at a claim), named `field`: a valid one, not Berth's own.
pub fn user_label(field: &str, key: &str, value: &str) -> Result<(), Error> {
    label_part(field, key, false)?;
    label_part(&format!("{field}[{key}]"), value, true)?;
    if key.starts_with(RESERVED_LABEL_PREFIX) {
        return Err(Error::invalid(
            format!("{field}[{key}]"),
            format!("labels starting with {RESERVED_LABEL_PREFIX} are set by Berth"),
        ));
    }
    Ok(())
}

/// The most volumes one sandbox mounts.
pub const MAX_MOUNTS: usize = 16;
/// Longest volume name: the label that binds a sandbox to the volume
/// ([`crate::volume::label`]) has room for no more.
pub const MAX_VOLUME_NAME: usize = 50;
/// Longest mount path.
pub const MAX_MOUNT_PATH: usize = 1024;
/// Paths the runtime owns: nothing is mounted at or under them.
const RUNTIME_PATHS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// A volume's name: a DNS label short enough for its binding label.
pub fn volume_name(field: &str, name: &str) -> Result<(), Error> {
    dns_label(field, name)?;
    if name.len() > MAX_VOLUME_NAME {
        return Err(Error::invalid(field, format!("must be at most {MAX_VOLUME_NAME} characters, got {}", name.len())));
    }
    Ok(())
}

/// The most ports one spec names.
pub const MAX_PORTS: usize = 32;

/// A spec's ports: each a TCP port, named once.
fn ports(ports: &[PortSpec]) -> Result<(), Error> {
    if ports.len() > MAX_PORTS {
        return Err(Error::invalid("spec.ports", format!("at most {MAX_PORTS} ports, got {}", ports.len())));
    }
    let mut seen = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let field = format!("spec.ports[{i}].port");
        if port.port == 0 {
            return Err(Error::invalid(field, "0 is not a TCP port"));
        }
        if !seen.insert(port.port) {
            return Err(Error::invalid(field, format!("port {} is named twice", port.port)));
        }
    }
    Ok(())
}

/// A spec's mounts: named volumes at distinct, clean absolute paths, none the workspace or a
/// path the runtime owns.
fn mounts(mounts: &[Mount]) -> Result<(), Error> {
    if mounts.len() > MAX_MOUNTS {
        return Err(Error::invalid("spec.volumes", format!("at most {MAX_MOUNTS} mounts, got {}", mounts.len())));
    }
    let mut paths = BTreeSet::new();
    for (i, mount) in mounts.iter().enumerate() {
        volume_name(&format!("spec.volumes[{i}].volume"), &mount.volume)?;
        let field = format!("spec.volumes[{i}].path");
        let path = mount.path.as_str();
        no_nul(&field, path)?;
        let clean = path.len() <= MAX_MOUNT_PATH
            && path.len() > 1
            && path.starts_with('/')
            && path[1..].split('/').all(|part| !matches!(part, "" | "." | ".."));
        if !clean {
            return Err(Error::invalid(
                field,
                format!(
                    "{path:?} must be an absolute path of at most {MAX_MOUNT_PATH} bytes, not /, without empty, '.' or '..' parts"
                ),
            ));
        }
        let under = |root: &str| path == root || path.strip_prefix(root).is_some_and(|rest| rest.starts_with('/'));
        if path == WORKSPACE {
            return Err(Error::invalid(field, format!("{WORKSPACE} is the sandbox's workspace: mount elsewhere")));
        }
        if let Some(root) = RUNTIME_PATHS.iter().find(|root| under(root)) {
            return Err(Error::invalid(field, format!("{path:?} is under {root}, which the runtime owns")));
        }
        if !paths.insert(path) {
            return Err(Error::invalid(field, format!("{path:?} is mounted twice")));
        }
    }
    Ok(())
}

/// The whole sandbox spec.
pub fn spec(spec: &SandboxSpec) -> Result<(), Error> {
    if spec.image.trim().is_empty() {
        return Err(Error::invalid("spec.image", "must not be empty"));
    }
    if spec.image.len() > MAX_IMAGE_BYTES || spec.image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::invalid(
            "spec.image",
            format!("must be an image reference without spaces, at most {MAX_IMAGE_BYTES} bytes"),
        ));
    }
    if spec.command.is_empty() || spec.command[0].is_empty() {
        return Err(Error::invalid("spec.command", "must name a program to run"));
    }
    for (i, arg) in spec.command.iter().enumerate() {
        let field = format!("spec.command[{i}]");
        no_nul(&field, arg)?;
        if arg.len() > MAX_ARG_BYTES {
            return Err(Error::invalid(field, format!("must be at most {MAX_ARG_BYTES} bytes")));
        }
    }
    for (name, value) in &spec.env {
        env_name("spec.env", name)?;
        let field = format!("spec.env[{name}]");
        no_nul(&field, value)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(Error::invalid(field, format!("must be at most {MAX_VALUE_BYTES} bytes")));
        }
    }
    if spec.labels.len() > MAX_LABELS {
        return Err(Error::invalid("spec.labels", format!("at most {MAX_LABELS} labels, got {}", spec.labels.len())));
    }
    for (key, value) in &spec.labels {
        user_label("spec.labels", key, value)?;
    }
    if spec.node_selector.len() > MAX_LABELS {
        let count = spec.node_selector.len();
        return Err(Error::invalid("spec.node_selector", format!("at most {MAX_LABELS} labels, got {count}")));
    }
    for (key, value) in &spec.node_selector {
        label_part("spec.node_selector", key, false)?;
        label_part(&format!("spec.node_selector[{key}]"), value, true)?;
    }
    let size = spec.image.len()
        + spec.command.iter().map(String::len).sum::<usize>()
        + spec.env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
        + spec.labels.iter().chain(&spec.node_selector).map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if size > MAX_SPEC_BYTES {
        return Err(Error::invalid("spec", format!("is {size} bytes; at most {MAX_SPEC_BYTES} are allowed")));
    }
    spec.egress.validate("spec.egress.allow")?;
    mounts(&spec.volumes)?;
    ports(&spec.ports)?;
    crate::limits::validate(&spec.limits)
}

/// A set of provider names for one sandbox.
pub fn provider_names(field: &str, providers: &BTreeSet<String>) -> Result<(), Error> {
    if providers.len() > MAX_PROVIDERS {
        return Err(Error::invalid(field, format!("at most {MAX_PROVIDERS} providers, got {}", providers.len())));
    }
    for name in providers {
        dns_label(field, name)?;
    }
    Ok(())
}

/// A provider's kind and credentials.
pub fn provider(kind: &str, credentials: &BTreeMap<String, Secret>) -> Result<(), Error> {
    label_part("kind", kind, false)?;
    if credentials.len() > MAX_CREDENTIALS {
        return Err(Error::invalid(
            "credentials",
            format!("at most {MAX_CREDENTIALS} credentials, got {}", credentials.len()),
        ));
    }
    for (name, value) in credentials {
        env_name("credentials", name)?;
        // Never echo a secret value, even in an error.
        let field = format!("credentials[{name}]");
        no_nul(&field, value.expose())?;
        if value.expose().len() > MAX_VALUE_BYTES {
            return Err(Error::invalid(field, format!("must be at most {MAX_VALUE_BYTES} bytes")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    fn field_of(err: Error) -> String {
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        match err {
            Error::Invalid { field, .. } => field,
            other => panic!("not a validation error: {other}"),
        }
    }

    #[test]
    fn dns_labels() {
        for ok in ["a", "web-1", "0abc", &"x".repeat(63)] {
            dns_label("name", ok).unwrap();
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "é", &"x".repeat(64)] {
            assert_eq!(field_of(dns_label("name", bad).unwrap_err()), "name", "{bad:?}");
        }
    }

    #[test]
    fn env_names() {
        for ok in ["A", "_x", "PATH", "a1_B2"] {
            env_name("spec.env", ok).unwrap();
        }
        for bad in ["", "1A", "A-B", "A B", "BERTH_RUNTIME_TOKEN", "A=B"] {
            assert_eq!(field_of(env_name("spec.env", bad).unwrap_err()), "spec.env", "{bad:?}");
        }
        env_name("spec.env", &"N".repeat(MAX_ENV_NAME_BYTES)).unwrap();
        let long = "N".repeat(MAX_ENV_NAME_BYTES + 1);
        assert_eq!(field_of(env_name("spec.env", &long).unwrap_err()), "spec.env");
    }

    fn good_spec() -> SandboxSpec {
        SandboxSpec { image: "busybox".into(), command: vec!["sleep".into(), "1".into()], ..Default::default() }
    }

    type Mutation = Box<dyn Fn(&mut SandboxSpec)>;

    #[test]
    fn specs_name_the_offending_field() {
        spec(&good_spec()).unwrap();
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|s| s.image.clear()), "spec.image"),
            (Box::new(|s| s.image = "bad image".into()), "spec.image"),
            (Box::new(|s| s.command.clear()), "spec.command"),
            (Box::new(|s| s.command = vec![String::new()]), "spec.command"),
            (Box::new(|s| s.command.push("a\0b".into())), "spec.command[2]"),
            (Box::new(|s| _ = s.env.insert("1BAD".into(), "v".into())), "spec.env"),
            (Box::new(|s| _ = s.env.insert("OK".into(), "x".repeat(MAX_VALUE_BYTES + 1))), "spec.env[OK]"),
            (Box::new(|s| _ = s.labels.insert("bad key".into(), "v".into())), "spec.labels"),
            (Box::new(|s| _ = s.labels.insert("k".into(), "-v".into())), "spec.labels[k]"),
            (Box::new(|s| s.ports = vec![PortSpec { port: 0, public: true }]), "spec.ports[0].port"),
            (
                Box::new(|s| s.ports = [8080, 9090, 8080].map(|port| PortSpec { port, public: false }).to_vec()),
                "spec.ports[2].port",
            ),
            (
                Box::new(|s| {
                    for i in 0..20 {
                        s.env.insert(format!("V{i}"), "x".repeat(MAX_VALUE_BYTES));
                    }
                }),
                "spec",
            ),
        ];
        for (mutate, field) in cases {
            let mut s = good_spec();
            mutate(&mut s);
            assert_eq!(field_of(spec(&s).unwrap_err()), field);
        }
    }

    #[test]
    fn limits_hold_at_their_boundaries() {
        let mut s = good_spec();
        s.command.push("x".repeat(MAX_ARG_BYTES));
        spec(&s).unwrap();
        s.command[2].push('x');
        assert_eq!(field_of(spec(&s).unwrap_err()), "spec.command[2]");
        // 256 KiB in all, counting every part: image, arguments, names and values.
        let mut s = good_spec();
        s.labels.insert("team".into(), "x".into());
        let fixed = "busybox".len() + "sleep".len() + "1".len() + "team".len() + "x".len();
        let mut left = MAX_SPEC_BYTES - fixed;
        for i in 0..8 {
            let value = (left - 2).min(MAX_VALUE_BYTES);
            s.env.insert(format!("V{i}"), "x".repeat(value));
            left -= 2 + value;
        }
        assert_eq!(left, 0);
        spec(&s).unwrap();
        s.labels.insert("team".into(), "xy".into());
        let err = spec(&s).unwrap_err();
        assert!(err.to_string().contains("is 262145 bytes; at most 262144"), "{err}");
        assert_eq!(field_of(err), "spec");
    }

    /// The limits are part of the API (the README lists them): written out here, not named, so
    /// that changing one is seen to change the API.
    #[test]
    fn every_count_and_length_admits_its_maximum_and_refuses_one_more() {
        type Case = (&'static str, Box<dyn Fn(usize) -> Result<(), Error>>, usize);
        let with_spec = |f: fn(&mut SandboxSpec, usize)| -> Box<dyn Fn(usize) -> Result<(), Error>> {
            Box::new(move |n| {
                let mut s = good_spec();
                f(&mut s, n);
                spec(&s)
            })
        };
        let credentials = |n: usize, len: usize| -> BTreeMap<String, Secret> {
            (0..n).map(|i| (format!("K{i}"), Secret::new("x".repeat(len)))).collect()
        };
        let cases: Vec<Case> = vec![
            ("spec.image", with_spec(|s, n| s.image = "i".repeat(n)), 512),
            ("spec.command[2]", with_spec(|s, n| s.command.push("a".repeat(n))), 16 * 1024),
            ("spec.env[V]", with_spec(|s, n| _ = s.env.insert("V".into(), "v".repeat(n))), 32 * 1024),
            (
                "spec.labels",
                with_spec(|s, n| s.labels = (0..n).map(|i| (format!("k{i}"), "v".to_string())).collect()),
                64,
            ),
            (
                "spec.ports",
                with_spec(|s, n| s.ports = (1..=n).map(|p| PortSpec { port: p as u16, public: false }).collect()),
                32,
            ),
            ("providers", Box::new(|n| provider_names("providers", &(0..n).map(|i| format!("p{i}")).collect())), 32),
            ("credentials", Box::new(move |n| provider("openai", &credentials(n, 1))), 64),
            ("credentials[K0]", Box::new(move |n| provider("openai", &credentials(1, n))), 32 * 1024),
        ];
        for (field, check, max) in cases {
            check(max).unwrap_or_else(|e| panic!("{field}: {max} must be allowed: {e}"));
            assert_eq!(field_of(check(max + 1).unwrap_err()), field, "{field}: {} must be refused", max + 1);
        }
    }

    #[test]
    fn providers_are_limited() {
        let many: BTreeSet<String> = (0..=MAX_PROVIDERS).map(|i| format!("p{i}")).collect();
        assert_eq!(field_of(provider_names("providers", &many).unwrap_err()), "providers");
        let bad: BTreeSet<String> = ["Bad".to_string()].into();
        assert_eq!(field_of(provider_names("providers", &bad).unwrap_err()), "providers");
    }

    #[test]
    fn provider_errors_never_echo_secrets() {
        let creds: BTreeMap<String, Secret> = [("TOKEN".to_string(), Secret::new("hunter2\0"))].into();
        let err = provider("openai", &creds).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert_eq!(field_of(err), "credentials[TOKEN]");
        assert_eq!(format!("{:?}", Secret::new("hunter2")), "Secret(<redacted>)");
    }
}
