//! berth-handoff: what a driver hands a run's berth-supervisor, and what the supervisor hands
//! back, for both sides: the variables that name the run ([`var`]), the files ([`token`],
//! [`env`], [`began`], [`exit`]), the flags that say where those files are ([`flag`]), and each
//! file's format.
//!
//! The two sides are different binaries, and a gateway restarted onto a newer build adopts runs
//! whose supervisors an older one started: so every format here is fixed, its bytes pinned by
//! the tests below. The supervisor is built static and mounted into every container, so this
//! crate stays small: nothing beyond what the supervisor links already (serde).
//!
//! ```text
//! token    the run's token, bare                      driver -> supervisor (container drivers)
//! env      a JSON object of the command's variables   driver -> supervisor (container drivers)
//! began    the generation the run began as, decimal   supervisor -> driver
//! exit     how the command ended, a JSON object       supervisor -> driver (process driver)
//! ```
//!
//! The process driver hands the token and the variables over in the supervisor's environment
//! instead ([`var`]).

use std::path::Path;

/// The variables a run's supervisor is started with that say which run it is. Every name
/// starts with `BERTH_`, which berth-core reserves: no spec, credential or exec may set one.
pub mod var {
    pub const SANDBOX_ID: &str = "BERTH_SANDBOX_ID";
    pub const SANDBOX_NAME: &str = "BERTH_SANDBOX_NAME";
    /// With [`SANDBOX_ID`], how the process driver finds a run's supervisor among the host's
    /// processes; its absence is how it tells an exec (which leads a group of its own) from one.
    pub const GENERATION: &str = "BERTH_GENERATION";
    /// The run's proof of identity: a secret.
    pub const RUNTIME_TOKEN: &str = "BERTH_RUNTIME_TOKEN";
    pub const SUPERVISOR_GATEWAY: &str = "BERTH_SUPERVISOR_GATEWAY";

    /// What the supervisor keeps from its command: the run's proof of identity, and where to
    /// present it. The command is the sandbox's, trusted with neither.
    pub const KEPT_FROM_COMMAND: [&str; 2] = [RUNTIME_TOKEN, SUPERVISOR_GATEWAY];
    /// And from an exec, also the generation: with it, the process driver would take the exec
    /// for the run's supervisor.
    pub const KEPT_FROM_EXEC: [&str; 3] = [RUNTIME_TOKEN, SUPERVISOR_GATEWAY, GENERATION];
}

/// The supervisor's flags naming the files, as long option names (`clap`'s `long`).
pub mod flag {
    pub const TOKEN_FILE: &str = "token-file";
    pub const ENV_FILE: &str = "env-file";
    pub const BEGAN_FILE: &str = "began-file";
    pub const EXIT_FILE: &str = "exit-file";

    /// The flag as a command line spells it.
    pub fn arg(name: &str) -> String {
        format!("--{name}")
    }
}

/// Writes a file for the other side whole (a temporary file, then renamed over the old), so a
/// reader never sees half of one. Neither synced nor given a mode of its own: the supervisor's
/// files have always been written so, and a container's land in a host directory its gateway
/// must read whichever user the container runs as.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// The run's token, for a supervisor that cannot be given it in its environment (a container's
/// is fixed when the container is made; the token changes with every generation).
pub mod token {
    /// Its name in the sandbox's state directory.
    pub const FILE: &str = "token";

    /// The token a file holds: written bare, read without any whitespace around it.
    pub fn parse(text: &str) -> &str {
        text.trim()
    }
}

/// The command's variables (the spec's and the providers' credentials), for a container's
/// supervisor, which lays them over the container's own environment. The file holds secrets.
pub mod env {
    use std::collections::BTreeMap;
    use std::fmt;

    /// Its name in the sandbox's state directory.
    pub const FILE: &str = "env";

    /// The file's bytes: one JSON object, names sorted, no whitespace.
    pub fn to_bytes(vars: &BTreeMap<String, String>) -> Vec<u8> {
        serde_json::to_vec(vars).expect("a map of strings always serializes")
    }

    pub fn parse(bytes: &[u8]) -> Result<BTreeMap<String, String>, Unreadable> {
        serde_json::from_slice(bytes).map_err(|e| Unreadable { line: e.line(), column: e.column() })
    }

    /// An environment file that is not one. It says where, never what: JSON's own errors quote
    /// the text they stumbled on, and this text holds credentials.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Unreadable {
        line: usize,
        column: usize,
    }

    impl fmt::Display for Unreadable {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "not a JSON object of strings (line {}, column {})", self.line, self.column)
        }
    }

    impl std::error::Error for Unreadable {}
}

/// The generation a run began as, which its supervisor writes before anything else: the process
/// driver's proof that a run it lost track of began, a container driver's word on whose run one
/// it did not start is.
pub mod began {
    /// Its name in the process driver's run folder, and in a container's logs directory.
    pub const FILE: &str = "began";
    /// The most of the file a reader need take: a container's may hold whatever its sandbox
    /// wrote there.
    pub const MAX_BYTES: u64 = 32;

    pub fn to_bytes(generation: u64) -> Vec<u8> {
        generation.to_string().into_bytes()
    }

    /// The generation, if the bytes are one.
    pub fn parse(bytes: &[u8]) -> Option<u64> {
        std::str::from_utf8(bytes).ok()?.trim().parse().ok()
    }
}

/// How a process driver's run ended: written by its supervisor, or by the driver for a run
/// whose supervisor died without writing it.
pub mod exit {
    use serde::{Deserialize, Serialize};

    /// Its name in the process driver's run folder.
    pub const FILE: &str = "exit.json";

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Exit {
        pub exit_code: i32,
        /// Unix nanoseconds.
        pub finished_at: i64,
        /// Set when the driver recorded the exit itself, for a run whose supervisor died without
        /// recording one: the generation of that run. A supervisor's own record has none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub generation: Option<u64>,
        /// The supervisor saw the kernel kill the command for memory. Records from before it
        /// was kept have none.
        #[serde(default)]
        pub out_of_memory: bool,
    }

    impl Exit {
        /// The file's bytes (the drivers read it through its `Deserialize`).
        pub fn to_bytes(&self) -> Vec<u8> {
            serde_json::to_vec(self).expect("an exit always serializes")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn parse_exit(bytes: &[u8]) -> exit::Exit {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn an_exit_is_the_json_the_supervisor_has_always_written_and_reads_back() {
        let supervisor =
            exit::Exit { exit_code: 3, finished_at: 1_700_000_000_123_456_789, generation: None, out_of_memory: true };
        let bytes = br#"{"exit_code":3,"finished_at":1700000000123456789,"out_of_memory":true}"#;
        assert_eq!(supervisor.to_bytes(), bytes);
        assert_eq!(parse_exit(bytes), supervisor);
        let driver = exit::Exit { exit_code: 137, finished_at: 5, generation: Some(2), out_of_memory: false };
        let bytes = br#"{"exit_code":137,"finished_at":5,"generation":2,"out_of_memory":false}"#;
        assert_eq!(driver.to_bytes(), bytes);
        assert_eq!(parse_exit(bytes), driver);
        let older = parse_exit(br#"{"exit_code":1,"finished_at":9}"#);
        assert_eq!(older, exit::Exit { exit_code: 1, finished_at: 9, generation: None, out_of_memory: false });
        assert_eq!(exit::FILE, "exit.json");
    }

    #[test]
    fn began_is_the_bare_decimal_generation() {
        assert_eq!(began::to_bytes(42), b"42");
        assert_eq!(began::parse(&began::to_bytes(u64::MAX)), Some(u64::MAX));
        assert_eq!(began::parse(b" 7\n"), Some(7));
        for junk in [&b""[..], b"-1", b"7x", b"\xff7", b"18446744073709551616"] {
            assert_eq!(began::parse(junk), None, "{junk:?}");
        }
        assert_eq!(began::FILE, "began");
    }

    #[test]
    fn the_environment_is_one_sorted_json_object_and_reads_back() {
        let vars = BTreeMap::from([("B".to_string(), "two words".to_string()), ("A".to_string(), "é\"\n".to_string())]);
        let bytes = env::to_bytes(&vars);
        assert_eq!(bytes, r#"{"A":"é\"\n","B":"two words"}"#.as_bytes());
        assert_eq!(env::parse(&bytes).unwrap(), vars);
        assert_eq!(env::to_bytes(&BTreeMap::new()), b"{}");
        assert_eq!(env::FILE, "env");
    }

    #[test]
    fn an_unreadable_environment_file_never_quotes_it() {
        for text in [&br#""hunter2""#[..], br#"{"KEY":"hunter2","#, br#"{"KEY":["hunter2"]}"#, br#"["hunter2"]"#] {
            let error = env::parse(text).unwrap_err();
            let said = format!("{error} {error:?}");
            assert!(!said.contains("hunter2"), "{said}");
            assert!(error.to_string().starts_with("not a JSON object of strings (line 1, column "), "{error}");
        }
    }

    #[test]
    fn a_token_file_is_the_bare_token() {
        assert_eq!(token::parse("v1.abc.def\n"), "v1.abc.def");
        assert_eq!(token::FILE, "token");
    }

    #[test]
    fn flags_and_variables_are_spelled_as_both_sides_always_have() {
        let flags = [flag::TOKEN_FILE, flag::ENV_FILE, flag::BEGAN_FILE, flag::EXIT_FILE].map(flag::arg);
        assert_eq!(flags, ["--token-file", "--env-file", "--began-file", "--exit-file"]);
        assert_eq!(
            [var::SANDBOX_ID, var::SANDBOX_NAME, var::GENERATION, var::RUNTIME_TOKEN, var::SUPERVISOR_GATEWAY],
            [
                "BERTH_SANDBOX_ID",
                "BERTH_SANDBOX_NAME",
                "BERTH_GENERATION",
                "BERTH_RUNTIME_TOKEN",
                "BERTH_SUPERVISOR_GATEWAY"
            ]
        );
        assert_eq!(var::KEPT_FROM_COMMAND, ["BERTH_RUNTIME_TOKEN", "BERTH_SUPERVISOR_GATEWAY"]);
        assert_eq!(var::KEPT_FROM_EXEC, ["BERTH_RUNTIME_TOKEN", "BERTH_SUPERVISOR_GATEWAY", "BERTH_GENERATION"]);
    }

    #[test]
    fn a_written_file_replaces_the_old_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(exit::FILE);
        write(&path, b"old").unwrap();
        write(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert!(!dir.path().join("exit.tmp").exists());
        assert!(write(&dir.path().join("gone").join(began::FILE), b"1").is_err(), "no folder, no file");
    }
}
