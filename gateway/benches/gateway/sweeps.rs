//! Reconcile sweeps over many sandboxes, and the lease holder's expiry timers.

use super::*;

pub(crate) async fn sweep_time(sandboxes: usize) -> (Duration, usize) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let spec = SandboxSpec { image: "i".into(), command: vec!["true".into()], ..Default::default() };
    for i in 0..sandboxes {
        let command = Command::CreateSandbox {
            id: engine.new_sandbox_id(),
            name: format!("s{i:05}"),
            spec: spec.clone(),
            providers: Default::default(),
            deadline: None,
        };
        engine.execute(&Request::new(command, None)).await.unwrap();
    }
    // Let every start effect land, so the sweep sees a settled fleet.
    while engine.busy() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let settings = ReconcileSettings::default();
    sweep(&engine, &settings).await.unwrap();
    let started = Instant::now();
    let stats = sweep(&engine, &settings).await.unwrap();
    (started.elapsed(), stats.records)
}

/// The lease holder's timers over `sandboxes` records on SQLite, every one with a deadline and
/// `due` of them past it: how long reading every record and scheduling them takes, and how long
/// expiring the due ones (a stop each, through the CAS) then takes.
pub(crate) async fn expiry_sweep_time(sandboxes: usize, due: usize) -> (Duration, Duration, usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    for i in 0..sandboxes {
        let ttl = if i < due { Duration::from_millis(1) } else { Duration::from_secs(3600) };
        let spec = SandboxSpec {
            image: "i".into(),
            command: vec!["true".into()],
            lifetime: Lifetime { ttl: Some(ttl), ..Lifetime::default() },
            ..Default::default()
        };
        let command = Command::CreateSandbox {
            id: engine.new_sandbox_id(),
            name: format!("s{i:05}"),
            spec,
            providers: Default::default(),
            deadline: None,
        };
        engine.execute(&Request::new(command, None)).await.unwrap();
    }
    while engine.busy() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What the holder's sweep reads anyway, then the schedule made of it.
    let started = Instant::now();
    let mut records = Vec::new();
    let mut page = PageRequest { after: None, limit: ReconcileSettings::default().page_size };
    loop {
        let batch = engine.store().list_sandboxes(&page, &BTreeMap::new()).await.unwrap();
        records.extend(batch.items);
        match batch.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    let mut schedule = Schedule::of(&records, engine.now());
    let scanned = started.elapsed();
    let scheduled = schedule.len();
    let started = Instant::now();
    let fired = schedule.fire_due(&engine).await;
    (scanned, started.elapsed(), scheduled, fired)
}

pub(crate) fn sweeps(runtime: &tokio::runtime::Runtime, quick: bool) {
    println!("reconcile sweep (SQLite, no-op driver listing every sandbox)");
    println!("{:>10} {:>14} {:>16}", "sandboxes", "sweep", "per sandbox");
    let fleets = if quick { vec![20] } else { vec![1_000, 10_000] };
    for n in fleets {
        let (took, records) = runtime.block_on(sweep_time(n));
        println!("{records:>10} {:>14?} {:>16?}", took, took / records as u32);
        figure(&format!("reconcile sweep, {records} sandboxes"), took.as_secs_f64() * 1e3, "ms");
    }
    println!();
    println!("expiry sweep: the lease holder's timers (SQLite, every sandbox with a deadline)");
    println!("{:>10} {:>14} {:>8} {:>16}", "sandboxes", "schedule scan", "due", "expiring them");
    let fleets = if quick { vec![(20, 2)] } else { vec![(1_000, 10), (10_000, 100)] };
    for (n, due) in fleets {
        let (scan, fire, scheduled, fired) = runtime.block_on(expiry_sweep_time(n, due));
        assert_eq!((scheduled, fired), (n, due), "every deadline scheduled, the due ones expired");
        println!("{scheduled:>10} {:>14?} {fired:>8} {:>16?}", scan, fire);
        figure(&format!("expiry sweep schedule scan, {n} sandboxes"), scan.as_secs_f64() * 1e3, "ms");
        figure(&format!("expiring {due} due sandboxes of {n}"), fire.as_secs_f64() * 1e3, "ms");
    }
}
