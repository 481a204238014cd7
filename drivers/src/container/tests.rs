use berth_core::ExitMarker;

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
    };
    let running = inspection(Status::Running, t(100), t(50), 0);
    assert_eq!(running.state(), RuntimeState::Running { started_at: Timestamp(100), held: None });
    let exited = inspection(Status::Exited, t(100), t(200), 3);
    let marker =
        ExitMarker { started_at: Timestamp(100), finished_at: Timestamp(200), exit_code: 3, out_of_memory: false };
    assert_eq!(exited.state(), RuntimeState::Exited(marker));
    let oom = Inspection { out_of_memory: true, exit_code: 137, ..exited };
    assert_eq!(oom.state(), RuntimeState::Exited(ExitMarker { exit_code: 137, out_of_memory: true, ..marker }));
    let never = inspection(Status::Created, None, None, 0);
    assert_eq!(never.state(), RuntimeState::Created);
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
