//! Templates: written by version, paged by name.

use super::*;

/// Templates (DESIGN 9.4): created once, written and removed by version, read back whole
/// (spec and pool size), paged by name; a fill's two writes (member and template) all or none.
pub(crate) async fn templates_are_written_by_version_and_paged(store: Shared) {
    use berth_core::template::Template;
    let template = |name: &str| Template {
        name: name.into(),
        spec: SandboxSpec::clone(&sandbox("x", "x").spec),
        min_ready: 2,
        made: 0,
        resource_version: 1,
        created_at: Timestamp::from_unix_millis(1),
        updated_at: Timestamp::from_unix_millis(1),
    };
    let key = |name: &str| Key::Template(name.into());
    let web = template("web");
    store.commit(&[Write::CreateTemplate(web.clone())]).await.unwrap();
    assert_eq!(store.commit(&[Write::CreateTemplate(template("web"))]).await, conflict(key("web"), None, Some(1)));
    assert_eq!(store.template("web").await.unwrap(), Some(web.clone()));

    let grown = Template { min_ready: 5, made: 1, resource_version: 2, ..web.clone() };
    // A fill: the member and the template's bump together, or neither.
    let member = sandbox("sb-m", "web-00000001");
    let stale = Template { resource_version: 2, ..web.clone() };
    store.commit(&[Write::UpdateTemplate { record: grown.clone(), expected: 1 }]).await.unwrap();
    assert_eq!(
        store
            .commit(&[Write::CreateSandbox(member.clone()), Write::UpdateTemplate { record: stale, expected: 1 }])
            .await,
        conflict(key("web"), Some(1), Some(2))
    );
    assert_eq!(read(&store, "sb-m").await, None, "nothing of a failed fill is written");
    assert_eq!(store.template("web").await.unwrap(), Some(grown.clone()));

    for name in ["api", "zeta"] {
        store.commit(&[Write::CreateTemplate(template(name))]).await.unwrap();
    }
    let first = store.list_templates(&PageRequest { after: None, limit: 2 }).await.unwrap();
    let names: Vec<&str> = first.items.iter().map(|t| t.name.as_str()).collect();
    assert_eq!((names, first.next.as_deref()), (vec!["api", "web"], Some("web")));
    let rest = store.list_templates(&PageRequest { after: first.next, limit: 2 }).await.unwrap();
    assert_eq!((rest.items.len(), rest.next), (1, None));

    assert_eq!(
        store.commit(&[Write::RemoveTemplate { name: "web".into(), expected: 1 }]).await,
        conflict(key("web"), Some(1), Some(2))
    );
    store.commit(&[Write::RemoveTemplate { name: "web".into(), expected: 2 }]).await.unwrap();
    assert_eq!(store.template("web").await.unwrap(), None);
}

/// Snapshots (DESIGN 12.2): created once, written and removed by version, read back whole,
/// paged by name; a create from one (the sandbox and the snapshot's bump) all or none, so a
/// delete decided on the version before it conflicts.
pub(crate) async fn snapshots_are_written_by_version_and_paged(store: Shared) {
    use berth_core::record::{Content, SnapshotSource};
    use berth_core::{Snapshot, SnapshotId, SnapshotPhase};
    let source = sandbox("sb-src", "src");
    let snapshot = |name: &str| Snapshot {
        name: name.into(),
        id: SnapshotId::new(format!("sn-{name}")),
        source: SnapshotSource { id: source.id.clone(), name: "src".into(), generation: 3 },
        spec: SandboxSpec::clone(&source.spec),
        phase: SnapshotPhase::Creating,
        content: None,
        fork: None,
        resource_version: 1,
        created_at: Timestamp::from_unix_millis(1),
        updated_at: Timestamp::from_unix_millis(1),
    };
    let key = |name: &str| Key::Snapshot(name.into());
    let s1 = snapshot("s1");
    store.commit(&[Write::CreateSnapshot(s1.clone())]).await.unwrap();
    assert_eq!(store.commit(&[Write::CreateSnapshot(snapshot("s1"))]).await, conflict(key("s1"), None, Some(1)));
    assert_eq!(store.snapshot("s1").await.unwrap(), Some(s1.clone()));

    let content = Content { size_bytes: 10_240, sha256: "ab".repeat(32), image: Some("berth-snapshot:sn-s1".into()) };
    let ready = Snapshot { phase: SnapshotPhase::Ready, content: Some(content), resource_version: 2, ..s1.clone() };
    store.commit(&[Write::UpdateSnapshot { record: ready.clone(), expected: 1 }]).await.unwrap();
    assert_eq!(store.snapshot("s1").await.unwrap(), Some(ready.clone()));

    // A create from it and a delete decided on the version before it: one of them conflicts.
    let made = sandbox("sb-made", "made");
    let touched = Snapshot { resource_version: 3, ..ready.clone() };
    store
        .commit(&[Write::CreateSandbox(made.clone()), Write::UpdateSnapshot { record: touched.clone(), expected: 2 }])
        .await
        .unwrap();
    let deleting = Snapshot { phase: SnapshotPhase::Deleting, resource_version: 3, ..ready.clone() };
    assert_eq!(
        store.commit(&[Write::UpdateSnapshot { record: deleting, expected: 2 }]).await,
        conflict(key("s1"), Some(2), Some(3))
    );
    let other = sandbox("sb-other", "other");
    let stale = Snapshot { resource_version: 3, ..ready.clone() };
    assert_eq!(
        store.commit(&[Write::CreateSandbox(other), Write::UpdateSnapshot { record: stale, expected: 2 }]).await,
        conflict(key("s1"), Some(2), Some(3))
    );
    assert_eq!(read(&store, "sb-other").await, None, "nothing of a failed create is written");

    for name in ["a1", "z9"] {
        store.commit(&[Write::CreateSnapshot(snapshot(name))]).await.unwrap();
    }
    let first = store.list_snapshots(&PageRequest { after: None, limit: 2 }).await.unwrap();
    let names: Vec<&str> = first.items.iter().map(|s| s.name.as_str()).collect();
    assert_eq!((names, first.next.as_deref()), (vec!["a1", "s1"], Some("s1")));
    assert_eq!(store.all_snapshots().await.unwrap().len(), 3);

    assert_eq!(
        store.commit(&[Write::RemoveSnapshot { name: "s1".into(), expected: 2 }]).await,
        conflict(key("s1"), Some(2), Some(3))
    );
    store.commit(&[Write::RemoveSnapshot { name: "s1".into(), expected: 3 }]).await.unwrap();
    assert_eq!(store.snapshot("s1").await.unwrap(), None);
    assert_eq!(read(&store, "sb-made").await.map(|s| s.resource_version), Some(made.resource_version));
}
