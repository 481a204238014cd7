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
