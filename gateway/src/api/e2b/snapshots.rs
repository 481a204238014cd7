//! E2B's snapshots and forks (its `create_snapshot`, `list_snapshots`, `fork`, and a create
//! naming a snapshot) over DESIGN 12.2 and 12.3: a snapshot's id is its Berth name. Berth's
//! snapshots keep a sandbox's files, not its memory: E2B's `mode="filesystem"`; a sandbox made
//! from one starts afresh from them.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use berth_proto::v1 as pb;
use berth_proto::v1::snapshots_server::Snapshots as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{E2b, Refusal, error, from_status, parse, ready, record, sandbox_body};

#[derive(Deserialize, Default)]
struct NewSnapshot {
    name: Option<String>,
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/snapshots`: answered once the snapshot's copy is taken.
pub(super) async fn create(State(e2b): State<Arc<E2b>>, Path(id): Path<String>, bytes: Bytes) -> Response {
    let made = async {
        let NewSnapshot { name, memory } = parse(&bytes)?;
        if memory == Some(true) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "Berth's snapshots keep a sandbox's files, not its memory: ask for mode=\"filesystem\"",
            ));
        }
        record(&e2b.engine, &id).await?;
        let name = name.unwrap_or_else(|| format!("snap-{:016x}", e2b.engine.random()));
        let request = pb::CreateSnapshotRequest { name: name.clone(), sandbox: id, no_wait: false };
        e2b.snapshots.create_snapshot(tonic::Request::new(request)).await.map_err(|s| from_status(&s))?;
        Ok::<_, Refusal>(json!({"snapshotID": name, "names": [name]}))
    };
    match made.await {
        Ok(body) => (StatusCode::CREATED, axum::Json(body)).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`.
pub(super) async fn list(State(e2b): State<Arc<E2b>>, Query(query): Query<BTreeMap<String, String>>) -> Response {
    let listed = async {
        let page_size = match query.get("limit") {
            Some(limit) => limit
                .parse()
                .map_err(|_| error(StatusCode::BAD_REQUEST, format!("limit must be a number, not {limit:?}")))?,
            None => 100,
        };
        let page_token = query.get("nextToken").cloned().unwrap_or_default();
        let request = pb::ListSnapshotsRequest { page_size, page_token };
        let reply = e2b.snapshots.list_snapshots(tonic::Request::new(request)).await.map_err(|s| from_status(&s))?;
        let reply = reply.into_inner();
        let items: Vec<Value> = reply
            .snapshots
            .iter()
            .filter(|s| query.get("sandboxID").is_none_or(|source| *source == s.source))
            .filter(|s| query.get("name").is_none_or(|name| *name == s.name))
            .map(|s| json!({"snapshotID": s.name, "names": [s.name]}))
            .collect();
        Ok::<_, Refusal>((items, reply.next_page_token))
    };
    match listed.await {
        Ok((items, next)) => {
            let mut response = axum::Json(items).into_response();
            if let Ok(next) = HeaderValue::from_str(&next) {
                response.headers_mut().insert("x-next-token", next);
            }
            response
        }
        Err(refusal) => refusal.into_response(),
    }
}

#[derive(Deserialize, Default)]
struct Fork {
    timeout: Option<u64>,
    count: Option<u32>,
}

/// `POST /sandboxes/{id}/fork`: `count` sandboxes from one snapshot of its files, each answered
/// once Ready (or with why it is not).
pub(super) async fn fork(State(e2b): State<Arc<E2b>>, Path(id): Path<String>, bytes: Bytes) -> Response {
    let forked = async {
        let Fork { timeout, count } = parse(&bytes)?;
        let ttl = super::ttl(timeout)?;
        record(&e2b.engine, &id).await?;
        let request =
            pb::ForkSandboxRequest { name: id, count: count.unwrap_or(1), names: vec![], labels: Default::default() };
        let reply = e2b.snapshots.fork_sandbox(tonic::Request::new(request)).await.map_err(|s| from_status(&s))?;
        let mut results = Vec::new();
        for made in reply.into_inner().sandboxes {
            let renewal = berth_core::lifetime::Renewal::Ttl(ttl);
            let renew = berth_core::Command::RenewSandbox { name: made.name.clone(), renewal };
            let result = match super::execute(&e2b.engine, renew).await {
                Ok(_) => {
                    ready(&e2b.engine, &made.name).await.map_err(|why| error(StatusCode::INTERNAL_SERVER_ERROR, why))
                }
                Err(refusal) => Err(refusal),
            };
            results.push(match result {
                Ok(s) => json!({"sandbox": sandbox_body(&e2b.engine, &s)}),
                Err(refusal) => json!({"error": {"code": refusal.status.as_u16(), "message": refusal.message}}),
            });
        }
        Ok::<_, Refusal>(results)
    };
    match forked.await {
        Ok(results) => (StatusCode::CREATED, axum::Json(results)).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}
