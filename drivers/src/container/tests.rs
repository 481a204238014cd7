use berth_core::{ExitMarker, Hold};

use super::*;

#[test]
fn runtime_times_parse_to_the_nanosecond_and_zero_means_never() {
    let t = parse_time("2026-11-29T12:28:46.049908438Z").unwrap();
    assert_eq!(t.unix_nanos() % 1_000_000_000, 49_908_438);
    assert_eq!(parse_time("0001-01-01T00:00:00Z"), None);
    assert_eq!(parse_time("garbage"), None);
}

#[test]
fn inspections_map_to_runtime_states() {
    let t = |n| Some(Timestamp::from_unix_nanos(n));
    let inspection = |status, started_at, finished_at, exit_code| Inspection {
        status,
        started_at,
        finished_at,
        exit_code,
        out_of_memory: false,
        checkpointed: false,
        restored: false,
    };
    let running = inspection(Status::Running, t(100), t(50), 0);
    assert_eq!(running.state(None), RuntimeState::Running { started_at: Timestamp(100), held: None });
    let exited = inspection(Status::Exited, t(100), t(200), 3);
    let marker =
        ExitMarker { started_at: Timestamp(100), finished_at: Timestamp(200), exit_code: 3, out_of_memory: false };
    assert_eq!(exited.state(None), RuntimeState::Exited(marker));
    let oom = Inspection { out_of_memory: true, exit_code: 137, ..exited };
    assert_eq!(oom.state(None), RuntimeState::Exited(ExitMarker { exit_code: 137, out_of_memory: true, ..marker }));
    let never = inspection(Status::Created, None, None, 0);
    assert_eq!(never.state(None), RuntimeState::Created);
    let paused = inspection(Status::Paused, t(100), t(50), 0);
    assert_eq!(paused.state(None), RuntimeState::Running { started_at: Timestamp(100), held: Some(Hold::Freezer) });
}

/// DESIGN 12.1: Podman shows a checkpointed run as exited and its restore as a new start; the
/// driver's record of the checkpoint says it is the run that started first, held or (once a
/// stop ended it) ended. Without the record, an exit is an exit.
#[test]
fn a_checkpointed_run_is_the_run_it_was() {
    let t = |n| Some(Timestamp::from_unix_nanos(n));
    let checkpointed = Inspection {
        status: Status::Exited,
        started_at: t(100),
        finished_at: t(300),
        exit_code: 0,
        out_of_memory: false,
        checkpointed: true,
        restored: false,
    };
    let record = Checkpoint { run_started_at: Timestamp(100), ended: false };
    let held = RuntimeState::Running { started_at: Timestamp(100), held: Some(Hold::Checkpoint) };
    assert_eq!(checkpointed.state(Some(record)), held);
    let exit =
        ExitMarker { started_at: Timestamp(100), finished_at: Timestamp(300), exit_code: 0, out_of_memory: false };
    assert_eq!(checkpointed.state(None), RuntimeState::Exited(exit), "checkpointed outside Berth");
    let ended = Checkpoint { ended: true, ..record };
    assert_eq!(checkpointed.state(Some(ended)), RuntimeState::Exited(exit));
    // Restored at 500: the same run, under its first start time, alive or exited.
    let restored =
        Inspection { status: Status::Running, started_at: t(500), checkpointed: false, restored: true, ..checkpointed };
    assert_eq!(restored.state(Some(record)), RuntimeState::Running { started_at: Timestamp(100), held: None });
    let exited = Inspection { status: Status::Exited, finished_at: t(900), exit_code: 3, ..restored };
    let marker = ExitMarker { finished_at: Timestamp(900), exit_code: 3, ..exit };
    assert_eq!(exited.state(Some(record)), RuntimeState::Exited(marker));
    // Checkpointed again after its restore: still the first run.
    let again = Inspection { status: Status::Exited, checkpointed: true, ..restored };
    assert_eq!(again.state(Some(record)), held);
    // A new generation's start writes no checkpoint: the restored flag alone changes nothing.
    assert_eq!(restored.state(None), RuntimeState::Running { started_at: Timestamp(500), held: None });
}

#[test]
fn an_engine_bound_to_a_store_sees_only_that_stores_resources_and_older_unlabelled_ones() {
    assert!(of_store(Some("s1"), Some("s1")));
    assert!(!of_store(Some("s2"), Some("s1")));
    assert!(of_store(None, Some("s1")));
    assert!(of_store(Some("s2"), None));
}

#[test]
fn static_executables_are_told_from_dynamic_ones() {
    // This test binary is dynamically linked.
    let me = std::env::current_exe().unwrap();
    assert!(!is_static(&me).unwrap());
}
