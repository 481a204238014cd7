//! Every public and supervisor request, decoded from arbitrary bytes and taken through the
//! gateway's conversion and berth-core's validation and decision: never a panic, and every
//! rejection a proper status (never INTERNAL), naming what it rejects.

use berth_core::{Code, Command, Reads, Request, SandboxId, Timestamp, decide};
use berth_gateway::api::convert;
use berth_proto::v1 as pb;
use prost::Message;

fn check_request(request: Request) {
    for reads in [Reads::default(), populated(&request)] {
        match decide(&request, &reads, Timestamp::from_unix_millis(1)) {
            Ok(decision) => {
                // A decided write is consistent: versions add one, effects follow writes.
                for write in &decision.writes {
                    if let berth_core::Write::UpdateSandbox { record, expected } = write {
                        assert_eq!(record.resource_version, expected + 1);
                    }
                }
            }
            Err(e) => {
                assert_ne!(e.code(), Code::Internal, "{e}");
                assert!(!e.to_string().is_empty());
            }
        }
    }
}

/// Reads where the named sandbox and providers exist, so deeper rules are reached too.
fn populated(request: &Request) -> Reads {
    let mut reads = Reads::default();
    let plan = request.plan();
    if let Some(name) = plan.sandbox {
        let spec = berth_core::SandboxSpec { image: "i".into(), command: vec!["c".into()], ..Default::default() };
        reads.sandbox = Some(berth_core::Sandbox {
            phase: berth_core::Phase::Ready,
            resource_version: 3,
            exit_fence: Default::default(),
            run: berth_core::Run::Started { at: None },
            ..berth_core::Sandbox::new(SandboxId::new("sb-fuzz"), name.name, spec, Timestamp::default())
        });
    }
    for name in plan.providers_to_read(reads.sandbox.as_ref()) {
        let provider = berth_core::Provider {
            endpoints: Default::default(),
            name: name.clone(),
            kind: "k".into(),
            credentials: Default::default(),
            resource_version: 1,
            created_at: Timestamp::default(),
            updated_at: Timestamp::default(),
        };
        reads.providers.insert(name, provider);
    }
    reads
}

/// The target's entry, for libFuzzer and the corpus replay alike.
pub fn fuzz(data: &[u8]) {
    crate::run(data, check);
}

fn check(input: (u8, &[u8])) {
    let (which, bytes) = input;
    match which % 12 {
        0 => {
            if let Ok(r) = pb::CreateSandboxRequest::decode(bytes)
                && let Some(spec) = r.spec
                // A spec the wire refuses (a negative duration) is refused before the core.
                && let Ok(spec) = convert::spec_from_wire(spec)
            {
                let command = Command::CreateSandbox {
                    id: SandboxId::new("sb-new"),
                    name: r.name,
                    spec,
                    providers: r.providers.into_iter().collect(),
                    deadline: r.deadline_unix_ms.map(convert::unix_millis),
                };
                check_request(Request::new(command, r.expected_resource_version));
            }
        }
        1..=3 => {
            if let Ok(r) = pb::LifecycleRequest::decode(bytes) {
                let command = match which % 12 {
                    1 => Command::StopSandbox { name: r.name },
                    2 => Command::StartSandbox { name: r.name },
                    _ => Command::DeleteSandbox { name: r.name },
                };
                check_request(Request::new(command, r.expected_resource_version));
            }
        }
        4 | 5 => {
            if let Ok(r) = pb::AttachRequest::decode(bytes) {
                let command = if which % 12 == 4 {
                    Command::AttachProvider { sandbox: r.sandbox, provider: r.provider }
                } else {
                    Command::DetachProvider { sandbox: r.sandbox, provider: r.provider }
                };
                check_request(Request::new(command, r.expected_resource_version));
            }
        }
        6 => {
            if let Ok(r) = pb::CreateProviderRequest::decode(bytes) {
                let command = Command::CreateProvider {
                    endpoints: Default::default(),
                    name: r.name,
                    kind: r.kind,
                    credentials: convert::credentials(r.credentials),
                };
                check_request(Request::new(command, r.expected_resource_version));
            }
        }
        7 => {
            if let Ok(r) = pb::DeleteProviderRequest::decode(bytes) {
                check_request(Request::new(Command::DeleteProvider { name: r.name }, r.expected_resource_version));
            }
        }
        8 => {
            if let Ok(r) = pb::RenewSandboxRequest::decode(bytes) {
                let renewal = match (r.ttl_ms, r.deadline_unix_ms) {
                    (Some(ms), _) => match convert::millis("ttl_ms", ms) {
                        Ok(ttl) => berth_core::lifetime::Renewal::Ttl(ttl),
                        Err(_) => return,
                    },
                    (None, Some(ms)) => berth_core::lifetime::Renewal::Deadline(convert::unix_millis(ms)),
                    (None, None) => berth_core::lifetime::Renewal::SpecTtl,
                };
                check_request(Request::new(
                    Command::RenewSandbox { name: r.name, renewal },
                    r.expected_resource_version,
                ));
            }
        }
        9 => {
            if let Ok(r) = pb::CreateTemplateRequest::decode(bytes)
                && let Some(spec) = r.spec
                && let Ok(spec) = convert::spec_from_wire(spec)
            {
                let command = Command::CreateTemplate { name: r.name, spec, min_ready: r.min_ready };
                check_request(Request::new(command, r.expected_resource_version));
            }
        }
        10 => {
            if let Ok(r) = pb::ClaimSandboxRequest::decode(bytes) {
                let command = Command::ClaimSandbox {
                    template: r.template,
                    labels: r.labels,
                    providers: r.providers.into_iter().collect(),
                };
                check_request(Request::new(command, None));
            }
        }
        _ => {
            // The supervisor's hello: its token is verified, never trusted.
            if let Ok(m) = pb::SupervisorMessage::decode(bytes)
                && let Some(pb::supervisor_message::Message::Hello(hello)) = m.message
            {
                let key = berth_core::identity::IdentityKey::from_bytes([1; 32]);
                if let Err(e) = berth_core::identity::verify_token(&key, &hello.runtime_token) {
                    assert_eq!(e.code(), Code::Unauthenticated);
                    // The rejection carries nothing of the token (it cannot echo it). Comparing
                    // texts instead would flag a token that merely quotes the fixed message.
                    assert!(matches!(e, berth_core::Error::MalformedToken | berth_core::Error::BadToken), "{e:?}");
                }
            }
        }
    }
}
