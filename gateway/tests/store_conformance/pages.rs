//! Paged listings of sandboxes and providers, label selection, and the sandboxes using a
//! provider, each following the writes.

use super::*;

/// 25 sandboxes `box-00`..`box-24`, created in a scrambled order; even ones carry `team=a`,
/// odd ones `team=b`, and multiples of four also `tier=gold`.
pub(crate) async fn create_boxes(store: &Shared) -> Vec<String> {
    for i in (0..25).map(|i| i * 11 % 25) {
        let mut s = sandbox(&format!("sb-{i}"), &format!("box-{i:02}"));
        std::sync::Arc::make_mut(&mut s.spec).labels.insert("team".into(), if i % 2 == 0 { "a" } else { "b" }.into());
        if i % 4 == 0 {
            std::sync::Arc::make_mut(&mut s.spec).labels.insert("tier".into(), "gold".into());
        }
        create(store, &s).await;
    }
    (0..25).map(|i| format!("box-{i:02}")).collect()
}

pub(crate) async fn sandbox_pages(store: Shared) {
    let all = create_boxes(&store).await;
    let everything = BTreeMap::new();
    assert_pages(&all_sandbox_pages(&store, 10, &everything).await, &[10, 10, 5], &all);
    // A page exactly as long as what is left is the last one.
    assert_pages(&all_sandbox_pages(&store, 25, &everything).await, &[25], &all);
    assert_pages(&all_sandbox_pages(&store, 5, &everything).await, &[5; 5], &all);
    // A zero limit still makes progress, one at a time.
    assert_pages(&all_sandbox_pages(&store, 0, &everything).await, &[1; 25], &all);

    // A cursor need not be a stored name.
    let page = store.list_sandboxes(&PageRequest { after: Some("box-09x".into()), limit: 3 }, &everything).await;
    let page = page.unwrap();
    assert_eq!((names(&page.items), page.next.as_deref()), (vec!["box-10", "box-11", "box-12"], Some("box-12")));
    let page = store.list_sandboxes(&PageRequest { after: Some("box-24".into()), limit: 3 }, &everything).await;
    assert_eq!(page.unwrap(), Page { items: vec![], next: None });
}

pub(crate) async fn label_selected_pages(store: Shared) {
    let all = create_boxes(&store).await;
    let even: Vec<String> = all.iter().step_by(2).cloned().collect();
    let team_a = selector(&[("team", "a")]);
    assert_pages(&all_sandbox_pages(&store, 5, &team_a).await, &[5, 5, 3], &even);
    assert_pages(&all_sandbox_pages(&store, 13, &team_a).await, &[13], &even);

    let odd: Vec<String> = all.iter().skip(1).step_by(2).cloned().collect();
    assert_pages(&all_sandbox_pages(&store, 10, &selector(&[("team", "b")])).await, &[10, 2], &odd);

    let gold: Vec<String> = all.iter().step_by(4).cloned().collect();
    assert_pages(&all_sandbox_pages(&store, 3, &selector(&[("team", "a"), ("tier", "gold")])).await, &[3, 3, 1], &gold);
    assert_pages(&all_sandbox_pages(&store, 3, &selector(&[("team", "b"), ("tier", "gold")])).await, &[0], &[]);
    assert_pages(&all_sandbox_pages(&store, 3, &selector(&[("team", "c")])).await, &[0], &[]);
    // A key is matched as a whole, not as a prefix or a pattern.
    assert_pages(&all_sandbox_pages(&store, 3, &selector(&[("tea", "a")])).await, &[0], &[]);
    assert_pages(&all_sandbox_pages(&store, 3, &selector(&[("te%", "a")])).await, &[0], &[]);
}

pub(crate) async fn label_selection_follows_writes(store: Shared) {
    let mut a = sandbox("sb-a", "alpha");
    let labels = &mut std::sync::Arc::make_mut(&mut a.spec).labels;
    labels.extend([("team", "a"), ("tier", "gold"), ("zone", "x")].map(|(k, v)| (k.to_string(), v.to_string())));
    create(&store, &a).await;
    let b = sandbox("sb-b", "beta");
    create(&store, &b).await;
    let selected = async |pairs: &[(&str, &str)]| -> Vec<String> {
        let page = store.list_sandboxes(&PageRequest { after: None, limit: 10 }, &selector(pairs)).await.unwrap();
        names(&page.items).into_iter().map(str::to_string).collect()
    };
    assert_eq!(selected(&[("team", "a"), ("zone", "x")]).await, ["alpha"]);

    // One label's value changes, one goes, one stays, one comes; another sandbox gains one.
    let mut a2 = bumped(&a);
    let labels = &mut std::sync::Arc::make_mut(&mut a2.spec).labels;
    labels.insert("team".into(), "b".into());
    labels.remove("tier");
    labels.insert("owner".into(), "ops".into());
    let mut b2 = bumped(&b);
    std::sync::Arc::make_mut(&mut b2.spec).labels.insert("team".into(), "b".into());
    for s in [&a2, &b2] {
        store.commit(&[Write::UpdateSandbox { record: s.clone(), expected: 1 }]).await.unwrap();
    }
    assert_eq!(selected(&[("team", "a")]).await, Vec::<String>::new());
    assert_eq!(selected(&[("team", "b")]).await, ["alpha", "beta"]);
    assert_eq!(selected(&[("tier", "gold")]).await, Vec::<String>::new());
    assert_eq!(selected(&[("zone", "x"), ("owner", "ops"), ("team", "b")]).await, ["alpha"]);

    // A write that leaves the labels alone leaves the selection alone.
    let a3 = bumped(&a2);
    store.commit(&[Write::UpdateSandbox { record: a3, expected: 2 }]).await.unwrap();
    assert_eq!(selected(&[("zone", "x"), ("owner", "ops"), ("team", "b")]).await, ["alpha"]);
    // A refused write changes none of them.
    let mut stale = bumped(&a2);
    std::sync::Arc::make_mut(&mut stale.spec).labels.clear();
    assert!(store.commit(&[Write::UpdateSandbox { record: stale, expected: 2 }]).await.is_err());
    assert_eq!(selected(&[("zone", "x")]).await, ["alpha"]);
}

pub(crate) async fn provider_pages(store: Shared) {
    for i in (0..12).map(|i| i * 5 % 12) {
        store.commit(&[Write::CreateProvider(provider(&format!("prov-{i:02}")))]).await.unwrap();
    }
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = store.list_providers(&PageRequest { after, limit: 5 }).await.unwrap();
        after = page.next.clone();
        if let Some(next) = &page.next {
            assert_eq!(Some(next), page.items.last().map(|p| &p.name), "next is the last name");
        }
        pages.push(page);
        if after.is_none() {
            break;
        }
    }
    assert_eq!(pages.iter().map(|p| p.items.len()).collect::<Vec<_>>(), vec![5, 5, 2]);
    let listed: Vec<String> = pages.iter().flat_map(|p| p.items.iter().map(|p| p.name.clone())).collect();
    assert_eq!(listed, (0..12).map(|i| format!("prov-{i:02}")).collect::<Vec<_>>());
    assert_eq!(pages[0].items[0], provider("prov-00"), "records come back whole, credentials included");

    let whole = store.list_providers(&PageRequest { after: None, limit: 12 }).await.unwrap();
    assert_eq!((whole.items.len(), whole.next), (12, None));
    let one = store.list_providers(&PageRequest { after: Some("prov-03".into()), limit: 0 }).await.unwrap();
    assert_eq!((one.items, one.next.as_deref()), (vec![provider("prov-04")], Some("prov-04")));
}

pub(crate) async fn sandboxes_using_follows_writes(store: Shared) {
    let mut a = sandbox("sb-a", "alpha");
    std::sync::Arc::make_mut(&mut a.providers).insert("p1".into());
    let mut b = sandbox("sb-b", "beta");
    std::sync::Arc::make_mut(&mut b.providers).extend(["p1".to_string(), "p2".to_string()]);
    let c = sandbox("sb-c", "gamma");
    // Created out of name order: results are ordered by name.
    for s in [&b, &c, &a] {
        create(&store, s).await;
    }
    assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![a.clone(), b.clone()]);
    assert_eq!(store.sandboxes_using("p2").await.unwrap(), vec![b.clone()]);
    assert_eq!(store.sandboxes_using("p3").await.unwrap(), vec![]);

    let mut b2 = bumped(&b);
    b2.providers = std::sync::Arc::new(["p2".to_string(), "p3".to_string()].into());
    store.commit(&[Write::UpdateSandbox { record: b2.clone(), expected: 1 }]).await.unwrap();
    assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![a.clone()]);
    assert_eq!(store.sandboxes_using("p2").await.unwrap(), vec![b2.clone()], "the current record is returned");
    assert_eq!(store.sandboxes_using("p3").await.unwrap(), vec![b2.clone()]);

    store.commit(&[Write::RemoveSandbox { id: a.id.clone(), expected: 1 }]).await.unwrap();
    assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![]);
    // A sandbox's references do not depend on the provider record existing.
    assert_eq!(store.provider("p2").await.unwrap(), None);
    assert_eq!(store.sandboxes_using("p2").await.unwrap(), vec![b2]);
}
