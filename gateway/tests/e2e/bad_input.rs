//! Bad input: the status code of DESIGN 3.7, a message naming the field or versions, nothing
//! written, and the gateway still serving.

use berth_proto::v1 as pb;
use prost::bytes::{Buf, BufMut};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::MetadataValue;

use crate::harness::*;

fn expect<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, mention: &str) {
    let status = result.expect_err("a bad input was accepted");
    assert_eq!(status.code(), code, "{status}");
    assert!(status.message().contains(mention), "{:?} does not mention {mention:?}", status.message());
}

fn create_request(name: &str, spec: pb::SandboxSpec, providers: Vec<String>) -> pb::CreateSandboxRequest {
    pb::CreateSandboxRequest {
        name: name.into(),
        spec: Some(spec),
        providers,
        expected_resource_version: None,
        deadline_unix_ms: None,
        from_snapshot: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_status_code_and_writes_nothing() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut providers = gateway.providers().await;
    let good = create(&mut sandboxes, "good", COUNTING, &[]).await;
    wait_phase(&mut sandboxes, "good", pb::Phase::Ready).await;
    let before = get(&mut sandboxes, "good").await.unwrap();

    let ok_spec = || spec(&["sleep", "1"]);
    for (name, mention) in [("Bad_Name", "name"), (&"x".repeat(64) as &str, "63"), ("", "name"), ("-lead", "name")] {
        expect(sandboxes.create_sandbox(create_request(name, ok_spec(), vec![])).await, Code::InvalidArgument, mention);
    }
    expect(
        sandboxes.create_sandbox(create_request("empty", spec(&[]), vec![])).await,
        Code::InvalidArgument,
        "spec.command",
    );
    let mut bad_env = ok_spec();
    bad_env.env.insert("1BAD".into(), "v".into());
    expect(sandboxes.create_sandbox(create_request("env", bad_env, vec![])).await, Code::InvalidArgument, "spec.env");
    let mut reserved = ok_spec();
    reserved.env.insert("BERTH_RUNTIME_TOKEN".into(), "v".into());
    expect(sandboxes.create_sandbox(create_request("env", reserved, vec![])).await, Code::InvalidArgument, "reserved");
    let mut huge = ok_spec();
    for i in 0..20 {
        huge.env.insert(format!("V{i}"), "x".repeat(32 * 1024));
    }
    expect(sandboxes.create_sandbox(create_request("huge", huge, vec![])).await, Code::InvalidArgument, "spec");
    // Limits: negative, too small for the supervisor, past any host.
    let limits = |cpu_millis, memory_bytes, pids| pb::ResourceLimits { cpu_millis, memory_bytes, pids };
    for (bad, field) in [
        (limits(None, Some(-1), None), "spec.limits.memory_bytes"),
        (limits(None, Some(1), None), "spec.limits.memory_bytes"),
        (limits(None, Some(i64::MAX), None), "spec.limits.memory_bytes"),
        (limits(Some(0), None, None), "spec.limits.cpu_millis"),
        (limits(Some(-1500), None, None), "spec.limits.cpu_millis"),
        (limits(Some(2_000_000), None, None), "spec.limits.cpu_millis"),
        (limits(None, None, Some(1)), "spec.limits.pids"),
        (limits(None, None, Some(1 << 40)), "spec.limits.pids"),
    ] {
        let mut limited = ok_spec();
        limited.limits = Some(bad);
        expect(
            sandboxes.create_sandbox(create_request("limited", limited, vec![])).await,
            Code::InvalidArgument,
            field,
        );
    }
    // Egress entries: malformed names and blocks, each named by its index; too many.
    for (bad, field) in [
        (vec!["one.test", "bad_name.test"], "spec.egress.allow[1]"),
        (vec!["10.0.0.0/33"], "spec.egress.allow[0]"),
        (vec!["one.test", "two.test", "http://x.test/"], "spec.egress.allow[2]"),
        (vec!["*"], "spec.egress.allow[0]"),
    ] {
        let mut egress = ok_spec();
        egress.egress = Some(pb::EgressPolicy { allow: bad.iter().map(|b| b.to_string()).collect() });
        expect(sandboxes.create_sandbox(create_request("egress", egress, vec![])).await, Code::InvalidArgument, field);
    }
    let mut crowded = ok_spec();
    crowded.egress = Some(pb::EgressPolicy { allow: (0..65).map(|i| format!("h{i}.test")).collect() });
    expect(
        sandboxes.create_sandbox(create_request("egress", crowded, vec![])).await,
        Code::InvalidArgument,
        "spec.egress.allow",
    );
    let bad_endpoint = pb::CreateProviderRequest {
        name: "ends".into(),
        kind: "k".into(),
        endpoints: vec!["api.test".into(), "300.1.2.3/8".into()],
        ..Default::default()
    };
    expect(providers.create_provider(bad_endpoint).await, Code::InvalidArgument, "endpoints[1]");
    expect(providers.get_provider(pb::GetProviderRequest { name: "ends".into() }).await, Code::NotFound, "ends");
    let many: Vec<String> = (0..33).map(|i| format!("p{i}")).collect();
    expect(sandboxes.create_sandbox(create_request("many", ok_spec(), many)).await, Code::InvalidArgument, "providers");
    expect(
        sandboxes.create_sandbox(create_request("orphan", ok_spec(), vec!["nope".into()])).await,
        Code::FailedPrecondition,
        "nope",
    );
    let no_spec = pb::CreateSandboxRequest { name: "nospec".into(), ..Default::default() };
    expect(sandboxes.create_sandbox(no_spec).await, Code::InvalidArgument, "spec");
    expect(sandboxes.create_sandbox(create_request("good", ok_spec(), vec![])).await, Code::AlreadyExists, "good");

    for verb in ["stop", "start", "delete"] {
        expect(lifecycle(&mut sandboxes, verb, "missing").await, Code::NotFound, "missing");
    }
    expect(get(&mut sandboxes, "missing").await, Code::NotFound, "missing");
    // Ready can come before the driver's start reply, whose start time is a later write: the
    // current version may have moved past `before`'s by the time the stale stop lands.
    let stale =
        pb::LifecycleRequest { name: "good".into(), expected_resource_version: Some(before.resource_version - 1) };
    let status = sandboxes.stop_sandbox(stale).await.expect_err("a stale stop was accepted");
    assert_eq!(status.code(), Code::Aborted, "{status}");
    let current: u64 = status
        .message()
        .strip_prefix(&format!("sandbox 'good': expected resource_version {}, current ", before.resource_version - 1))
        .and_then(|current| current.parse().ok())
        .unwrap_or_else(|| panic!("{:?} does not name both versions", status.message()));
    assert!(current >= before.resource_version, "{current} is older than {}", before.resource_version);
    expect(
        sandboxes.list_sandboxes(pb::ListSandboxesRequest { page_size: 5000, ..Default::default() }).await,
        Code::InvalidArgument,
        "page_size",
    );

    // A provider deleted, then attached.
    providers
        .create_provider(pb::CreateProviderRequest { name: "gone".into(), kind: "k".into(), ..Default::default() })
        .await
        .unwrap();
    providers
        .delete_provider(pb::DeleteProviderRequest { name: "gone".into(), expected_resource_version: None })
        .await
        .unwrap();
    let attach = pb::AttachRequest { sandbox: "good".into(), provider: "gone".into(), expected_resource_version: None };
    expect(providers.attach_provider(attach).await, Code::FailedPrecondition, "gone");
    let bad_creds = pb::CreateProviderRequest {
        endpoints: Default::default(),
        name: "creds".into(),
        kind: "k".into(),
        credentials: [("NOT VALID".to_string(), "secret-value".to_string())].into(),
        expected_resource_version: None,
    };
    let status = providers.create_provider(bad_creds).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(!status.message().contains("secret-value"), "a secret in an error: {}", status.message());

    // Missing and malformed bearer tokens.
    let channel = gateway.channel().await;
    let mut anonymous = berth_proto::v1::sandboxes_client::SandboxesClient::new(channel.clone());
    expect(
        anonymous.get_sandbox(pb::GetSandboxRequest { name: "good".into() }).await,
        Code::Unauthenticated,
        "missing",
    );
    let mut wrong = berth_proto::v1::sandboxes_client::SandboxesClient::with_interceptor(
        channel,
        Bearer("wrong-token-1234".into()),
    );
    expect(wrong.get_sandbox(pb::GetSandboxRequest { name: "good".into() }).await, Code::Unauthenticated, "invalid");

    // Nothing was written; the gateway still serves.
    let all = sandboxes.list_sandboxes(pb::ListSandboxesRequest::default()).await.unwrap().into_inner().sandboxes;
    assert_eq!(all.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), vec!["good"]);
    // The version alone cannot show it (see the stale stop); what a bad request could have
    // changed can.
    let after = get(&mut sandboxes, "good").await.unwrap();
    assert_eq!(after.id, good.id);
    assert_eq!((after.generation, after.intent, after.phase), (before.generation, before.intent, before.phase));
    assert_eq!((&after.spec, &after.providers), (&before.spec, &before.providers));
}

/// Request bodies sent as they are, whatever they hold; replies read as bytes.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_the_callers_fault() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut grpc = tonic::client::Grpc::new(gateway.channel().await);
    let token: MetadataValue<_> = format!("Bearer {}", gateway.token).parse().unwrap();
    let bodies: [(&str, &[u8]); 4] = [
        // Field 1's length, a varint that never ends.
        ("a bad varint", &[0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
        // Field 1, the name, a 2-byte string that is not UTF-8.
        ("invalid UTF-8 in a string", &[0x0a, 0x02, 0xc3, 0x28]),
        ("a string longer than the body", &[0x0a, 0x10, b'a']),
        ("a field number 0", &[0x00, 0x01]),
    ];
    let methods = [
        "/berth.v1.Sandboxes/GetSandbox",
        "/berth.v1.Sandboxes/CreateSandbox",
        "/berth.v1.Sandboxes/ListSandboxes",
        "/berth.v1.Sandboxes/StopSandbox",
        "/berth.v1.Providers/CreateProvider",
        "/berth.v1.Providers/AttachProvider",
    ];
    for method in methods {
        for (what, body) in bodies {
            grpc.ready().await.unwrap();
            let mut request = tonic::Request::new(body.to_vec());
            request.metadata_mut().insert("authorization", token.clone());
            let reply = grpc.unary(request, method.parse().unwrap(), Raw).await;
            let status = reply.expect_err("an undecodable request was answered");
            assert_eq!(status.code(), Code::InvalidArgument, "{method}, {what}: {status}");
            assert!(status.message().contains("could not be decoded"), "{method}, {what}: {status}");
        }
    }
    // The same bytes, well formed, reach the service.
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(vec![0x0a, 0x02, b'n', b'o']);
    request.metadata_mut().insert("authorization", token);
    let status = grpc.unary(request, "/berth.v1.Sandboxes/GetSandbox".parse().unwrap(), Raw).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_request_metadata_is_judged_like_any_other() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    create(&mut sandboxes, "meta", &["sleep", "3600"], &[]).await;
    let padding: MetadataValue<_> = "x".repeat(20 * 1024).parse().unwrap();
    let get = |token: &str| {
        let mut request = tonic::Request::new(pb::GetSandboxRequest { name: "meta".into() });
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        request.metadata_mut().insert("x-padding", padding.clone());
        request
    };
    let mut client = berth_proto::v1::sandboxes_client::SandboxesClient::new(gateway.channel().await);
    let reply = client.get_sandbox(get(&gateway.token)).await.expect("20 KiB of metadata was refused");
    assert_eq!(reply.into_inner().sandbox.unwrap().name, "meta");
    expect(client.get_sandbox(get("wrong-token-1234")).await, Code::Unauthenticated, "invalid");
}
