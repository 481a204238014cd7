//! What a sandbox's container is made of: its spec (the host's supervisor as entrypoint, the
//! user's command as its child, the mounts, labels and proxy environment) and the host directory
//! it mounts read-only, written before every start.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use berth_core::SandboxId;
use berth_core::spec::WORKSPACE;
use berth_handoff::{began, flag, token, var};

use super::{
    Bind, ContainerDriver, ContainerSpec, Engine, LABEL_NAME, LABEL_OWNER, LABEL_SANDBOX, LABEL_STORE, NamedMount,
    REPLACE_GRACE, container_name, user_volume_name, volume_name,
};
use crate::{DriverError, Launch, io, state_file};

/// Where the supervisor takes a run's proxy requests: the container's only network is its
/// loopback, and the only way out is through the gateway's egress proxy (DESIGN 10).
const EGRESS_PROXY: &str = "127.0.0.1:3128";

/// The variables HTTP clients read their proxy from, both spellings; the sandbox's own
/// loopback stays direct.
fn proxy_env() -> impl Iterator<Item = (String, String)> {
    let proxy = format!("http://{EGRESS_PROXY}");
    let via = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"].map(|name| (name.to_string(), proxy.clone()));
    let direct = ["NO_PROXY", "no_proxy"].map(|name| (name.to_string(), "localhost,127.0.0.1,::1".to_string()));
    via.into_iter().chain(direct)
}

impl<E: Engine> ContainerDriver<E> {
    pub(super) fn dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.config.root.join(sandbox.as_str())
    }

    /// Where the sandbox's supervisors keep their logs: on the host, so they outlive the
    /// container and go with the sandbox's directory.
    pub(super) fn logs_dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.dir(sandbox).join("logs")
    }

    pub(super) fn spec(&self, launch: &Launch) -> ContainerSpec {
        let id = &launch.sandbox;
        let mut command = vec![
            "--gateway".to_string(),
            "unix:/run/berth/gateway".to_string(),
            flag::arg(flag::TOKEN_FILE),
            format!("/run/berth/state/{}", token::FILE),
            flag::arg(flag::ENV_FILE),
            format!("/run/berth/state/{}", berth_handoff::env::FILE),
            // In the container's own layer: it outlives `docker restart`, as the execs a
            // generation started must.
            "--exec-log".into(),
            // Named by the sandbox: a sandbox made from a snapshot has its source's layer, and
            // with it the source's record of the execs it ran, never its own.
            format!("/run/berth/execs/{id}"),
            "--logs".into(),
            "/run/berth/logs".into(),
            flag::arg(flag::BEGAN_FILE),
            format!("/run/berth/logs/{}", began::FILE),
            // What the runtime keeps of the container's output (`docker logs`) stays the same.
            "--echo-output".into(),
            "--egress-proxy".into(),
            EGRESS_PROXY.into(),
            "--".into(),
        ];
        command.extend(launch.spec.command.iter().cloned());
        let mut labels: BTreeMap<String, String> = [
            (LABEL_OWNER.to_string(), self.engine.owner().to_string()),
            (LABEL_SANDBOX.to_string(), id.to_string()),
            (LABEL_NAME.to_string(), launch.name.clone()),
        ]
        .into();
        if let Some(store) = self.engine.store() {
            labels.insert(LABEL_STORE.to_string(), store.to_string());
        }
        ContainerSpec {
            name: container_name(id),
            // A sandbox made from a snapshot runs the image committed of its source.
            image: match &launch.seed {
                Some(_) => super::seed_image(id),
                None => launch.spec.image.clone(),
            },
            entrypoint: vec!["/run/berth/bin/berth-supervisor".into()],
            command,
            env: [(var::SANDBOX_ID.to_string(), id.to_string()), (var::SANDBOX_NAME.to_string(), launch.name.clone())]
                .into_iter()
                .chain(proxy_env())
                .collect(),
            labels,
            binds: vec![
                Bind {
                    source: self.config.supervisor.clone(),
                    target: "/run/berth/bin/berth-supervisor".into(),
                    read_only: true,
                },
                Bind { source: self.config.socket_dir.clone(), target: "/run/berth/gateway".into(), read_only: false },
                Bind { source: self.dir(id), target: "/run/berth/state".into(), read_only: true },
                // Written by the supervisor, read here: whatever the sandbox puts in it is read
                // as untrusted (berth-logs).
                Bind { source: self.logs_dir(id), target: "/run/berth/logs".into(), read_only: false },
            ],
            volumes: std::iter::once(NamedMount { name: volume_name(id), target: WORKSPACE.into(), read_only: false })
                .chain(berth_core::volume::mounts(&launch.spec).into_iter().map(|(volume, mount)| NamedMount {
                    name: user_volume_name(&volume),
                    target: mount.path.clone(),
                    read_only: mount.read_only,
                }))
                .collect(),
            workdir: WORKSPACE.into(),
            stop_grace: REPLACE_GRACE,
            limits: launch.spec.limits,
        }
    }

    /// Makes the sandbox's host directory: the driver's record, and what its container mounts.
    pub(super) fn make_dir(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let logs = self.logs_dir(sandbox);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&logs)
            .map_err(|e| io(&format!("creating {}", logs.display()), e))
    }

    /// Installs the generation's identity and environment where its supervisor reads them.
    pub(super) fn install(&self, launch: &Launch) -> Result<(), DriverError> {
        let dir = self.dir(&launch.sandbox);
        let env = crate::env::container_run(launch).expose();
        state_file::write(&dir.join(berth_handoff::env::FILE), &berth_handoff::env::to_bytes(&env))?;
        state_file::write(&dir.join(token::FILE), launch.token.expose().as_bytes())
    }
}
