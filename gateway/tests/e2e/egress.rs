//! Egress policy (DESIGN 10) on Docker and Podman: a sandbox has no network of its own, and
//! reaches only what its policy allows, through the supervisor's proxy listener and the
//! gateway's egress proxy. Two local HTTP servers stand for the internet, on 127.0.0.2 and
//! 127.0.0.3, named `one.test` and `two.test` by the gateway's `--egress-resolve`. The process
//! driver refuses an allow-list.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use berth_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::conformance::{Runtime, Target, clean_up, image_for, target};
use crate::exec::{run, start};
use crate::harness::*;
use crate::metrics::value;

/// An HTTP server that answers every request with its name, counting connections.
struct Upstream {
    port: u16,
    connections: Arc<AtomicUsize>,
}

async fn upstream(addr: &str, name: &'static str) -> Upstream {
    let listener = tokio::net::TcpListener::bind((addr, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let body = format!("this is {name}\n");
                let reply = format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Upstream { port, connections }
}

struct World {
    target: Target,
    data: DataDir,
    gateway: Gateway,
    one: Upstream,
    two: Upstream,
    metrics: u16,
}

async fn world(runtime: Runtime, test: &str) -> Option<World> {
    let target = target(runtime, test).await?;
    let one = upstream("127.0.0.2", "one").await;
    let two = upstream("127.0.0.3", "two").await;
    let data = DataDir::new();
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{metrics}");
    let pins = ["--egress-resolve", "one.test=127.0.0.2", "--egress-resolve", "two.test=127.0.0.3"];
    let gateway = target.gateway(&data, &[&pins[..], &["--metrics-listen", &listen]].concat()).await;
    Some(World { target, data, gateway, one, two, metrics })
}

impl World {
    async fn sandbox(&self, name: &str, allow: &[&str], providers: &[&str]) -> pb::Sandbox {
        let mut sandboxes = self.gateway.sandboxes().await;
        let mut s = spec(&["sleep", "3600"]);
        s.image = image_for(&self.target).to_string();
        if !allow.is_empty() {
            s.egress = Some(pb::EgressPolicy { allow: allow.iter().map(|a| a.to_string()).collect() });
        }
        let request = pb::CreateSandboxRequest {
            name: name.into(),
            spec: Some(s),
            providers: providers.iter().map(|p| p.to_string()).collect(),
            ..Default::default()
        };
        sandboxes.create_sandbox(request).await.unwrap();
        wait_phase(&mut sandboxes, name, pb::Phase::Ready).await.0
    }

    /// `wget` in the sandbox, through the proxy its environment names: the body, or the error.
    async fn fetch(&self, sandbox: &pb::Sandbox, url: &str) -> Result<String, String> {
        let mut execs = self.gateway.execs().await;
        let read = run(&mut execs, start(&sandbox.name, &["wget", "-q", "-O", "-", url])).await;
        let out = String::from_utf8_lossy(&read.stdout).to_string();
        if read.exit_code() == Some(0) { Ok(out) } else { Err(format!("exit {:?}: {out}", read.exit_code())) }
    }

    fn url(&self, host: &str) -> String {
        let port = if host == "one.test" || host == "127.0.0.2" { self.one.port } else { self.two.port };
        format!("http://{host}:{port}/")
    }

    /// A CONNECT tunnel opened by hand, a request sent through it: what came back.
    async fn tunnel(&self, sandbox: &pb::Sandbox, host: &str) -> String {
        let port = if host == "one.test" { self.one.port } else { self.two.port };
        self.tunnel_to(sandbox, host, port).await
    }

    async fn tunnel_to(&self, sandbox: &pb::Sandbox, host: &str, port: u16) -> String {
        let script = format!(
            "printf 'CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\nGET / HTTP/1.0\\r\\n\\r\\n' | nc \
             127.0.0.1 3128"
        );
        let mut execs = self.gateway.execs().await;
        let read = run(&mut execs, start(&sandbox.name, &["sh", "-c", &script])).await;
        String::from_utf8_lossy(&read.stdout).to_string()
    }
}

async fn a_policy_lets_a_sandbox_reach_what_it_names_and_nothing_else(runtime: Runtime) {
    let Some(w) = world(runtime, "egress").await else { return };
    let mut sandboxes = w.gateway.sandboxes().await;

    let none = w.sandbox("none", &[], &[]).await;
    let refused = w.fetch(&none, &w.url("one.test")).await.unwrap_err();
    assert!(refused.contains("403") || refused.contains("exit"), "{runtime:?}: {refused}");
    // No way around the proxy: the container has no network but its loopback.
    let mut execs = w.gateway.execs().await;
    let direct = format!("echo x | nc -w 2 127.0.0.2 {}", w.one.port);
    let read = run(&mut execs, start(&none.name, &["sh", "-c", &direct])).await;
    assert_ne!(read.exit_code(), Some(0), "{runtime:?}: a direct connection left the sandbox");

    let by_name = w.sandbox("by-name", &["one.test"], &[]).await;
    assert_eq!(w.fetch(&by_name, &w.url("one.test")).await.unwrap(), "this is one\n", "{runtime:?}");
    assert!(w.fetch(&by_name, &w.url("two.test")).await.is_err(), "{runtime:?}: two.test is not allowed");
    assert!(w.fetch(&by_name, &w.url("127.0.0.2")).await.is_err(), "{runtime:?}: a name rule allows no address");
    assert!(w.tunnel(&by_name, "one.test").await.contains("this is one"), "{runtime:?}: CONNECT");
    let denied = w.tunnel(&by_name, "two.test").await;
    assert!(denied.starts_with("HTTP/1.1 403") && denied.contains("not allowed"), "{runtime:?}: {denied}");

    let by_address = w.sandbox("by-address", &["127.0.0.3/32"], &[]).await;
    assert_eq!(w.fetch(&by_address, &w.url("127.0.0.3")).await.unwrap(), "this is two\n", "{runtime:?}");
    assert_eq!(
        w.fetch(&by_address, &w.url("two.test")).await.unwrap(),
        "this is two\n",
        "{runtime:?}: a name resolving into the block"
    );
    assert!(w.fetch(&by_address, &w.url("127.0.0.2")).await.is_err(), "{runtime:?}");
    assert!(w.fetch(&by_address, &w.url("one.test")).await.is_err(), "{runtime:?}");

    // An allowed name the host's resolver (not the operator's pin) points at the host itself
    // reaches nothing there.
    let local = upstream("127.0.0.1", "the host").await;
    let by_dns = w.sandbox("by-dns", &["localhost"], &[]).await;
    let refused = w.tunnel_to(&by_dns, "localhost", local.port).await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{runtime:?}: {refused}");
    assert_eq!(local.connections.load(Ordering::SeqCst), 0, "{runtime:?}: the host's loopback was reached");

    // What was allowed arrived; nothing refused ever reached an upstream.
    assert_eq!(w.one.connections.load(Ordering::SeqCst), 2, "{runtime:?}: one.test's connections");
    assert_eq!(w.two.connections.load(Ordering::SeqCst), 2, "{runtime:?}: two.test's connections");
    let log = w.data.log();
    let denials: Vec<&str> = log.lines().filter(|l| l.contains("egress denied")).collect();
    assert!(
        denials.iter().any(|l| l.contains("sandbox=by-name") && l.contains("host=two.test")),
        "{runtime:?}: a denial names its sandbox and host:\n{}",
        denials.join("\n")
    );
    assert!(denials.len() >= 6, "{runtime:?}: every refusal is logged: {}", denials.len());
    let (_, body) = crate::metrics::scrape(w.metrics, Some(&format!("Bearer {}", w.gateway.token))).await;
    let counted = |verdict: &str| value(&body, &format!("berth_egress_connections_total{{verdict=\"{verdict}\"}}"));
    assert_eq!(counted("allowed"), 4.0, "{runtime:?}: the connections allowed");
    assert_eq!(counted("denied"), denials.len() as f64, "{runtime:?}: each refusal counted as logged");
    clean_up(&w.target, &w.data, &mut sandboxes).await;
}

async fn a_providers_endpoints_open_at_the_next_start_and_close_at_its_detach(runtime: Runtime) {
    let Some(w) = world(runtime, "egress-prov").await else { return };
    let mut sandboxes = w.gateway.sandboxes().await;
    let mut providers = w.gateway.providers().await;
    let request = pb::CreateProviderRequest {
        name: "two-api".into(),
        kind: "test".into(),
        credentials: [("TWO_KEY".to_string(), "k".to_string())].into(),
        endpoints: vec!["two.test".into()],
        ..Default::default()
    };
    let created = providers.create_provider(request).await.unwrap().into_inner().provider.unwrap();
    assert_eq!(created.endpoints, ["two.test"]);

    let agent = w.sandbox("agent", &["one.test"], &[]).await;
    let attach = pb::AttachRequest { sandbox: "agent".into(), provider: "two-api".into(), ..Default::default() };
    let attached = providers.attach_provider(attach.clone()).await.unwrap().into_inner().sandbox.unwrap();
    assert_eq!(attached.providers, ["two-api"]);
    assert!(attached.egress_providers.is_empty(), "{runtime:?}: the reply says the run does not have it yet");
    assert!(w.fetch(&agent, &w.url("two.test")).await.is_err(), "{runtime:?}: open before the next start");

    lifecycle(&mut sandboxes, "stop", "agent").await.unwrap();
    wait_phase(&mut sandboxes, "agent", pb::Phase::Stopped).await;
    lifecycle(&mut sandboxes, "start", "agent").await.unwrap();
    let (restarted, _) = wait_phase(&mut sandboxes, "agent", pb::Phase::Ready).await;
    assert_eq!(restarted.egress_providers, ["two-api"], "{runtime:?}");
    assert_eq!(w.fetch(&agent, &w.url("two.test")).await.unwrap(), "this is two\n", "{runtime:?}");
    assert_eq!(w.fetch(&agent, &w.url("one.test")).await.unwrap(), "this is one\n", "{runtime:?}: the spec's stays");

    let detached = providers.detach_provider(attach).await.unwrap().into_inner().sandbox.unwrap();
    assert!(detached.providers.is_empty() && detached.egress_providers.is_empty(), "{runtime:?}: {detached:?}");
    // Closed once the reply is in, without a restart.
    assert!(w.fetch(&agent, &w.url("two.test")).await.is_err(), "{runtime:?}: open after its detach");
    assert_eq!(w.fetch(&agent, &w.url("one.test")).await.unwrap(), "this is one\n", "{runtime:?}");
    assert_eq!(w.two.connections.load(Ordering::SeqCst), 1, "{runtime:?}");
    clean_up(&w.target, &w.data, &mut sandboxes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_driver_refuses_an_allow_list_naming_the_field() {
    let Some(target) = target(Runtime::Process, "egress-proc").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut s = spec(&["sleep", "3600"]);
    s.egress = Some(pb::EgressPolicy { allow: vec!["one.test".into()] });
    let request = pb::CreateSandboxRequest { name: "net".into(), spec: Some(s), ..Default::default() };
    let status = sandboxes.create_sandbox(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status}");
    assert!(status.message().contains("spec.egress.allow"), "{}", status.message());
    assert_eq!(get(&mut sandboxes, "net").await.unwrap_err().code(), tonic::Code::NotFound, "nothing written");
    // Without a list it runs, on the host's network as the README says.
    create(&mut sandboxes, "plain", &["sleep", "3600"], &[]).await;
    wait_phase(&mut sandboxes, "plain", pb::Phase::Ready).await;
    clean_up(&target, &data, &mut sandboxes).await;
}

macro_rules! egress {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_policy_lets_a_sandbox_reach_what_it_names_and_nothing_else() {
                    super::a_policy_lets_a_sandbox_reach_what_it_names_and_nothing_else(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_providers_endpoints_open_at_the_next_start_and_close_at_its_detach() {
                    super::a_providers_endpoints_open_at_the_next_start_and_close_at_its_detach(Runtime::$runtime)
                        .await
                }
            }
        )*
    };
}

egress!(Docker => docker, Podman => podman);
