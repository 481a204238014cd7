//! A gateway killed at each fault point of a start, a stop or a delete: the next gateway's driver
//! looks, re-drives and finishes, and every generation runs once.

use super::*;

/// How many times [`a_gateway_killed_at_each_step_of_start_stop_and_delete_leaves_one_run_per_generation`]
/// goes through every crash point: `BERTH_CRASH_ROUNDS` (the long job `ci/crashes` sets 100).
pub(crate) fn crash_rounds() -> usize {
    std::env::var("BERTH_CRASH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(1)
}

/// D1 at every step (defects 1 and 2 of issue 13, and its acceptance 4): a gateway that dies at
/// any step of a start, a stop or a delete leaves nothing that the next gateway's driver runs a
/// second time, takes for another run's exit, or leaves behind; a stop that driver acknowledges
/// stops what runs.
pub(crate) async fn a_gateway_killed_at_each_step_of_start_stop_and_delete_leaves_one_run_per_generation(
    runtime: Runtime,
) {
    let Some(target) = target(runtime, "crash").await else { return };
    let data = DataDir::new();
    // The data directory's secrets; no gateway runs while the drivers act (its sweeps would
    // take these sandboxes, which have no records, for leftovers).
    drop(target.gateway(&data, &[]).await);
    for round in 0..crash_rounds() {
        for at in CrashPoint::ALL {
            // Container names are the runtime's, shared by every test: the id must be this run's.
            let id = &format!("sb-crash-{}-{round}-{at:?}", std::process::id()).to_lowercase();
            let case = format!("{runtime:?} {at:?}, round {round}");
            match at.act() {
                Act::Start => start_cut_short(&target, &data, id, at, &case).await,
                Act::Stop => stop_cut_short(&target, &data, id, at, &case).await,
                Act::Delete => delete_cut_short(&target, &data, id, at, &case).await,
            }
            let left = target.leftovers(&data);
            assert!(left.is_empty(), "{case}: left behind: {left:?}");
        }
    }
}

/// A start cut short before or after the runtime started the run: the next driver's look and
/// re-driven start find the run, if any, and run the generation once; its stop stops it.
pub(crate) async fn start_cut_short(target: &Target, data: &DataDir, id: &str, at: CrashPoint, case: &str) {
    let sandbox = SandboxId::new(id);
    let launch = |generation| sleeping(target, data, id, generation);
    let crashed = target.driver(data).await;
    crashed.start_then_crash(launch(1), at).await.unwrap();
    drop(crashed);
    let expected = usize::from(at == CrashPoint::AfterRuntimeStart);
    if expected == 1 {
        until_visible(target, id).await;
    }
    assert_eq!(live_runs(target, id), expected, "{case}: runs after the crash");

    let driver = target.driver(data).await;
    let seen = driver.get(&sandbox).await.unwrap();
    let reply = driver.start(launch(1)).await.unwrap();
    let StartReply::Running { started_at } = reply else { panic!("{case}: {reply:?}") };
    if let RuntimeState::Running { started_at: before, held: None } = seen {
        assert_eq!(before, started_at, "{case}: the run was started again");
    }
    assert_eq!(driver.start(launch(1)).await.unwrap(), StartReply::Running { started_at }, "{case}");
    assert_eq!(live_runs(target, id), 1, "{case}: one run of the generation");

    let stopped = driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(e) if e.started_at == started_at), "{case}: {stopped:?}");
    assert_eq!(live_runs(target, id), 0, "{case}: the acknowledged stop left a run");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
}

/// A stop cut short once the runtime was told to stop the run: the next driver shows the run's
/// own end (or the run, still ending), its stop is acknowledged with that end and nothing runs;
/// the next generation then runs once.
pub(crate) async fn stop_cut_short(target: &Target, data: &DataDir, id: &str, at: CrashPoint, case: &str) {
    let sandbox = SandboxId::new(id);
    let launch = |generation| sleeping(target, data, id, generation);
    let crashed = target.driver(data).await;
    let StartReply::Running { started_at } = crashed.start(launch(1)).await.unwrap() else {
        panic!("{case}: generation 1 did not start")
    };
    crashed.stop_then_crash(&sandbox, 1, Duration::from_secs(5), at).await.unwrap();
    drop(crashed);

    let driver = target.driver(data).await;
    let own = |state: &RuntimeState| match state {
        RuntimeState::Exited(e) => e.started_at == started_at,
        RuntimeState::Running { started_at: s, held: None } => *s == started_at,
        _ => false,
    };
    let seen = driver.get(&sandbox).await.unwrap();
    assert!(own(&seen), "{case}: after the crash the runtime shows {seen:?}, not generation 1's run");
    let stopped = driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(_)) && own(&stopped), "{case}: the stop gave {stopped:?}");
    assert_eq!(live_runs(target, id), 0, "{case}: the acknowledged stop left a run");

    let StartReply::Running { started_at: next } = driver.start(launch(2)).await.unwrap() else {
        panic!("{case}: generation 2 did not start")
    };
    assert!(next > started_at, "{case}: generation 2's run started at {next:?}, before generation 1's");
    assert_eq!(driver.start(launch(2)).await.unwrap(), StartReply::Running { started_at: next }, "{case}");
    assert_eq!(live_runs(target, id), 1, "{case}: one run of generation 2");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
}

/// A delete cut short after its tombstone, or after the run and the compute resource went: the
/// next driver's delete finishes it, nothing runs and nothing is left, and a late start of the
/// deleted sandbox makes nothing.
pub(crate) async fn delete_cut_short(target: &Target, data: &DataDir, id: &str, at: CrashPoint, case: &str) {
    let sandbox = SandboxId::new(id);
    let crashed = target.driver(data).await;
    assert!(matches!(crashed.start(sleeping(target, data, id, 1)).await.unwrap(), StartReply::Running { .. }));
    crashed.delete_then_crash(&sandbox, Duration::from_secs(5), at).await.unwrap();
    drop(crashed);
    let expected = usize::from(at == CrashPoint::AfterTombstone);
    assert_eq!(live_runs(target, id), expected, "{case}: runs after the crash");

    let driver = target.driver(data).await;
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    assert_eq!(live_runs(target, id), 0, "{case}: the delete left a run");
    let seen = driver.get(&sandbox).await.unwrap();
    assert!(matches!(seen, RuntimeState::Absent { .. }), "{case}: {seen:?}");
    let late = driver.start(sleeping(target, data, id, 1)).await.unwrap();
    assert!(matches!(late, StartReply::Failed { .. }), "{case}: a start after the delete gave {late:?}");
    assert_eq!(live_runs(target, id), 0, "{case}: the late start ran");
}

/// D1 on the stop side: a gateway that died right after the runtime started a run, before
/// recording it, must not leave a stop that succeeds while the run goes on.
pub(crate) async fn a_stop_after_a_crashed_start_stops_the_unrecorded_run(runtime: Runtime) {
    let Some(target) = target(runtime, "crashstop").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-crash-stop-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let launch = |generation| sleeping(&target, &data, id, generation);
    // Generation 1 ran and was stopped; generation 2's start was cut short after the runtime
    // started it.
    let driver = target.driver(&data).await;
    assert!(matches!(driver.start(launch(1)).await.unwrap(), StartReply::Running { .. }));
    driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    driver.start_then_crash(launch(2), CrashPoint::AfterRuntimeStart).await.unwrap();
    drop(driver);
    until_visible(&target, id).await;
    let driver = target.driver(&data).await;
    let stopped = driver.stop(&sandbox, 2, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(_)), "{runtime:?}: {stopped:?}");
    assert_eq!(live_runs(&target, id), 0, "{runtime:?}: the acknowledged stop left generation 2 running");
    // And generation 2 is not started again: its run happened.
    let reply = driver.start(launch(2)).await.unwrap();
    assert!(matches!(reply, StartReply::Exited(_)), "{runtime:?}: {reply:?}");
    assert_eq!(live_runs(&target, id), 0);
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}

/// D1, found by the simulator (process driver): a gateway died right after the supervisor was
/// spawned, and the run was killed before anyone looked; the re-driven start must take the
/// killed run for the generation's, not run the generation a second time. Found by the
/// 10,000-seed exploration: the run killed and its compute resource removed out of band, which
/// leaves nothing to tell that run from one never started; the generation's run may have
/// happened, so its resource is reported missing, nothing runs, and the next generation runs.
pub(crate) async fn a_run_killed_after_a_crashed_start_is_not_started_again(runtime: Runtime) {
    let Some(target) = target(runtime, "crashkill").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    for removed in [false, true] {
        let id = &format!("sb-crash-kill-{}-{removed}", std::process::id());
        let case = if removed { format!("{runtime:?}, killed and removed") } else { format!("{runtime:?}, killed") };
        let sandbox = SandboxId::new(id);
        let launch = |generation| sleeping(&target, &data, id, generation);
        let driver = target.driver(&data).await;
        driver.start_then_crash(launch(1), CrashPoint::AfterRuntimeStart).await.unwrap();
        drop(driver);
        until_visible(&target, id).await;
        target.kill_out_of_band(id);
        while live_runs(&target, id) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if removed {
            target.remove_out_of_band(&data, id);
        }
        let driver = target.driver(&data).await;
        let reply = driver.start(launch(1)).await.unwrap();
        if removed {
            assert_eq!(reply, StartReply::Gone, "{case}");
        } else {
            assert!(matches!(reply, StartReply::Exited(_)), "{case}: {reply:?}");
        }
        assert_eq!(live_runs(&target, id), 0, "{case}: generation 1 ran a second time");
        assert!(matches!(driver.start(launch(2)).await.unwrap(), StartReply::Running { .. }), "{case}");
        assert_eq!(live_runs(&target, id), 1, "{case}: one run of generation 2");
        driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    }
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}

/// Found by the crash e2e test under load: generation 1's run was killed without recording its
/// exit, generation 2's start was cut short before anything ran, and a look in between recorded
/// generation 1's exit on its behalf. The re-driven start took that exit for generation 2's run
/// having happened, and the sandbox went to Error without ever running generation 2.
pub(crate) async fn a_look_between_a_crashed_start_and_its_redrive_does_not_pass_the_old_exit_for_the_new_run(
    runtime: Runtime,
) {
    let Some(target) = target(runtime, "oldexit").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-old-exit-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let launch = |generation| sleeping(&target, &data, id, generation);
    let driver = target.driver(&data).await;
    assert!(matches!(driver.start(launch(1)).await.unwrap(), StartReply::Running { .. }));
    target.kill_out_of_band(id);
    driver.start_then_crash(launch(2), CrashPoint::BeforeRuntimeStart).await.unwrap();
    drop(driver);
    let driver = target.driver(&data).await;
    let seen = driver.get(&sandbox).await.unwrap();
    assert!(matches!(seen, RuntimeState::Exited(_)), "{runtime:?}: {seen:?}");
    let reply = driver.start(launch(2)).await.unwrap();
    assert!(matches!(reply, StartReply::Running { .. }), "{runtime:?}: generation 2 never ran: {reply:?}");
    assert_eq!(live_runs(&target, id), 1, "{runtime:?}");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}

/// The process driver's compute resource is the sandbox's folder, which an operator can remove
/// while the run in it goes on. A gateway died right after the spawn, and the folder went with
/// the run still alive: the re-driven start adopts that run rather than taking the folder's
/// absence for a run that ended, so the generation runs once and its stop stops it.
pub(crate) async fn a_folder_removed_under_an_unrecorded_live_run_leaves_the_run_to_stop() {
    let Some(target) = target(Runtime::Process, "crashrmlive").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-crash-rm-live-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let launch = |generation| sleeping(&target, &data, id, generation);
    let driver = target.driver(&data).await;
    driver.start_then_crash(launch(1), CrashPoint::AfterRuntimeStart).await.unwrap();
    drop(driver);
    until_visible(&target, id).await;
    // `rm -rf` alone: the run lives on (it may still write into the folder meanwhile).
    let folder = data.path.join("sandboxes").join(id);
    while folder.exists() {
        let _ = std::fs::remove_dir_all(&folder);
    }
    assert_eq!(live_runs(&target, id), 1);
    let driver = target.driver(&data).await;
    let reply = driver.start(launch(1)).await.unwrap();
    assert!(matches!(reply, StartReply::Running { .. }), "the live run was not adopted: {reply:?}");
    assert_eq!(live_runs(&target, id), 1, "generation 1 ran a second time");
    let stopped = driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(_)), "{stopped:?}");
    assert_eq!(live_runs(&target, id), 0, "the acknowledged stop left the run");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// D1 over process trees, found by the simulator (seeds 20 and 154 of `--execs --lifetimes
/// --egress`): a gateway died right after the supervisor was spawned, then the command exited,
/// leaving a child deaf to SIGTERM in the run's group, and the supervisor went after recording
/// the exit. The next driver knows the run only by its `began` and `exit` records, with no pid:
/// it must still find the group by the identity its members carry, so that the acknowledged
/// stop ends the child.
pub(crate) async fn a_child_of_an_unrecorded_run_whose_supervisor_went_is_stopped_with_it() {
    let Some(target) = target(Runtime::Process, "crashchild").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-crash-child-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let mut launch = sleeping(&target, &data, id, 1);
    launch.spec.command =
        ["sh", "-c", "(trap '' TERM; exec sleep 3600) & sleep 0.3; exit 3"].map(String::from).to_vec();
    let driver = target.driver(&data).await;
    driver.start_then_crash(launch, CrashPoint::AfterRuntimeStart).await.unwrap();
    drop(driver);
    until_visible(&target, id).await;
    // The command exits and its supervisor records the exit; with no gateway to report it to,
    // the supervisor would try for a while: it is killed once the record is there. The child
    // lives on in the group.
    let exit = data.path.join("sandboxes").join(id).join("run").join(berth_drivers::handoff::exit::FILE);
    for _ in 0..500 {
        if exit.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(exit.exists(), "the supervisor never recorded its command's exit");
    for pid in supervisor_pids(id) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    while live_runs(&target, id) > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(run_members(id).len(), 1, "the child deaf to SIGTERM is gone already: the test shows nothing");
    let driver = target.driver(&data).await;
    let reply = driver.start(sleeping(&target, &data, id, 1)).await.unwrap();
    assert!(matches!(reply, StartReply::Exited(_)), "generation 1's run happened: {reply:?}");
    let stopped = driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(_)), "{stopped:?}");
    assert_eq!(run_members(id), Vec::<i32>::new(), "the acknowledged stop left the run's child running");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind: {left:?}");
}
