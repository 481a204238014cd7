//! `berth sandbox watch`: one sandbox's changes, or the fleet's, printed as they come.

use std::collections::BTreeMap;

use berth_proto::v1 as pb;
use tonic::Status;

use super::client::{Client, Failed, Reconnect};

impl Client {
    /// `berth sandbox watch NAME`: the sandbox, then every change, until it is gone.
    /// Through a lost gateway it watches again, printing only what it had not printed.
    pub(super) async fn watch_one(&mut self, name: String) -> Result<u8, Failed> {
        // The sandbox as last printed (its id and version): a new watch starts with it again.
        let mut shown: Option<(String, u64)> = None;
        let mut reconnect = Reconnect::new();
        self.print_watch_header();
        loop {
            let request = pb::WatchSandboxRequest { name: name.clone() };
            let ended = match self.sandboxes.watch_sandbox(request).await {
                // Deleted while the gateway was away: its removal is the watch's last line.
                Err(status) if status.code() == tonic::Code::NotFound && shown.is_some() => {
                    self.print_change(&name, None);
                    return Ok(0);
                }
                Err(status) => status,
                Ok(events) => {
                    let mut events = events.into_inner();
                    loop {
                        let event = match events.message().await {
                            Ok(Some(event)) => event,
                            Ok(None) => return Ok(0),
                            Err(status) => break status,
                        };
                        reconnect.progressed();
                        let seen = |s: &pb::Sandbox| {
                            shown.as_ref().is_some_and(|(id, version)| *id == s.id && *version >= s.resource_version)
                        };
                        if !event.sandbox.as_ref().is_some_and(seen) {
                            shown = event.sandbox.as_ref().map(|s| (s.id.clone(), s.resource_version));
                            self.print_change(&name, event.sandbox.as_ref());
                        }
                    }
                }
            };
            reconnect.after(self, ended.into(), "watching from where it was").await?;
        }
    }

    /// `berth sandbox watch` without a name: the listing, then the fleet watch from its cursor;
    /// after a lost connection the same watch from the last cursor, after a cursor the gateway
    /// no longer reaches back to a new listing (printing what it changed).
    pub(super) async fn watch_fleet(&mut self, selector: BTreeMap<String, String>) -> Result<u8, Failed> {
        // What was printed of each sandbox: its id and version.
        let mut shown: BTreeMap<String, (String, u64)> = BTreeMap::new();
        let mut cursor: Option<String> = None;
        let mut reconnect = Reconnect::new();
        self.print_watch_header();
        loop {
            let opened = cursor.clone();
            let ended = match cursor.clone() {
                None => match self.list_all(&selector).await {
                    Ok((all, first)) => {
                        let listed: BTreeMap<String, (String, u64)> =
                            all.iter().map(|s| (s.name.clone(), (s.id.clone(), s.resource_version))).collect();
                        let gone: Vec<String> = shown.keys().filter(|n| !listed.contains_key(*n)).cloned().collect();
                        for name in gone {
                            self.print_change(&name, None);
                        }
                        for s in all.iter().filter(|s| shown.get(&s.name) != listed.get(&s.name)) {
                            self.print_change(&s.name, Some(s));
                        }
                        shown = listed;
                        cursor = Some(first);
                        reconnect.progressed();
                        continue;
                    }
                    Err(status) => status,
                },
                Some(from) => {
                    let request = pb::WatchSandboxesRequest { label_selector: selector.clone(), cursor: from };
                    match self.sandboxes.watch_sandboxes(request).await {
                        Ok(events) => self.follow_fleet(events.into_inner(), &mut shown, &mut cursor).await,
                        Err(status) => status,
                    }
                }
            };
            if cursor != opened {
                reconnect.progressed();
            }
            if ended.code() == tonic::Code::FailedPrecondition {
                eprintln!("berth: {}", ended.message());
                cursor = None;
            } else {
                reconnect.after(self, ended.into(), "watching from where it was").await?;
            }
        }
    }

    /// Prints the fleet watch's changes not yet shown; why it ended.
    async fn follow_fleet(
        &self,
        mut events: tonic::Streaming<pb::SandboxEvent>,
        shown: &mut BTreeMap<String, (String, u64)>,
        cursor: &mut Option<String>,
    ) -> Status {
        loop {
            let event = match events.message().await {
                Ok(Some(event)) => event,
                Ok(None) => return Status::unavailable("the gateway ended the watch"),
                Err(status) => return status,
            };
            if event.name.is_empty() {
                *cursor = Some(event.cursor);
                continue;
            }
            match &event.sandbox {
                _ if event.removed => {
                    shown.remove(&event.name);
                    self.print_change(&event.name, None);
                }
                // A listing of several pages can show a change the watch then brings again.
                Some(s) if shown.get(&s.name).is_none_or(|(id, v)| *id != s.id || *v < s.resource_version) => {
                    shown.insert(s.name.clone(), (s.id.clone(), s.resource_version));
                    self.print_change(&s.name, Some(s));
                }
                _ => {}
            }
            *cursor = Some(event.cursor);
        }
    }
}
