//! The data directory's layout: what each file is called and how it is written. The gateway
//! keeps its secrets, its SQLite store, its supervisor sockets and its address there, the CLI on
//! the same host finds the address and the token there, and several gateways may share one, so
//! every file is written whole before anyone can read it.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use berth_core::identity::IdentityKey;

use crate::config::StoreLocation;

/// The file holding the API token, which the CLI on this host reads.
const API_TOKEN_FILE: &str = "api-token";
const IDENTITY_KEY_FILE: &str = "identity.key";
/// The SQLite store, unless configured elsewhere.
const DATABASE_FILE: &str = "berth.db";
const INSTANCE_FILE: &str = "instance-id";
/// The identity of the store the data directory belongs to (see [`DataDir::bind_to_store`]).
pub const STORE_ID_FILE: &str = "store-id";
/// The gateway's name unless configured: the one gateway of a data directory.
pub const DEFAULT_NAME: &str = "gateway";
/// The supervisors' sockets, one per gateway, in a directory of their own: supervisors are
/// given the directory and connect to any gateway listening in it, and containers mount it,
/// which keeps working when a restarted gateway replaces its socket.
pub const SOCKET_DIR: &str = "run";
/// What ends the name of a gateway's address file, `<name>.addr`.
const ADDRESS_SUFFIX: &str = ".addr";

/// Where Berth keeps its data unless told otherwise.
pub fn default_path() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("berth")
}

/// The SQLite store of the data directory at `path`, the default store.
pub fn database(path: &Path) -> PathBuf {
    path.join(DATABASE_FILE)
}

/// Where a gateway writes the address it listens on, for the CLI: `<name>.addr`.
pub fn address_file(name: &str) -> String {
    format!("{name}{ADDRESS_SUFFIX}")
}

/// A gateway's supervisor socket in [`SOCKET_DIR`]: `<name>.sock`.
fn supervisor_socket(name: &str) -> String {
    format!("{name}.sock")
}

/// A data directory, as the gateway and the CLI see it.
pub struct DataDir {
    path: PathBuf,
}

impl DataDir {
    /// The data directory at `path`, as it is (the CLI reads it, and makes nothing there).
    pub fn at(path: PathBuf) -> Self {
        Self { path }
    }

    /// The data directory at `path`, made (readable by its owner only) if missing.
    pub fn create(path: &Path) -> Result<Self, String> {
        private_dir(path)?;
        Ok(Self::at(path.to_path_buf()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The API token: `given` (written where the CLI on this host looks, replacing a token an
    /// earlier run made, so the file always holds the token the gateway takes), else the one
    /// of an earlier run, else a new one.
    pub fn api_token(&self, given: Option<&str>) -> Result<String, String> {
        let path = self.path.join(API_TOKEN_FILE);
        match given {
            Some(token) => {
                replace_private(&path, token)?;
                Ok(token.to_string())
            }
            None => secret(&path, 32),
        }
    }

    /// The token a gateway of this data directory takes, for the CLI: none if no gateway has
    /// run from it (or the file is empty).
    pub fn read_api_token(&self) -> Option<String> {
        read_trimmed(&self.path.join(API_TOKEN_FILE))
    }

    /// The key runtime identities are derived from, made on first start.
    pub fn identity_key(&self) -> Result<IdentityKey, String> {
        let path = self.path.join(IDENTITY_KEY_FILE);
        let hex_key = secret(&path, 32)?;
        let bytes: [u8; 32] = hex::decode(&hex_key)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| format!("{} does not hold a 32-byte hex key", path.display()))?;
        Ok(IdentityKey::from_bytes(bytes))
    }

    /// The name container engines know this data directory's sandboxes by, made on first start.
    pub fn instance(&self) -> Result<String, String> {
        secret(&self.path.join(INSTANCE_FILE), 8)
    }

    /// Where the process driver keeps its sandboxes.
    pub fn sandboxes(&self) -> PathBuf {
        self.path.join("sandboxes")
    }

    /// Where a container driver keeps its state for the runtime `runtime` (`docker`, `podman`).
    pub fn runtime_state(&self, runtime: &str) -> PathBuf {
        self.path.join(runtime)
    }

    /// The directory of the supervisors' sockets, made (owner only) if missing.
    pub fn socket_dir(&self) -> Result<PathBuf, String> {
        let dir = self.path.join(SOCKET_DIR);
        private_dir(&dir)?;
        Ok(dir)
    }

    /// The supervisor socket of the gateway named `name`, in [`Self::socket_dir`].
    pub fn supervisor_socket(&self, name: &str) -> PathBuf {
        self.path.join(SOCKET_DIR).join(supervisor_socket(name))
    }

    /// The address file of the gateway named `name`.
    pub fn address_path(&self, name: &str) -> PathBuf {
        self.path.join(address_file(name))
    }

    /// Says where the gateway named `name` listens, and whether it speaks TLS there (`scheme`,
    /// `https` or `http`): written aside and renamed into place, so a reader (the CLI, a test)
    /// never sees half of it.
    pub fn write_address(&self, name: &str, scheme: &str, address: std::net::SocketAddr) -> Result<(), String> {
        let path = self.address_path(name);
        let written = path.with_extension("addr.tmp");
        std::fs::write(&written, format!("{scheme}://{address}\n"))
            .and_then(|()| std::fs::rename(&written, &path))
            .map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// The address the gateway named `name` last wrote, if it ever ran from here.
    pub fn read_address(&self, name: &str) -> Option<String> {
        read_trimmed(&self.address_path(name))
    }

    /// The names of the gateways that have written an address here, sorted.
    pub fn addressed_gateways(&self) -> Vec<String> {
        let mut named: Vec<String> = std::fs::read_dir(&self.path)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok()?.strip_suffix(ADDRESS_SUFFIX).map(str::to_string))
            .collect();
        named.sort();
        named
    }

    /// Binds the data directory to the store the gateway runs on, or refuses a store that is
    /// not the one it is bound to. Sandboxes in the data directory (the process driver's, and
    /// the container drivers' state) belong to that store's records: on any other store they
    /// would have no record, and reconciling would delete them as orphans. A data directory
    /// without the file (a first start, or one from before stores had identities) is bound at
    /// this start. The file also says where the store was when it was bound, for the message.
    pub fn bind_to_store(&self, location: &StoreLocation, identity: &str) -> Result<(), String> {
        let data = &self.path;
        let path = data.join(STORE_ID_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if write_private(&path, &format!("{identity}\n{location}\n"))? {
                    return Ok(());
                }
                // Another gateway sharing the data directory bound it first: check against that.
                return self.bind_to_store(location, identity);
            }
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        };
        let mut lines = text.lines();
        let bound = lines.next().map(str::trim).filter(|id| !id.is_empty()).ok_or_else(|| {
            format!("{} names no store; remove it to bind {} to this gateway's store", path.display(), data.display())
        })?;
        if bound == identity {
            return Ok(());
        }
        let was = lines.next().map_or(String::new(), |w| format!("{w} when it was bound; "));
        Err(format!(
            "refusing to start: the data directory {} belongs to store {bound} ({was}see {}), not to this gateway's \
             store {identity} ({location}), which would take its sandboxes for orphans and delete them. Is --store \
             (BERTH_STORE) missing or wrong? Give the store the data directory belongs to, or another --data-dir.",
            data.display(),
            path.display()
        ))
    }
}

fn private_dir(path: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| format!("creating {}: {e}", path.display()))
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| format!("no randomness from the OS: {e}"))?;
    Ok(hex::encode(buf))
}

/// Makes `path` hold `contents`, readable by its owner only, unless it exists already. The file
/// is written whole aside, then linked into place, so gateways sharing a data directory and
/// starting together agree on one value and never read half of it. Whether this call made it.
fn write_private(path: &Path, contents: &str) -> Result<bool, String> {
    let aside = path.with_extension(format!("{}.tmp", random_hex(8)?));
    let linked = write_aside(&aside, contents).and_then(|()| std::fs::hard_link(&aside, path));
    let _ = std::fs::remove_file(&aside);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(format!("creating {}: {e}", path.display())),
    }
}

/// Writes `contents` to `path` readable by its owner only, in place of what was there: written
/// aside, then renamed over it, so a reader sees the old contents or the new.
fn replace_private(path: &Path, contents: &str) -> Result<(), String> {
    let aside = path.with_extension(format!("{}.tmp", random_hex(8)?));
    let written = write_aside(&aside, contents).and_then(|()| std::fs::rename(&aside, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&aside);
    }
    written.map_err(|e| format!("writing {}: {e}", path.display()))
}

/// A new file at `aside`, readable by its owner only, holding `contents` durably.
fn write_aside(aside: &Path, contents: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(aside)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()
}

/// Reads a secret file, creating it with `bytes` random bytes on first start.
fn secret(path: &Path, bytes: usize) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let mode = std::fs::metadata(path).map_err(|e| e.to_string())?.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(format!(
                    "{} is readable by others (mode {:o}); chmod 600 it",
                    path.display(),
                    mode & 0o777
                ));
            }
            Ok(s.trim().to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let value = random_hex(bytes)?;
            if write_private(path, &value)? {
                Ok(value)
            } else {
                // Another gateway sharing the data directory made it first: use theirs.
                secret(path, bytes)
            }
        }
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_serves_only_the_store_it_was_first_used_with() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::at(dir.path().to_path_buf());
        let first = StoreLocation::Sqlite(database(data.path()));
        let other = StoreLocation::Postgres("postgres://berth:hunter2@db/berth".into());
        data.bind_to_store(&first, "aaaa").unwrap();
        let file = data.path().join(STORE_ID_FILE);
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        data.bind_to_store(&first, "aaaa").unwrap();
        // The store is found by its identity, wherever it is now.
        data.bind_to_store(&other, "aaaa").unwrap();

        let refused = data.bind_to_store(&other, "bbbb").unwrap_err();
        for mention in ["aaaa", "bbbb", &first.to_string(), &other.to_string(), "--store", "BERTH_STORE"] {
            assert!(refused.contains(mention), "{refused:?} does not mention {mention:?}");
        }
        assert!(!refused.contains("hunter2"), "a password in an error: {refused}");

        std::fs::remove_file(&file).unwrap();
        data.bind_to_store(&other, "bbbb").unwrap();
        assert!(data.bind_to_store(&first, "aaaa").is_err());
    }

    #[test]
    fn the_cli_finds_the_gateways_that_wrote_their_address() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::at(dir.path().to_path_buf());
        assert_eq!(data.addressed_gateways(), Vec::<String>::new());
        data.write_address("beta", "http", "127.0.0.1:2".parse().unwrap()).unwrap();
        data.write_address(DEFAULT_NAME, "https", "127.0.0.1:1".parse().unwrap()).unwrap();
        assert_eq!(data.addressed_gateways(), ["beta", DEFAULT_NAME]);
        assert_eq!(data.read_address("beta").as_deref(), Some("http://127.0.0.1:2"));
        assert_eq!(data.read_address(DEFAULT_NAME).as_deref(), Some("https://127.0.0.1:1"));
        assert_eq!(data.read_address("alpha"), None);
    }
}
