//! Which environment a sandbox's command gets, however it starts: the process driver's run, a
//! container's run, an exec. The rule is a security rule (credentials reach only the sandboxes
//! whose providers hold them; the run's token never reaches its command; nothing a user sets
//! can pass for Berth's own variables), so it is written once, in [`layered`].
//!
//! From the lowest, a later layer winning a name two of them hold:
//!
//! 1. what Berth offers that a sandbox may set otherwise (the process driver's `HOME`);
//! 2. the spec's `env`;
//! 3. the attached providers' credentials;
//! 4. an exec's own `env`;
//! 5. the run's identity (the process driver's; a container's is in its own environment, under
//!    the whole of this, and its token in a file).
//!
//! berth-core refuses a credential named like a spec variable or another provider's, and any
//! name starting with `BERTH_` in a spec, a provider or an exec, so for what the API accepts
//! only the first and the fourth layers ever meet another. Berth's names are dropped from the
//! user's layers here all the same: a container's supervisor and an exec's lay these variables
//! over an environment holding the run's identity, which none of them may replace.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use berth_core::Secret;
use berth_core::validate::RESERVED_ENV_PREFIX;
use berth_handoff::var;

use crate::Launch;

/// Variables for a runtime to start a command with. They hold credentials, and the process
/// driver's hold the run's token, so `Debug` shows their names alone.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RunEnv(BTreeMap<String, String>);

impl RunEnv {
    /// The variables, for the runtime. Never log them.
    pub fn expose(self) -> BTreeMap<String, String> {
        self.0
    }
}

impl fmt::Debug for RunEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RunEnv").field(&self.0.keys().collect::<Vec<_>>()).finish()
    }
}

/// The process driver's run: its supervisor's whole environment, `home` its `HOME` unless the
/// spec says otherwise, `mounts` its `BERTH_MOUNTS`. The supervisor passes all of it on to the command but the token
/// (`berth_handoff::var::KEPT_FROM_COMMAND`).
pub fn process_run(launch: &Launch, home: &Path, mounts: &Path) -> RunEnv {
    let home = [("HOME".to_string(), home.to_string_lossy().into_owned())];
    let mut env = layered(home, &launch.spec.env, &launch.credentials, &BTreeMap::new(), Some(launch));
    env.0.insert(MOUNTS_VAR.to_string(), mounts.to_string_lossy().into_owned());
    env
}

/// Where a process driver's run finds the volumes it mounts, each a link at its mount path.
pub const MOUNTS_VAR: &str = "BERTH_MOUNTS";

/// A container's run: its environment file, which its supervisor lays over the container's own
/// environment (the run's identity and egress proxy).
pub fn container_run(launch: &Launch) -> RunEnv {
    layered([], &launch.spec.env, &launch.credentials, &BTreeMap::new(), None)
}

/// An exec's: the sandbox's spec and the credentials of the providers attached now (a provider
/// attached at a claim reaches execs at once; the main process gets it at its next start),
/// under the exec's own. The supervisor lays it over its own environment.
pub fn exec(
    spec: &BTreeMap<String, String>,
    credentials: &BTreeMap<String, Secret>,
    own: &BTreeMap<String, String>,
) -> RunEnv {
    layered([], spec, credentials, own, None)
}

fn layered(
    offered: impl IntoIterator<Item = (String, String)>,
    spec: &BTreeMap<String, String>,
    credentials: &BTreeMap<String, Secret>,
    own: &BTreeMap<String, String>,
    identity: Option<&Launch>,
) -> RunEnv {
    let mut vars: BTreeMap<String, String> = offered.into_iter().collect();
    vars.extend(spec.iter().map(|(k, v)| (k.clone(), v.clone())));
    vars.extend(credentials.iter().map(|(k, v)| (k.clone(), v.expose().to_string())));
    vars.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
    vars.retain(|name, _| !name.starts_with(RESERVED_ENV_PREFIX));
    if let Some(launch) = identity {
        vars.extend([
            (var::SANDBOX_ID.to_string(), launch.sandbox.to_string()),
            (var::GENERATION.to_string(), launch.generation.to_string()),
            (var::SANDBOX_NAME.to_string(), launch.name.clone()),
            (var::RUNTIME_TOKEN.to_string(), launch.token.expose().to_string()),
        ]);
    }
    RunEnv(vars)
}

#[cfg(test)]
mod tests {
    use berth_core::SandboxId;
    use berth_core::identity::{IdentityKey, RuntimeIdentity, derive_token};

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn launch(env: &[(&str, &str)], credentials: &[(&str, &str)]) -> Launch {
        let sandbox = SandboxId::new("sb-1".to_string());
        let identity = RuntimeIdentity { sandbox: sandbox.clone(), generation: 3 };
        Launch {
            sandbox,
            name: "box".into(),
            generation: 3,
            spec: berth_core::SandboxSpec { env: map(env), ..Default::default() },
            credentials: credentials.iter().map(|(k, v)| (k.to_string(), Secret::new(*v))).collect(),
            token: derive_token(&IdentityKey::from_bytes([7; 32]), &identity),
            seed: None,
            fence: crate::Fence::open(),
        }
    }

    #[test]
    fn a_process_run_gets_home_and_its_mounts_then_the_spec_then_credentials_then_its_identity() {
        let launch = launch(&[("A", "spec"), ("HOME", "/mine"), ("KEY", "spec")], &[("KEY", "secret"), ("B", "b")]);
        let vars = process_run(&launch, Path::new("/ws"), Path::new("/mounts")).expose();
        let token = launch.token.expose().to_string();
        let expected = map(&[
            ("A", "spec"),
            ("B", "b"),
            ("BERTH_GENERATION", "3"),
            ("BERTH_MOUNTS", "/mounts"),
            ("BERTH_RUNTIME_TOKEN", &token),
            ("BERTH_SANDBOX_ID", "sb-1"),
            ("BERTH_SANDBOX_NAME", "box"),
            ("HOME", "/mine"),
            ("KEY", "secret"),
        ]);
        assert_eq!(vars, expected);
        let without_home =
            process_run(&super::tests::launch(&[], &[]), Path::new("/ws"), Path::new("/mounts")).expose();
        assert_eq!(without_home["HOME"], "/ws");
    }

    #[test]
    fn a_container_run_gets_the_spec_under_credentials_and_nothing_of_berth() {
        let launch = launch(&[("A", "spec"), ("KEY", "spec")], &[("KEY", "secret")]);
        assert_eq!(container_run(&launch).expose(), map(&[("A", "spec"), ("KEY", "secret")]));
    }

    #[test]
    fn an_exec_gets_its_own_over_credentials_over_the_spec() {
        let credentials =
            BTreeMap::from([("KEY".to_string(), Secret::new("secret")), ("K2".into(), Secret::new("s2"))]);
        let vars = exec(&map(&[("A", "spec"), ("KEY", "spec")]), &credentials, &map(&[("K2", "own"), ("C", "c")]));
        assert_eq!(vars.expose(), map(&[("A", "spec"), ("C", "c"), ("K2", "own"), ("KEY", "secret")]));
    }

    /// Never accepted by the API (berth-core reserves the prefix); were one stored, the run's
    /// identity still holds, in every layer and on every path.
    #[test]
    fn no_layer_of_the_users_sets_a_name_of_berths() {
        let impostor = [("BERTH_SANDBOX_ID", "other"), ("BERTH_RUNTIME_TOKEN", "forged"), ("BERTH_X", "x")];
        let launch = launch(&impostor, &impostor);
        let vars = process_run(&launch, Path::new("/ws"), Path::new("/mounts")).expose();
        assert_eq!(vars["BERTH_SANDBOX_ID"], "sb-1");
        assert_eq!(vars["BERTH_RUNTIME_TOKEN"], launch.token.expose());
        assert!(!vars.contains_key("BERTH_X"));
        assert!(container_run(&launch).expose().keys().all(|k| !k.starts_with("BERTH_")));
        let vars = exec(&map(&impostor), &launch.credentials, &map(&impostor)).expose();
        assert!(vars.is_empty(), "{vars:?}");
    }

    #[test]
    fn debug_shows_names_never_values() {
        let launch = launch(&[("PLAIN", "visible-value")], &[("API_KEY", "hunter2")]);
        let env = process_run(&launch, Path::new("/ws"), Path::new("/mounts"));
        let shown = format!("{env:?} {env:#?} {:?}", exec(&launch.spec.env, &launch.credentials, &BTreeMap::new()));
        for secret in ["hunter2", launch.token.expose(), "visible-value"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("API_KEY") && shown.contains("BERTH_RUNTIME_TOKEN"), "{shown}");
    }
}
