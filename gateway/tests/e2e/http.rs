//! The HTTP/JSON API (`--http-listen`), driven with curl as its documentation shows: creates,
//! reads, lifecycle commands, an exec's output as newline-delimited JSON, and every refusal as
//! its HTTP status with the gRPC code and the field named.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::*;

pub(crate) struct Curl {
    pub(crate) base: String,
    pub(crate) token: String,
}

impl Curl {
    /// `curl -X METHOD URL [-d BODY]` with the token (or `auth`): the HTTP status and the body.
    pub(crate) fn call(&self, method: &str, path: &str, body: Option<&str>, auth: Option<&str>) -> (u16, String) {
        let header =
            format!("authorization: {}", auth.map_or_else(|| format!("Bearer {}", self.token), str::to_string));
        let mut command = std::process::Command::new("curl");
        command.args(["-sS", "-X", method, "-H", &header, "-w", "\n%{http_code}"]);
        if let Some(body) = body {
            command.args(["-H", "content-type: application/json", "-d", body]);
        }
        let out = command.arg(format!("{}{path}", self.base)).output().expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (status.trim().parse().unwrap_or(0), body.to_string())
    }

    /// The sandbox `name` once it is in `phase` (the wire's name), within 10 s.
    async fn wait_phase(&self, name: &str, phase: &str) -> Value {
        let mut seen = Value::Null;
        for _ in 0..100 {
            seen = self.json("GET", &format!("/v1/sandboxes/{name}"), None).1;
            if seen["sandbox"]["phase"] == phase {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{name} never reached {phase}: {seen}");
    }

    fn json(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, text) = self.call(method, path, body, None);
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_drives_the_http_json_api() {
    let data = DataDir::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let gateway =
        Gateway::start(&data, &["--http-listen", &format!("127.0.0.1:{port}"), "--proxy-listen", &proxy.to_string()])
            .await;
    let curl = Curl { base: format!("http://127.0.0.1:{port}"), token: gateway.token.clone() };

    let (status, body) = curl.call("GET", "/v1/sandboxes", None, Some("Bearer wrong-token-0000000000"));
    assert_eq!(status, 401, "{body}");
    let (status, body) = curl.call("GET", "/v1/info", None, Some("nothing"));
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).unwrap()["code"].clone()),
        (401, json!("UNAUTHENTICATED"))
    );
    let (status, info) = curl.json("GET", "/v1/info", None);
    assert_eq!((status, info["store"].as_str()), (200, Some("sqlite")));

    // No image: the gateway's default, as the CLI and the SDK get it (the README's example).
    let create = r#"{"name": "web", "spec": {"command": ["sleep", "3600"], "labels": {"team": "a"}}}"#;
    let (status, created) = curl.json("POST", "/v1/sandboxes", Some(create));
    assert_eq!((status, created["sandbox"]["name"].as_str()), (200, Some("web")), "{created}");
    assert_eq!(created["sandbox"]["phase"], "PHASE_PROVISIONING");
    assert_eq!(created["sandbox"]["spec"]["image"], "host", "{created}");
    let ready = curl.wait_phase("web", "PHASE_READY").await;
    let (_, listed) = curl.json("GET", "/v1/sandboxes?selector=team=a", None);
    assert_eq!(listed["sandboxes"].as_array().map(Vec::len), Some(1), "{listed}");
    let (_, none) = curl.json("GET", "/v1/sandboxes?selector=team=b", None);
    assert_eq!(none["sandboxes"].as_array().map_or(0, Vec::len), 0, "{none}");

    // An exec: its output as newline-delimited JSON, then its end.
    let (status, text) =
        curl.call("POST", "/v1/sandboxes/web/execs", Some(r#"{"argv": ["sh", "-c", "echo hi; exit 3"]}"#), None);
    assert_eq!(status, 200, "{text}");
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines[0].get("admitted").is_some(), "{text}");
    assert!(lines.iter().any(|l| l["chunk"]["data"] == "aGkK"), "hi\\n in base64: {text}");
    let end = &lines.last().unwrap()["end"];
    assert_eq!((end["state"].as_str(), end["exit_code"].as_i64()), (Some("EXEC_STATE_EXITED"), Some(3)), "{text}");

    // A port's URL through the preview proxy, with its run's token.
    let (status, url) = curl.json("GET", "/v1/sandboxes/web/ports/8080/url", None);
    assert_eq!(status, 200, "{url}");
    let prefix = format!("http://{proxy}/sandboxes/web/ports/8080/?berth_token=berthp1.1.");
    assert!(url["url"].as_str().unwrap().starts_with(&prefix), "{url}");
    assert_eq!((url["generation"].as_str(), url["public"].as_bool()), (Some("1"), None), "{url}");

    // Refusals: the status, the gRPC code and the field.
    let refused = |method: &str, path: &str, body: Option<&str>| {
        let (status, body) = curl.json(method, path, body);
        (
            status,
            body["code"].as_str().unwrap_or_default().to_string(),
            body["message"].as_str().unwrap_or_default().to_string(),
        )
    };
    let (status, code, message) = refused("POST", "/v1/sandboxes", Some("{not json"));
    assert_eq!((status, code.as_str()), (400, "INVALID_ARGUMENT"));
    assert!(message.contains("invalid JSON body"), "{message}");
    let (status, _, message) = refused("POST", "/v1/sandboxes", Some(r#"{"nmae": "x"}"#));
    assert_eq!(status, 400);
    assert!(message.contains("nmae"), "the unknown field is named: {message}");
    let (status, _, message) =
        refused("POST", "/v1/sandboxes", Some(r#"{"name": "Bad_Name", "spec": {"command": ["true"]}}"#));
    assert_eq!(status, 400);
    assert!(message.contains("name"), "{message}");
    let negative = r#"{"name": "capped", "spec": {"command": ["true"], "limits": {"memory_bytes": -1}}}"#;
    let (status, code, message) = refused("POST", "/v1/sandboxes", Some(negative));
    assert_eq!((status, code.as_str()), (400, "INVALID_ARGUMENT"));
    assert!(message.contains("spec.limits.memory_bytes"), "{message}");
    let malformed = r#"{"name": "net", "spec": {"command": ["true"], "egress": {"allow": ["ok.test", "a b"]}}}"#;
    let (status, code, message) = refused("POST", "/v1/sandboxes", Some(malformed));
    assert_eq!((status, code.as_str()), (400, "INVALID_ARGUMENT"));
    assert!(message.contains("spec.egress.allow[1]"), "{message}");
    let version = ready["sandbox"]["resource_version"].as_str().unwrap().parse::<u64>().unwrap();
    let stale = format!(r#"{{"expected_resource_version": "{}"}}"#, version + 10);
    let (status, code, _) = refused("POST", "/v1/sandboxes/web/stop", Some(&stale));
    assert_eq!((status, code.as_str()), (409, "ABORTED"));
    let (status, code, _) = refused("GET", "/v1/sandboxes/missing", None);
    assert_eq!((status, code.as_str()), (404, "NOT_FOUND"));
    let (status, code, message) = refused("GET", "/v1/sandboxes/web/ports/0/url", None);
    assert_eq!((status, code.as_str()), (400, "INVALID_ARGUMENT"));
    assert!(message.contains("port: 0 is not a TCP port"), "{message}");
    let (status, code, _) = refused("POST", "/v1/sandboxes/web/execs", Some(r#"{"argv": ["cat"], "stdin": true}"#));
    assert_eq!((status, code.as_str()), (400, "INVALID_ARGUMENT"));
    // Nothing refused wrote. Not by comparing resource versions: the driver's start reply may
    // still land after Ready (a supervisor can connect before it is merged, as seen in CI), and
    // that write is the run's, not a refusal's.
    let (_, still) = curl.json("GET", "/v1/sandboxes/web", None);
    assert_eq!(
        (still["sandbox"]["intent"].as_str(), still["sandbox"]["phase"].as_str()),
        (Some("INTENT_RUNNING"), Some("PHASE_READY")),
        "the stale stop did not stop it: {still}"
    );
    let (_, all) = curl.json("GET", "/v1/sandboxes", None);
    let names: Vec<&str> = all["sandboxes"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["web"], "no refused create made a sandbox: {all}");
    let (_, execs) = curl.json("GET", "/v1/sandboxes/web/execs", None);
    assert_eq!(execs["execs"].as_array().map(Vec::len), Some(1), "the refused exec was not recorded: {execs}");

    // Pause and resume: the intent at once, the phase once the run is seen frozen (thawed).
    let (status, pausing) = curl.json("POST", "/v1/sandboxes/web/pause", None);
    assert_eq!((status, pausing["sandbox"]["intent"].as_str()), (200, Some("INTENT_PAUSED")), "{pausing}");
    let paused = curl.wait_phase("web", "PHASE_PAUSED").await;
    assert_eq!(paused["sandbox"]["generation"], ready["sandbox"]["generation"], "nothing restarted");
    let (status, code, message) = refused("POST", "/v1/sandboxes/web/start", None);
    assert_eq!((status, code.as_str()), (400, "FAILED_PRECONDITION"));
    assert!(message.contains("while it is Paused"), "{message}");
    let (status, resuming) = curl.json("POST", "/v1/sandboxes/web/resume", None);
    assert_eq!((status, resuming["sandbox"]["intent"].as_str()), (200, Some("INTENT_RUNNING")), "{resuming}");
    curl.wait_phase("web", "PHASE_READY").await;
    // A checkpoint, in the pause's body: the process driver never makes one, and says why.
    let (status, code, message) = refused("POST", "/v1/sandboxes/web/pause", Some(r#"{"checkpoint": true}"#));
    assert_eq!((status, code.as_str()), (400, "FAILED_PRECONDITION"));
    assert!(message.contains("the process driver cannot checkpoint here"), "{message}");
    let (status, code, message) = refused("POST", "/v1/sandboxes/web/freeze", None);
    assert_eq!((status, code.as_str()), (404, "NOT_FOUND"));
    assert!(message.contains("pause, resume"), "{message}");

    // Snapshots: taken, listed, made a sandbox from, forked, deleted.
    let body = r#"{"name": "snap", "sandbox": "web"}"#;
    let (status, snap) = curl.json("POST", "/v1/snapshots", Some(body));
    assert_eq!((status, snap["snapshot"]["phase"].as_str()), (200, Some("SNAPSHOT_PHASE_READY")), "{snap}");
    assert_eq!(snap["snapshot"]["sha256"].as_str().map(str::len), Some(64), "{snap}");
    let (status, code, _) = refused("POST", "/v1/snapshots", Some(body));
    assert_eq!((status, code.as_str()), (409, "ALREADY_EXISTS"));
    let copy = r#"{"name": "web-copy", "from_snapshot": "snap", "spec": {"labels": {"team": "b"}}}"#;
    let (status, made) = curl.json("POST", "/v1/sandboxes", Some(copy));
    assert_eq!((status, made["sandbox"]["from_snapshot"].as_str()), (200, Some("snap")), "{made}");
    curl.wait_phase("web-copy", "PHASE_READY").await;
    let (_, listed) = curl.json("GET", "/v1/snapshots", None);
    assert_eq!(listed["snapshots"][0]["users"], serde_json::json!(["web-copy"]), "{listed}");
    let (status, forked) = curl.json("POST", "/v1/sandboxes/web/fork", Some(r#"{"count": 2}"#));
    assert_eq!(status, 200, "{forked}");
    let names: Vec<&str> = forked["sandboxes"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["web-1", "web-2"], "{forked}");
    for name in ["web-copy", "web-1", "web-2"] {
        assert_eq!(curl.json("DELETE", &format!("/v1/sandboxes/{name}"), None).0, 200);
    }
    // Gone before the fleet watch below begins: the forks carry web's label `team=a`.
    for name in ["web-copy", "web-1", "web-2"] {
        let mut gone = false;
        for _ in 0..100 {
            if curl.json("GET", &format!("/v1/sandboxes/{name}"), None).0 == 404 {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(gone, "{name} is still there");
    }
    let (status, deleting) = curl.json("DELETE", "/v1/snapshots/snap", None);
    assert_eq!((status, deleting["snapshot"]["phase"].as_str()), (200, Some("SNAPSHOT_PHASE_DELETING")), "{deleting}");
    let (status, code, _) = refused("GET", "/v1/snapshots/nothing", None);
    assert_eq!((status, code.as_str()), (404, "NOT_FOUND"));

    // Volumes: made, mounted, refused while used, deleted after their user.
    let (status, made) = curl.json("POST", "/v1/volumes", Some(r#"{"name": "vol"}"#));
    assert_eq!((status, made["volume"]["phase"].as_str()), (200, Some("VOLUME_PHASE_READY")), "{made}");
    let user = r#"{"name": "vol-user", "spec": {"image": "host", "command": ["sleep", "3600"],
        "volumes": [{"volume": "vol", "path": "/data", "read_only": true}]}}"#;
    let (status, mounted) = curl.json("POST", "/v1/sandboxes", Some(user));
    assert_eq!(status, 200, "{mounted}");
    assert_eq!(mounted["sandbox"]["spec"]["volumes"][0]["read_only"], true, "{mounted}");
    let (status, code, message) = refused("DELETE", "/v1/volumes/vol", None);
    assert_eq!((status, code.as_str()), (400, "FAILED_PRECONDITION"));
    assert!(message.contains("vol-user"), "{message}");
    let bad = r#"{"name": "bad-mount", "spec": {"image": "host", "command": ["true"],
        "volumes": [{"volume": "vol", "path": "relative"}]}}"#;
    let (status, code, message) = refused("POST", "/v1/sandboxes", Some(bad));
    assert_eq!((status, code.as_str()), (400, "INVALID_ARGUMENT"));
    assert!(message.contains("spec.volumes[0].path"), "{message}");
    let (_, listed) = curl.json("GET", "/v1/volumes", None);
    assert_eq!(listed["volumes"][0]["users"], serde_json::json!(["vol-user"]), "{listed}");
    assert_eq!(curl.json("DELETE", "/v1/sandboxes/vol-user", None).0, 200);
    let (status, deleting) = curl.json("DELETE", "/v1/volumes/vol", None);
    assert_eq!((status, deleting["volume"]["phase"].as_str()), (200, Some("VOLUME_PHASE_DELETING")), "{deleting}");

    let (_, listed) = curl.json("GET", "/v1/sandboxes?selector=team=a", None);
    let cursor = listed["cursor"].as_str().unwrap().to_string();
    let (status, stopped) = curl.json("POST", "/v1/sandboxes/web/stop", None);
    assert_eq!((status, stopped["sandbox"]["phase"].as_str()), (200, Some("PHASE_STOPPING")), "{stopped}");
    let (status, _) = curl.json("DELETE", "/v1/sandboxes/web", None);
    assert_eq!(status, 200);
    let mut gone = false;
    for _ in 0..100 {
        if curl.json("GET", "/v1/sandboxes/web", None).0 == 404 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the deleted sandbox is still there");

    // The fleet's changes since the listing, as newline-delimited JSON: a bookmark at the
    // cursor, then the stop and the delete, each with the cursor after it; the stream stays open.
    let url = format!("{}/v1/sandboxes:watch?selector=team%3Da&cursor={cursor}", curl.base);
    let header = format!("authorization: Bearer {}", curl.token);
    let out =
        std::process::Command::new("curl").args(["-sN", "--max-time", "2", "-H", &header, &url]).output().unwrap();
    assert_eq!(out.status.code(), Some(28), "still open when curl gives up");
    let text = String::from_utf8_lossy(&out.stdout);
    let events: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events[0]["cursor"].as_str(), Some(cursor.as_str()), "{text}");
    assert_eq!(events[1]["sandbox"]["phase"], "PHASE_STOPPING", "{text}");
    assert_eq!(events.last().unwrap()["removed"], true, "{text}");
    assert!(events[1..].iter().all(|e| e["name"] == "web"), "{text}");
    let (status, code, message) = refused("GET", "/v1/sandboxes:watch?cursor=nonsense", None);
    assert_eq!((status, code.as_str()), (400, "INVALID_ARGUMENT"));
    assert!(message.contains("cursor"), "{message}");
}
