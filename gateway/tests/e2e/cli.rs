//! The `berth` CLI against a real gateway.

use std::process::Output;

use crate::harness::*;

/// The CLI on `data`'s gateway, with what its environment could choose instead removed.
fn cli(data: &DataDir, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(bin("berth"));
    command.arg("--data-dir").arg(&data.path).args(args).env_remove("BERTH_GATEWAY").env_remove("BERTH_TOKEN");
    command
}

pub(crate) async fn berth(data: &DataDir, args: &[&str]) -> Output {
    cli(data, args).env("CLI_SECRET", "from-the-environment").output().await.unwrap()
}

/// [`berth`], with `stdin` written to its standard input and then closed.
pub(crate) async fn berth_with_stdin(data: &DataDir, args: &[&str], stdin: &[u8]) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut child = cli(data, args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    child.wait_with_output().await.unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(&ok(out)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_drives_a_sandbox_through_its_lifecycle() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;

    let created =
        berth(&data, &["-o", "json", "sandbox", "create", "web", "--label", "team=a", "--", "sleep", "3600"]).await;
    let created = json(&created);
    assert_eq!((created["phase"].as_str(), created["generation"].as_u64()), (Some("Ready"), Some(1)));

    let table = ok(&berth(&data, &["sandbox", "list", "--selector", "team=a"]).await);
    assert!(table.starts_with("NAME") && table.contains("web") && table.contains("Ready"), "{table}");
    assert!(!ok(&berth(&data, &["sandbox", "list", "--selector", "team=b"]).await).contains("web"));

    let provider = json(
        &berth(
            &data,
            &["-o", "json", "provider", "create", "p", "--kind", "llm", "--credential-from-env", "CLI_SECRET"],
        )
        .await,
    );
    assert_eq!(provider["credential_names"], serde_json::json!(["CLI_SECRET"]));
    ok(&berth(&data, &["provider", "attach", "web", "p"]).await);

    let stopped = json(&berth(&data, &["-o", "json", "sandbox", "stop", "web"]).await);
    assert_eq!(stopped["phase"], "Stopped");
    let started = json(&berth(&data, &["-o", "json", "sandbox", "start", "web"]).await);
    assert_eq!((started["phase"].as_str(), started["generation"].as_u64()), (Some("Ready"), Some(2)));
    let got = json(&berth(&data, &["-o", "json", "sandbox", "get", "web"]).await);
    assert_eq!(got["providers"], serde_json::json!(["p"]));

    // Pause and resume; a checkpoint, which the process driver never makes, is refused saying
    // why.
    let paused = json(&berth(&data, &["-o", "json", "sandbox", "pause", "web"]).await);
    assert_eq!((paused["phase"].as_str(), paused["checkpoint"].as_bool()), (Some("Paused"), Some(false)));
    ok(&berth(&data, &["sandbox", "resume", "web"]).await);
    let no_checkpoint = berth(&data, &["sandbox", "pause", "web", "--checkpoint"]).await;
    assert_eq!(no_checkpoint.status.code(), Some(1));
    let said = String::from_utf8_lossy(&no_checkpoint.stderr);
    assert!(
        said.contains("FailedPrecondition") && said.contains("the process driver cannot checkpoint here"),
        "{said}"
    );
    assert_eq!(json(&berth(&data, &["-o", "json", "sandbox", "get", "web"]).await)["phase"], "Ready");

    let refused = berth(&data, &["provider", "delete", "p"]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("FailedPrecondition"), "{refused:?}");

    assert!(ok(&berth(&data, &["sandbox", "delete", "web"]).await).contains("deleted"));
    ok(&berth(&data, &["provider", "delete", "p"]).await);

    let missing = berth(&data, &["sandbox", "stop", "web"]).await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("NotFound"), "{missing:?}");
    let no_wait =
        json(&berth(&data, &["-o", "json", "sandbox", "create", "quick", "--no-wait", "--", "sleep", "3600"]).await);
    assert_eq!(no_wait["phase"], "Provisioning");
}

/// DESIGN 12.2 and 12.3 from the CLI: a snapshot taken, listed and shown with its users, a
/// sandbox made from it with the files it copied, a fork of two, and the deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_snapshots_forks_and_makes_sandboxes_from_snapshots() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    let writer = ["sandbox", "create", "src", "--", "sh", "-c", "[ -f f ] || echo one > f; exec sleep 3600"];
    ok(&berth(&data, &writer).await);
    let snap = json(&berth(&data, &["-o", "json", "snapshot", "create", "s1", "--from", "src"]).await);
    assert_eq!((snap["phase"].as_str(), snap["source"].as_str()), (Some("Ready"), Some("src")), "{snap}");
    ok(&berth(&data, &["sandbox", "exec", "src", "--", "sh", "-c", "echo two > f"]).await);

    let copy =
        json(&berth(&data, &["-o", "json", "sandbox", "create", "copy", "--from-snapshot", "s1", "-l", "k=v"]).await);
    assert_eq!(copy["phase"], "Ready", "{copy}");
    assert_eq!(ok(&berth(&data, &["sandbox", "exec", "copy", "--", "cat", "f"]).await), "one\n");
    // Only labels and providers go with a snapshot: the rest of the spec is the snapshot's.
    let refused = berth(&data, &["sandbox", "create", "bad", "--from-snapshot", "s1", "--", "sleep", "1"]).await;
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");

    let table = ok(&berth(&data, &["snapshot", "list"]).await);
    assert!(table.starts_with("NAME") && table.contains("s1") && table.contains("copy"), "{table}");
    let got = json(&berth(&data, &["-o", "json", "snapshot", "get", "s1"]).await);
    assert_eq!(got["users"], serde_json::json!(["copy"]));

    let forks = json(&berth(&data, &["-o", "json", "sandbox", "fork", "src", "--count", "2"]).await);
    let names: Vec<&str> = forks.as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["src-1", "src-2"], "{forks}");
    assert_eq!(ok(&berth(&data, &["sandbox", "exec", "src-2", "--", "cat", "f"]).await), "two\n");

    assert!(ok(&berth(&data, &["snapshot", "delete", "s1"]).await).contains("deleted"));
    let missing = berth(&data, &["snapshot", "get", "s1"]).await;
    assert!(String::from_utf8_lossy(&missing.stderr).contains("NotFound"), "{missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_makes_mounts_and_deletes_volumes() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    let made = json(&berth(&data, &["-o", "json", "volume", "create", "cache"]).await);
    assert_eq!((made["name"].as_str(), made["phase"].as_str()), (Some("cache"), Some("Ready")), "{made}");
    let writer = ["sandbox", "create", "w", "--volume", "cache:/cache", "--volume", "cache:/ro:ro", "--"];
    let script = ["sh", "-c", "echo kept > \"$BERTH_MOUNTS/cache/f\"; exec sleep 3600"];
    let created = json(&berth(&data, &[&["-o", "json"][..], &writer, &script].concat()).await);
    let mounts = &created["spec"]["volumes"];
    assert_eq!(mounts[1], serde_json::json!({"volume": "cache", "path": "/ro", "read_only": true}), "{created}");
    let bad = berth(&data, &["sandbox", "create", "x", "--volume", "cache", "--", "true"]).await;
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");

    let table = ok(&berth(&data, &["volume", "list"]).await);
    assert!(table.starts_with("NAME") && table.contains("cache") && table.contains(" w"), "{table}");
    let refused = berth(&data, &["volume", "delete", "cache"]).await;
    assert_ne!(refused.status.code(), Some(0), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("mounted by sandbox(es): w"), "{refused:?}");
    // The delete of its user, then its own, without waiting in between: taken, and complete.
    ok(&berth(&data, &["sandbox", "delete", "w", "--no-wait"]).await);
    assert!(ok(&berth(&data, &["volume", "delete", "cache"]).await).contains("deleted"));
    let missing = berth(&data, &["volume", "get", "cache"]).await;
    assert!(String::from_utf8_lossy(&missing.stderr).contains("NotFound"), "{missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_fails_when_the_sandbox_lands_in_error() {
    let data = DataDir::new();
    // A "supervisor" that exits 1 at once and never connects: every run fails before Ready.
    let _gateway = Gateway::start(&data, &["--supervisor-bin", "/bin/false"]).await;
    let out = berth(&data, &["sandbox", "create", "broken", "--", "sleep", "3600"]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("'broken' failed: ContainerExited"), "{stderr}");
    let got = json(&berth(&data, &["-o", "json", "sandbox", "get", "broken"]).await);
    assert_eq!((got["phase"].as_str(), got["failure"]["exit_code"].as_i64()), (Some("Error"), Some(1)));
}

/// Defect 8 of issue 13: `create -- <a command that does not exist>` printed Ready and exited 0;
/// the cause was only in a file under the data directory. It must fail, with the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_fails_with_the_cause_when_the_command_cannot_be_started() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    let out = berth(&data, &["sandbox", "create", "typo", "--", "no-such-command-berth"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("CommandFailedToStart") && stderr.contains("no-such-command-berth"), "{stderr}");
    // A command that runs and exits 0 has completed: create succeeds (whether or not its
    // supervisor said hello before the exit), and the sandbox says Completed.
    let done = json(&berth(&data, &["-o", "json", "sandbox", "create", "once", "--", "sh", "-c", "exit 0"]).await);
    assert!(done["phase"] == "Ready" || done["completed"] == true, "{done}");
    let mut table = String::new();
    for _ in 0..100 {
        table = ok(&berth(&data, &["sandbox", "get", "once"]).await);
        if table.contains("Completed (exit 0)") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(table.contains("Stopped") && table.contains("Completed (exit 0)"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_runs_commands_reads_logs_and_copies_files() {
    use std::os::unix::fs::PermissionsExt;
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    let booting = ["sandbox", "create", "box", "--", "sh", "-c", "echo booted; echo careful >&2; exec sleep 3600"];
    ok(&berth(&data, &booting).await);

    // The exit status and both streams pass through.
    let out = berth(&data, &["sandbox", "exec", "box", "--", "sh", "-c", "echo hi; echo there >&2; exit 3"]).await;
    assert_eq!(
        (out.status.code(), out.stdout.as_slice(), out.stderr.as_slice()),
        (Some(3), &b"hi\n"[..], &b"there\n"[..])
    );

    let mut logs = berth(&data, &["sandbox", "logs", "box"]).await;
    for _ in 0..50 {
        if !logs.stdout.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        logs = berth(&data, &["sandbox", "logs", "box"]).await;
    }
    assert_eq!((ok(&logs).as_str(), logs.stderr.as_slice()), ("booted\n", &b"careful\n"[..]));

    // A tree out of the host and back, with its modes and its link.
    let local = tempfile::tempdir().unwrap();
    let tree = local.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(tree.join("sub/b.sh"), "#!/bin/sh\necho beta\n").unwrap();
    std::fs::set_permissions(tree.join("sub/b.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("a.txt", tree.join("link")).unwrap();
    // Where nothing is, the tree lands as the destination (docker cp's rule).
    ok(&berth(&data, &["sandbox", "cp", tree.to_str().unwrap(), "box:/workspace/in"]).await);
    let ran = berth(&data, &["sandbox", "exec", "box", "--", "sh", "-c", "./in/sub/b.sh; cat in/link"]).await;
    assert_eq!(ok(&ran), "beta\nalpha\n");

    ok(&berth(&data, &["sandbox", "stop", "box"]).await);
    assert_eq!(ok(&berth(&data, &["sandbox", "logs", "box", "--generation", "1"]).await), "booted\n");
    let back = local.path().join("back");
    ok(&berth(&data, &["sandbox", "cp", "box:in", back.to_str().unwrap()]).await);
    assert_eq!(std::fs::read_to_string(back.join("sub/b.sh")).unwrap(), "#!/bin/sh\necho beta\n");
    assert_eq!(std::fs::metadata(back.join("sub/b.sh")).unwrap().permissions().mode() & 0o777, 0o750);
    assert_eq!(std::fs::read_link(back.join("link")).unwrap(), std::path::Path::new("a.txt"));
    let refused = berth(&data, &["sandbox", "cp", "box:../../etc/passwd", back.to_str().unwrap()]).await;
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("path"));
    ok(&berth(&data, &["sandbox", "delete", "box"]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_lifetimes_restart_policies_and_claims_from_pools() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;

    let created = json(
        &berth(
            &data,
            &[
                "-o",
                "json",
                "sandbox",
                "create",
                "job",
                "--ttl",
                "10m",
                "--idle-timeout",
                "5m",
                "--on-expiry",
                "delete",
                "--on-idle",
                "pause",
                "--restart",
                "on-failure",
            ]
            .into_iter()
            .chain(["--max-restarts", "3", "--restart-backoff", "500ms", "--", "sleep", "3600"])
            .collect::<Vec<_>>(),
        )
        .await,
    );
    assert_eq!(
        created["spec"]["lifetime"],
        serde_json::json!({"ttl_ms": 600_000, "idle_timeout_ms": 300_000, "on_expiry": "delete", "on_idle": "pause"})
    );
    assert_eq!(created["active_at_unix_ms"], created["created_at_unix_ms"], "the idle clock runs from the create");
    assert_eq!(created["spec"]["restart"]["mode"], "on-failure");
    assert_eq!(
        (created["spec"]["restart"]["max_restarts"].as_u64(), created["restart_count"].as_u64()),
        (Some(3), Some(0))
    );
    let deadline = created["deadline_unix_ms"].as_i64().unwrap();
    assert_eq!(deadline - created["created_at_unix_ms"].as_i64().unwrap(), 600_000);
    let renewed = json(&berth(&data, &["-o", "json", "sandbox", "renew", "job", "--ttl", "1h"]).await);
    assert!(renewed["deadline_unix_ms"].as_i64().unwrap() > deadline + 3_000_000, "{renewed}");
    let table = ok(&berth(&data, &["sandbox", "list"]).await);
    assert!(table.contains("DEADLINE") && table.contains("RESTARTS"), "{table}");

    let template = json(
        &berth(&data, &["-o", "json", "template", "create", "agents", "--min-ready", "2", "--", "sleep", "3600"]).await,
    );
    assert_eq!(template["pool"]["min_ready"], 2);
    let mut pool = serde_json::Value::Null;
    for _ in 0..100 {
        pool = json(&berth(&data, &["-o", "json", "pool", "get", "agents"]).await);
        if pool["ready"] == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(pool["ready"], 2, "{pool}");
    let claimed = json(&berth(&data, &["-o", "json", "sandbox", "claim", "agents", "--label", "run=r1"]).await);
    assert_eq!(
        (claimed["phase"].as_str(), claimed["template"].as_str(), claimed["pool_member"].as_bool()),
        (Some("Ready"), Some("agents"), Some(false))
    );
    assert_eq!(claimed["spec"]["labels"]["run"], "r1");
    let listed = ok(&berth(&data, &["template", "list"]).await);
    assert!(listed.starts_with("NAME") && listed.contains("agents"), "{listed}");
    ok(&berth(&data, &["pool", "set", "agents", "--min-ready", "0"]).await);
    ok(&berth(&data, &["template", "delete", "agents"]).await);
    let gone = berth(&data, &["template", "get", "agents"]).await;
    assert!(!gone.status.success() && String::from_utf8_lossy(&gone.stderr).contains("NotFound"));
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What a new user met (issue 17): a gateway started with `--name`, an address without a
/// scheme, an unreachable gateway, output piped into `head`, a start of a Ready sandbox, Ctrl-C
/// while waiting, versions, completions, a token file older than `--api-token`, and the
/// gateway's settings in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_finds_its_gateway_and_says_what_happened() {
    let data = DataDir::new();
    // A token file from an earlier run, then a gateway given its token by flag.
    std::fs::write(data.path.join("api-token"), "an-old-token-from-before-0000").unwrap();
    let token = "the-token-given-by-flag-0123456789";
    let _gateway = Gateway::start(&data, &["--name", "alpha", "--api-token", token, "--stop-grace", "30s"]).await;
    // The only gateway of the data directory, found by its address file, with the flag's token.
    assert!(ok(&berth(&data, &["sandbox", "list"]).await).starts_with("NAME"));
    assert!(ok(&berth(&data, &["--name", "alpha", "sandbox", "list"]).await).starts_with("NAME"));
    let log = data.log_of("alpha");
    assert!(log.contains("berth-gateway starting") && log.contains("api_token: <given>"), "{log}");
    assert!(!log.contains(token), "the token never reaches the log");
    let beta = berth(&data, &["--name", "beta", "sandbox", "list"]).await;
    assert!(stderr(&beta).contains("no gateway named \"beta\""), "{beta:?}");
    // An address without a scheme is plain HTTP.
    let address = std::fs::read_to_string(data.path.join("alpha.addr")).unwrap();
    let bare = address.trim().trim_start_matches("http://").to_string();
    assert!(ok(&berth(&data, &["--gateway", &bare, "sandbox", "list"]).await).starts_with("NAME"));
    let refused = berth(&data, &["--gateway", "127.0.0.1:1", "sandbox", "list"]).await;
    let message = stderr(&refused);
    assert!(message.contains("(from --gateway)") && message.contains("is it running?"), "{message}");
    assert!(message.to_lowercase().contains("connection refused"), "the cause, not only 'transport error': {message}");

    // Versions and completions.
    let version = ok(&berth(&data, &["version"]).await);
    let v = env!("CARGO_PKG_VERSION");
    assert!(
        version.contains(&format!("client {v}"))
            && version.contains(&format!("gateway {v} (alpha, sqlite store, process driver)")),
        "{version}"
    );
    // As JSON: one document, nothing before it; with no gateway, the client's alone.
    let version = json(&berth(&data, &["-o", "json", "version"]).await);
    assert_eq!((version["client"].as_str(), version["gateway"]["name"].as_str()), (Some(v), Some("alpha")));
    let alone = berth(&data, &["-o", "json", "--gateway", "127.0.0.1:1", "version"]).await;
    assert!(!alone.status.success());
    let alone: serde_json::Value = serde_json::from_slice(&alone.stdout).unwrap();
    assert_eq!(alone, serde_json::json!({"client": v, "gateway": null}));
    let completions = ok(&berth(&data, &["completions", "bash"]).await);
    assert!(completions.contains("_berth") && completions.contains("sandbox"), "{}", &completions[..200]);

    // A start of a Ready sandbox says so.
    ok(&berth(&data, &["sandbox", "create", "web", "--", "sh", "-c", "trap '' TERM; sleep 3600"]).await);
    let again = berth(&data, &["sandbox", "start", "web"]).await;
    assert!(again.status.success() && stderr(&again).contains("sandbox 'web' is already Ready"), "{again:?}");

    // Output whose reader went: a quiet end, not a panic.
    for i in 0..3 {
        ok(&berth(&data, &["sandbox", "create", &format!("more-{i}"), "--no-wait", "--", "sleep", "3600"]).await);
    }
    let mut piped = tokio::process::Command::new(bin("berth"))
        .args(["--data-dir", data.path.to_str().unwrap(), "sandbox", "list"])
        .env_remove("BERTH_GATEWAY")
        .env_remove("BERTH_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(piped.stdout.take());
    let ended = piped.wait_with_output().await.unwrap();
    assert_eq!(ended.status.code(), Some(0), "{}", stderr(&ended));
    assert!(!stderr(&ended).contains("panicked"), "{}", stderr(&ended));

    // Ctrl-C while a stop waits out the command's grace: the CLI says the stop goes on.
    let stopping = tokio::process::Command::new(bin("berth"))
        .args(["--data-dir", data.path.to_str().unwrap(), "sandbox", "stop", "web"])
        .env_remove("BERTH_GATEWAY")
        .env_remove("BERTH_TOKEN")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let pid = nix::unistd::Pid::from_raw(stopping.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let interrupted = stopping.wait_with_output().await.unwrap();
    assert_eq!(interrupted.status.code(), Some(130));
    assert!(stderr(&interrupted).contains("the gateway carries on with 'web'"), "{}", stderr(&interrupted));
}

/// Several gateways have run from one data directory: the CLI asks which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_asks_which_gateway_when_several_have_run_from_its_data_directory() {
    let data = DataDir::new();
    std::fs::write(data.path.join("alpha.addr"), "http://127.0.0.1:1\n").unwrap();
    std::fs::write(data.path.join("beta.addr"), "http://127.0.0.1:2\n").unwrap();
    std::fs::write(data.path.join("api-token"), "a-token-of-sixteen-or-more").unwrap();
    let out = berth(&data, &["sandbox", "list"]).await;
    assert!(stderr(&out).contains("several gateways have run from") && stderr(&out).contains("alpha, beta"), "{out:?}");
}

/// `berth sandbox watch` without a name: the listing, then every change to any sandbox the
/// selector picks, through a gateway killed and restarted (at another port) meanwhile, with
/// every version printed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_watches_the_fleet_through_a_gateway_restart() {
    use tokio::io::AsyncBufReadExt;

    let data = DataDir::new();
    let mut gateway = Gateway::start(&data, &[]).await;
    ok(&berth(&data, &["sandbox", "create", "listed", "--label", "team=a", "--", "sleep", "3600"]).await);
    ok(&berth(&data, &["sandbox", "create", "other", "--label", "team=b", "--", "sleep", "3600"]).await);
    let mut watch = tokio::process::Command::new(bin("berth"))
        .arg("--data-dir")
        .arg(&data.path)
        .args(["-o", "json", "sandbox", "watch", "--selector", "team=a"])
        .env_remove("BERTH_GATEWAY")
        .env_remove("BERTH_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let mut stdout = tokio::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stdout.next_line().await {
            let _ = lines_tx.send(serde_json::from_str::<serde_json::Value>(&line).unwrap());
        }
    });
    let mut printed = Vec::new();
    let mut until = async |printed: &mut Vec<serde_json::Value>, name: &str, phase: Option<&str>| {
        let wait = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while let Some(line) = lines.recv().await {
                let done = line["name"] == name
                    && match phase {
                        Some(p) => line["phase"] == p,
                        None => line["removed"] == true,
                    };
                printed.push(line);
                if done {
                    return;
                }
            }
        });
        assert!(wait.await.is_ok(), "waiting for {name} {phase:?}; printed {printed:#?}");
    };
    until(&mut printed, "listed", Some("Ready")).await;
    ok(&berth(&data, &["sandbox", "create", "before", "--label", "team=a", "--", "sleep", "3600"]).await);
    until(&mut printed, "before", Some("Ready")).await;

    gateway.kill9();
    // Changes while the gateway is down cannot happen; those right after it is back must come.
    let gateway = Gateway::start(&data, &[]).await;
    ok(&berth(&data, &["sandbox", "create", "after", "--label", "team=a", "--", "sleep", "3600"]).await);
    until(&mut printed, "after", Some("Ready")).await;
    ok(&berth(&data, &["sandbox", "delete", "before"]).await);
    until(&mut printed, "before", None).await;
    drop(gateway);
    watch.kill().await.unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut watch.stderr.take().unwrap(), &mut stderr).await.unwrap();
    assert!(stderr.contains("lost the gateway") && stderr.contains("reconnected"), "says what it did: {stderr}");

    assert!(printed.iter().all(|l| l["name"] != "other"), "the selector holds: {printed:#?}");
    let versions = |name: &str| -> Vec<u64> {
        printed
            .iter()
            .filter(|l| l["name"] == name && l["removed"] != true)
            .map(|l| l["resource_version"].as_u64().unwrap())
            .collect()
    };
    // The listing's line for "listed", then nothing of it (it did not change); the others whole.
    assert_eq!(versions("listed").len(), 1, "{printed:#?}");
    for name in ["before", "after"] {
        let got = versions(name);
        assert_eq!(got, (1..=got.len() as u64).collect::<Vec<_>>(), "{name}: every version once: {printed:#?}");
    }
    assert_eq!(printed.iter().filter(|l| l["removed"] == true).count(), 1);
}

/// `berth sandbox delete` stops the sandbox with its grace first: a workload that takes a
/// second to finish on TERM gets to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_delete_gives_the_sandbox_its_stop_grace() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    let marker = data.path.join("finished");
    let script =
        format!("trap 'sleep 1; echo finished > {}; exit 0' TERM; while :; do sleep 0.1; done", marker.display());
    ok(&berth(&data, &["sandbox", "create", "slow", "--", "sh", "-c", &script]).await);
    let out = ok(&berth(&data, &["sandbox", "delete", "slow"]).await);
    assert!(out.contains("slow"), "{out}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap_or_default().trim(), "finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_limits_and_says_when_a_run_ran_out_of_memory() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    let args = ["-o", "json", "sandbox", "create", "capped", "--cpus", "0.5", "--memory", "64Mi", "--pids", "128"];
    let created = json(&berth(&data, &[&args[..], &["--", "sleep", "3600"]].concat()).await);
    assert_eq!(
        created["spec"]["limits"],
        serde_json::json!({"cpu_millis": 500, "memory_bytes": 64 << 20, "pids": 128})
    );
    // Refused by the CLI before any call, naming the flag.
    let out = berth(&data, &["sandbox", "create", "bad", "--memory", "lots", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--memory"), "{}", String::from_utf8_lossy(&out.stderr));
    // Refused by the gateway, naming the field.
    let out = berth(&data, &["sandbox", "create", "tiny", "--memory", "1Ki", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.limits.memory_bytes"));
    let hog = [
        "sandbox",
        "create",
        "hog",
        "--memory",
        "32Mi",
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/dev/null bs=256M count=1",
    ];
    // Ready first or not (the supervisor may connect before the kill), it ends in Error.
    berth(&data, &hog).await;
    let mut got = json(&berth(&data, &["-o", "json", "sandbox", "get", "hog"]).await);
    for _ in 0..200 {
        if got["phase"] == "Error" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        got = json(&berth(&data, &["-o", "json", "sandbox", "get", "hog"]).await);
    }
    assert_eq!(got["failure"]["reason"], "OutOfMemory", "{got}");
    let message = got["failure"]["message"].as_str().unwrap();
    assert!(message.contains(&(32u64 << 20).to_string()), "{message}");
    let table = ok(&berth(&data, &["sandbox", "get", "hog"]).await);
    assert!(table.contains("OutOfMemory"), "{table}");

    // An exec killed for memory says so, naming the sandbox's limit; the sandbox runs on.
    let hog = ["sandbox", "exec", "capped", "--", "dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"];
    let out = berth(&data, &hog).await;
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    let why = stderr(&out);
    assert!(why.contains("killed for memory") && why.contains(&(64u64 << 20).to_string()), "{why}");
    let capped = json(&berth(&data, &["-o", "json", "sandbox", "get", "capped"]).await);
    assert_eq!(capped["phase"], "Ready", "{capped}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_names_egress_entries_and_provider_endpoints() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    let args = ["-o", "json", "provider", "create", "api", "--kind", "http", "--endpoint", "api.test"];
    let created = json(&berth(&data, &[&args[..], &["--endpoint", "10.0.0.0/8"]].concat()).await);
    assert_eq!(created["endpoints"], serde_json::json!(["api.test", "10.0.0.0/8"]));
    let out = berth(&data, &["provider", "create", "bad", "--kind", "http", "--endpoint", "no such host"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("endpoints[0]"), "{}", String::from_utf8_lossy(&out.stderr));
    // This gateway runs the process driver: a list is refused, naming the field.
    let out = berth(&data, &["sandbox", "create", "net", "--allow", "api.test", "--", "sleep", "3600"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("spec.egress.allow"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let args = ["-o", "json", "sandbox", "create", "agent", "--provider", "api", "--", "sleep", "3600"];
    let agent = json(&berth(&data, &args).await);
    assert_eq!(agent["egress_providers"], serde_json::json!(["api"]));
}

/// A `berth` whose output is read as it comes.
struct Following {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Following {
    fn spawn(data: &DataDir, args: &[&str]) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut child = cli(data, args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                let _ = tx.send(line);
            }
        });
        Self { child, lines }
    }

    async fn first_line(&mut self) -> String {
        let line = tokio::time::timeout(std::time::Duration::from_secs(30), self.lines.recv()).await;
        line.expect("a line within 30 s").expect("a line before the end")
    }

    /// Its exit status, every line it printed after `first`, and its stderr.
    async fn end(mut self, first: String) -> (Option<i32>, Vec<String>, String) {
        let status = tokio::time::timeout(std::time::Duration::from_secs(60), self.child.wait()).await;
        let status = status.expect("it ends within 60 s").unwrap();
        let mut stderr = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut self.child.stderr.take().unwrap(), &mut stderr).await.unwrap();
        let mut lines = vec![first];
        while let Some(line) = self.lines.recv().await {
            lines.push(line);
        }
        (status.code(), lines, stderr)
    }
}

/// Issue 38: `berth sandbox logs -f` and `berth sandbox exec`, open while their gateway stops
/// gracefully (their streams end with UNAVAILABLE) and starts again elsewhere, reconnect and
/// read on from the offset they got to: their output is whole, in order, nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_follows_logs_and_execs_through_a_gateway_restart() {
    follows_through_a_restart(false).await;
}

/// As above, the gateway SIGKILLed mid-stream: its connections cut with no goodbye.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_follows_logs_and_execs_through_a_gateway_killed_mid_stream() {
    follows_through_a_restart(true).await;
}

async fn follows_through_a_restart(killed: bool) {
    let data = DataDir::new();
    let mut gateway = Gateway::start(&data, &[]).await;
    let counting = |prefix: &str| format!("for i in $(seq 0 39); do echo {prefix}-$i; sleep 0.25; done");
    let main = format!("{}; exec sleep 3600", counting("line"));
    ok(&berth(&data, &["sandbox", "create", "box", "--", "sh", "-c", &main]).await);
    let mut logs = Following::spawn(&data, &["sandbox", "logs", "-f", "box"]);
    let mut exec = Following::spawn(&data, &["sandbox", "exec", "box", "--", "sh", "-c", &counting("exec")]);
    let mut watch = Following::spawn(&data, &["-o", "json", "sandbox", "watch", "box"]);
    let (logs_first, exec_first) = (logs.first_line().await, exec.first_line().await);
    let watched: serde_json::Value = serde_json::from_str(&watch.first_line().await).unwrap();
    assert_eq!(watched["phase"], "Ready", "{watched}");

    if killed {
        gateway.kill9();
    } else {
        gateway.sigterm();
        let exited = gateway.exit_within(std::time::Duration::from_secs(20)).await;
        assert!(exited.is_some_and(|s| s.success()), "{exited:?}:\n{}", data.log());
    }
    let _gateway = Gateway::start(&data, &[]).await;

    let (status, lines, stderr) = exec.end(exec_first).await;
    assert_eq!(status, Some(0), "{stderr}");
    assert_eq!(lines, (0..40).map(|i| format!("exec-{i}")).collect::<Vec<_>>(), "{stderr}");
    assert!(stderr.contains("lost the gateway") && stderr.contains("reconnected"), "says what it did: {stderr}");

    // The main command runs on (the logs follow it until its run ends): its 40 lines, once each.
    let want: Vec<String> = (0..40).map(|i| format!("line-{i}")).collect();
    let mut got = vec![logs_first];
    while got.len() < want.len() {
        match tokio::time::timeout(std::time::Duration::from_secs(30), logs.lines.recv()).await {
            Ok(Some(line)) => got.push(line),
            _ => break,
        }
    }
    assert_eq!(got, want);
    // Nothing after them, however long it follows.
    let more = tokio::time::timeout(std::time::Duration::from_secs(1), logs.lines.recv()).await;
    assert!(more.is_err(), "printed again: {more:?}");
    logs.child.kill().await.unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut logs.child.stderr.take().unwrap(), &mut stderr).await.unwrap();
    assert!(stderr.contains("lost the gateway") && stderr.contains("reconnected; reading on from offset"), "{stderr}");

    // The watch of the sandbox rode out the restart too: it sees a stop made after it.
    ok(&berth(&data, &["sandbox", "stop", "box"]).await);
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(30), watch.lines.recv()).await {
            Ok(Some(line)) => {
                let change: serde_json::Value = serde_json::from_str(&line).unwrap();
                if change["phase"] == "Stopped" {
                    break;
                }
                seen.push(line);
            }
            _ => panic!("the watch never saw the stop: {seen:?}"),
        }
    }
    watch.child.kill().await.unwrap();
}

#[tokio::test]
async fn a_gateway_that_takes_the_connection_and_never_answers_fails_the_call_saying_why() {
    let data = DataDir::new();
    // A listener that accepts and never says a word, as a hung gateway does.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut connections = Vec::new();
        while let Ok((connection, _)) = silent.accept().await {
            connections.push(connection);
        }
    });
    let args = ["--gateway", &address, "--token", "abcdefghijklmnopqrstuvwx", "sandbox", "list"];
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), berth(&data, &args)).await;
    let out = out.expect("the CLI still waits after a minute");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("keep-alive timed out"), "{stderr}");
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_takes_several_names_and_catches_a_docker_users_name_flag() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    for name in ["a", "b", "c"] {
        ok(&berth(&data, &["sandbox", "create", name, "--", "sleep", "3600"]).await);
    }
    ok(&berth(&data, &["sandbox", "stop", "a", "b"]).await);
    let phases = |listed: serde_json::Value| -> Vec<(String, String)> {
        let all = listed.as_array().cloned().unwrap_or_default();
        all.iter()
            .map(|s| (s["name"].as_str().unwrap().to_string(), s["phase"].as_str().unwrap().to_string()))
            .collect()
    };
    let listed = phases(json(&berth(&data, &["-o", "json", "sandbox", "list"]).await));
    let want = [("a", "Stopped"), ("b", "Stopped"), ("c", "Ready")].map(|(n, p)| (n.to_string(), p.to_string()));
    assert_eq!(listed, want);

    // A watch of one prints a header, then a line a change, in the header's columns, until it is
    // gone.
    let watch = tokio::process::Command::new(bin("berth"))
        .arg("--data-dir")
        .arg(&data.path)
        .args(["sandbox", "watch", "a"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    // One that fails is told, naming it; the others are still deleted; the command fails.
    let out = berth(&data, &["sandbox", "delete", "a", "missing", "b"]).await;
    assert!(!out.status.success());
    let why = stderr(&out);
    assert!(why.contains("error: missing: NotFound") && why.contains("1 of 3 failed: missing"), "{why}");
    let listed = phases(json(&berth(&data, &["-o", "json", "sandbox", "list"]).await));
    assert_eq!(listed, [("c".to_string(), "Ready".to_string())]);
    let watched = tokio::time::timeout(std::time::Duration::from_secs(20), watch.wait_with_output()).await;
    let watched = String::from_utf8(watched.expect("the watch outlived its sandbox").unwrap().stdout).unwrap();
    let lines: Vec<&str> = watched.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines.len() >= 3, "{watched}");
    let column = lines[0].find("PHASE").unwrap();
    assert!(
        lines[1..].iter().all(|l| l[column..].starts_with(|c: char| c.is_ascii_alphabetic() || c == '(')),
        "{watched}"
    );
    assert!(lines[1].contains("Stopped") && lines.last().unwrap().contains("(removed)"), "{watched}");
    let out = berth(&data, &["sandbox", "stop", "c", "c", "--expected-version", "1"]).await;
    assert!(stderr(&out).contains("--expected-version is one sandbox's version"), "{}", stderr(&out));

    // `--name` after create names the gateway: refused with the way to say it, nothing made.
    let out = berth(&data, &["sandbox", "create", "--name", "web", "--", "sleep", "1"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("berth sandbox create NAME -- COMMAND"), "{}", stderr(&out));
    let listed = phases(json(&berth(&data, &["-o", "json", "sandbox", "list"]).await));
    assert_eq!(listed.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_command_is_gone_at_once_fails_with_its_exit_code() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    let out = berth(&data, &["sandbox", "create", "f", "--", "false"]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("MainProcessExited, exit code 1"), "{}", stderr(&out));
    // Ready first, gone a moment later: caught by the settling watch, not reported Ready.
    let out = berth(&data, &["sandbox", "create", "g", "--settle", "5s", "--", "sh", "-c", "sleep 1; exit 4"]).await;
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr(&out).contains("exit code 4"), "{}", stderr(&out));
    // Without settling, Ready is reported as soon as it is.
    let out = berth(&data, &["sandbox", "create", "h", "--settle", "0s", "--", "sh", "-c", "sleep 3; exit 4"]).await;
    assert!(ok(&out).contains("Ready"));
    // A command that completes at once is a success.
    let out = berth(&data, &["sandbox", "create", "t", "--", "true"]).await;
    assert!(ok(&out).contains("Completed"));
    // A start of one gone at once fails the same way.
    let out = berth(&data, &["sandbox", "start", "f"]).await;
    assert!(stderr(&out).contains("exit code 1"), "{}", stderr(&out));
}

/// `berth --data-dir DATA ARGS` on a pseudo-terminal of its own, nothing ever typed: its exit
/// status within `limit` (`None`: still running), and what it wrote.
async fn on_terminal(data: &DataDir, args: &[&str], limit: std::time::Duration) -> (Option<i32>, String) {
    use tokio::io::AsyncReadExt;
    let (mut terminal, pts) = pty_process::open().unwrap();
    terminal.resize(pty_process::Size::new(24, 80)).unwrap();
    let mut child = pty_process::Command::new(bin("berth"))
        .arg("--data-dir")
        .arg(&data.path)
        .args(args)
        .kill_on_drop(true)
        .spawn(pts)
        .unwrap();
    let status = tokio::time::timeout(limit, child.wait()).await.ok().map(|s| s.unwrap().code().unwrap_or(-1));
    let mut written = vec![0; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(1), terminal.read(&mut written)).await;
    let n = n.ok().and_then(Result::ok).unwrap_or(0);
    (status, String::from_utf8_lossy(&written[..n]).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_exec_returns_when_its_command_ends_without_waiting_for_input() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    ok(&berth(&data, &["sandbox", "create", "box", "--", "sleep", "3600"]).await);
    let limit = std::time::Duration::from_secs(20);
    // A terminal nobody types into: -it, and -i.
    for flags in [&["-i", "-t"][..], &["-i"][..]] {
        let args = [&["sandbox", "exec"][..], flags, &["box", "--", "sh", "-c", "echo done; exit 3"]].concat();
        let (status, written) = on_terminal(&data, &args, limit).await;
        assert_eq!(status, Some(3), "{flags:?} still waits for input, or failed: {written}");
        assert!(written.contains("done"), "{written}");
    }
    // A pipe that stays open, as `sleep 60 | berth sandbox exec -i ...`.
    let mut child = tokio::process::Command::new(bin("berth"))
        .arg("--data-dir")
        .arg(&data.path)
        .args(["sandbox", "exec", "-i", "box", "--", "true"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let status = tokio::time::timeout(limit, child.wait()).await;
    assert_eq!(status.ok().map(|s| s.unwrap().code()), Some(Some(0)), "waits for its open stdin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_tail_prints_the_last_lines_then_follows() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    // `after` once the test puts `go` in its workspace.
    let main =
        "for i in 1 2 3 4 5; do echo line-$i; done; until [ -f go ]; do sleep 0.05; done; echo after; sleep 3600";
    let created = json(&berth(&data, &["-o", "json", "sandbox", "create", "box", "--", "sh", "-c", main]).await);
    let printed = |out: &Output| ok(out).lines().map(str::to_string).collect::<Vec<_>>();
    let mut tail = Vec::new();
    for _ in 0..100 {
        tail = printed(&berth(&data, &["sandbox", "logs", "box", "--tail", "2"]).await);
        if tail.last().is_some_and(|l| l == "line-5") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(tail, ["line-4", "line-5"]);
    assert_eq!(printed(&berth(&data, &["sandbox", "logs", "box", "-n", "9"]).await).len(), 5);
    assert!(printed(&berth(&data, &["sandbox", "logs", "box", "-n", "0"]).await).is_empty());
    // Following from the tail: the last line so far, then what comes after it.
    let mut follow = Following::spawn(&data, &["sandbox", "logs", "-f", "-n", "1", "box"]);
    assert_eq!(follow.first_line().await, "line-5");
    std::fs::write(data.workspace(created["id"].as_str().unwrap()).join("go"), "").unwrap();
    let next = tokio::time::timeout(std::time::Duration::from_secs(20), follow.lines.recv()).await;
    assert_eq!(next.ok().flatten().as_deref(), Some("after"));
    follow.child.kill().await.unwrap();
}

/// `berth sandbox cp` by docker cp's rules, each way: a file as the destination or into a
/// directory, a directory into one or as a new one, `DIR/.` for its contents, `-` for a tar
/// stream; and the refusals docker makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_follows_docker_cps_rules_both_ways() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    let created = json(&berth(&data, &["-o", "json", "sandbox", "create", "box", "--", "sleep", "3600"]).await);
    let workspace = data.workspace(created["id"].as_str().unwrap());
    let local = tempfile::tempdir().unwrap();
    let at = |p: &str| local.path().join(p).to_str().unwrap().to_string();
    std::fs::write(at("f.txt"), "file\n").unwrap();
    std::fs::create_dir_all(at("dir/sub")).unwrap();
    std::fs::write(at("dir/sub/x.txt"), "x\n").unwrap();
    std::fs::create_dir_all(workspace.join("existing")).unwrap();
    std::fs::write(workspace.join("old.txt"), "old\n").unwrap();
    let cp = |from: String, to: String| {
        let data = &data;
        async move { berth(data, &["sandbox", "cp", &from, &to]).await }
    };
    let read = |p: &str| std::fs::read_to_string(workspace.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));

    // Into the sandbox.
    ok(&cp(at("f.txt"), "box:newname".into()).await);
    assert_eq!(read("newname"), "file\n", "a file where nothing is lands as the destination");
    ok(&cp(at("f.txt"), "box:existing".into()).await);
    assert_eq!(read("existing/f.txt"), "file\n");
    ok(&cp(at("f.txt"), "box:old.txt".into()).await);
    assert_eq!(read("old.txt"), "file\n", "over a file");
    assert!(stderr(&cp(at("f.txt"), "box:nodir/".into()).await).contains("no such directory"));
    ok(&cp(at("dir"), "box:made".into()).await);
    assert_eq!(read("made/sub/x.txt"), "x\n", "a directory where nothing is lands as the destination");
    ok(&cp(at("dir"), "box:existing".into()).await);
    assert_eq!(read("existing/dir/sub/x.txt"), "x\n");
    ok(&cp(format!("{}/.", at("dir")), "box:existing".into()).await);
    assert_eq!(read("existing/sub/x.txt"), "x\n", "DIR/. copies the contents");
    assert!(stderr(&cp(at("dir"), "box:old.txt".into()).await).contains("onto the file"));

    // Out of it.
    ok(&cp("box:old.txt".into(), at("out.txt")).await);
    assert_eq!(std::fs::read_to_string(at("out.txt")).unwrap(), "file\n");
    std::fs::write(at("over.txt"), "before\n").unwrap();
    ok(&cp("box:old.txt".into(), at("over.txt")).await);
    assert_eq!(std::fs::read_to_string(at("over.txt")).unwrap(), "file\n", "over a local file");
    ok(&cp("box:made".into(), at("copy")).await);
    assert_eq!(std::fs::read_to_string(at("copy/sub/x.txt")).unwrap(), "x\n");
    ok(&cp("box:made".into(), at("copy")).await);
    assert_eq!(std::fs::read_to_string(at("copy/made/sub/x.txt")).unwrap(), "x\n", "into an existing directory");
    std::fs::create_dir_all(at("flat")).unwrap();
    ok(&cp("box:made/.".into(), at("flat")).await);
    assert_eq!(std::fs::read_to_string(at("flat/sub/x.txt")).unwrap(), "x\n");

    // `-`: a tar stream out on stdout, and in from stdin.
    let out = cp("box:existing".into(), "-".into()).await;
    let mut names: Vec<String> = tar::Archive::new(&out.stdout[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.contains(&"existing/dir/sub/x.txt".to_string()), "{names:?}");
    let mut piped = tokio::process::Command::new(bin("berth"))
        .arg("--data-dir")
        .arg(&data.path)
        .args(["sandbox", "cp", "-", "box:existing"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = piped.stdin.take().unwrap();
    let mut archive = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(6);
    header.set_mode(0o644);
    archive.append_data(&mut header, "piped.txt", &b"piped\n"[..]).unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, &archive.into_inner().unwrap()).await.unwrap();
    drop(stdin);
    ok(&piped.wait_with_output().await.unwrap());
    assert_eq!(read("existing/piped.txt"), "piped\n");
}

#[tokio::test]
async fn e2b_env_says_when_the_gateway_does_not_serve_e2bs_api() {
    let data = DataDir::new();
    let _gateway = Gateway::start(&data, &[]).await;
    let out = berth(&data, &["e2b", "env"]).await;
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && why.contains("does not serve E2B's API: start it with --e2b-listen"), "{why}");
}
