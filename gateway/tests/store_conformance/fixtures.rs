//! Records as core writes them, and the reads and page walks the checks share.

use super::*;

pub(crate) fn sandbox(id: &str, name: &str) -> Sandbox {
    let spec = SandboxSpec {
        image: "alpine:3".into(),
        command: vec!["sleep".into(), "infinity".into()],
        env: [("GREETING".to_string(), "hello".to_string())].into(),
        labels: BTreeMap::new(),
        ..SandboxSpec::default()
    };
    Sandbox::new(SandboxId::new(id), name, spec, Timestamp::from_unix_millis(1))
}

pub(crate) fn provider(name: &str) -> Provider {
    Provider {
        endpoints: Default::default(),
        name: name.into(),
        kind: "test".into(),
        credentials: [("TOKEN".to_string(), Secret::new("hunter2"))].into(),
        resource_version: 1,
        created_at: Timestamp::from_unix_millis(1),
        updated_at: Timestamp::from_unix_millis(1),
    }
}

/// `s`'s next version, as core writes it.
pub(crate) fn bumped(s: &Sandbox) -> Sandbox {
    let mut next = s.clone();
    next.resource_version += 1;
    next.updated_at = Timestamp(s.updated_at.0 + 1);
    next
}

pub(crate) fn bumped_provider(p: &Provider) -> Provider {
    let mut next = p.clone();
    next.resource_version += 1;
    next.updated_at = Timestamp(p.updated_at.0 + 1);
    next
}

pub(crate) fn update(s: &Sandbox) -> (Write, Sandbox) {
    let next = bumped(s);
    (Write::UpdateSandbox { record: next.clone(), expected: s.resource_version }, next)
}

pub(crate) fn conflict(key: Key, expected: Option<u64>, current: Option<u64>) -> Result<(), CommitError> {
    Err(CommitError::Conflict(Conflict { key, expected, current }))
}

pub(crate) fn sandbox_key(id: &str) -> Key {
    Key::Sandbox(SandboxId::new(id))
}

pub(crate) fn provider_key(name: &str) -> Key {
    Key::Provider(name.into())
}

pub(crate) async fn create(store: &Shared, s: &Sandbox) {
    store.commit(&[Write::CreateSandbox(s.clone())]).await.unwrap();
}

pub(crate) async fn read(store: &Shared, id: &str) -> Option<Sandbox> {
    store.sandbox(&SandboxId::new(id)).await.unwrap()
}

pub(crate) fn names(items: &[Sandbox]) -> Vec<&str> {
    items.iter().map(|s| &*s.name).collect()
}

pub(crate) fn selector(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Every page of sandboxes matching `selector`, `limit` at a time.
pub(crate) async fn all_sandbox_pages(
    store: &Shared,
    limit: usize,
    selector: &BTreeMap<String, String>,
) -> Vec<Page<Sandbox>> {
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = store.list_sandboxes(&PageRequest { after, limit }, selector).await.unwrap();
        after = page.next.clone();
        pages.push(page);
        if after.is_none() {
            return pages;
        }
        assert!(pages.len() <= 100, "paging does not end");
    }
}

/// Checks that `pages` are `sizes` long, continue from each other and hold `expected` in order.
pub(crate) fn assert_pages(pages: &[Page<Sandbox>], sizes: &[usize], expected: &[String]) {
    assert_eq!(pages.iter().map(|p| p.items.len()).collect::<Vec<_>>(), sizes);
    for page in &pages[..pages.len() - 1] {
        assert_eq!(page.next.as_deref(), page.items.last().map(|s| &*s.name), "next is the last name");
    }
    assert_eq!(pages.last().unwrap().next, None);
    let listed: Vec<&str> = pages.iter().flat_map(|p| names(&p.items)).collect();
    assert_eq!(listed, expected.iter().map(String::as_str).collect::<Vec<_>>());
}
