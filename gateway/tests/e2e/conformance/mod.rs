//! One conformance suite, run against every driver: the process driver, Docker and Podman.
//! Each test drives a real gateway binary on a real runtime. Docker and Podman tests need their
//! daemons (`ci/runtimes up`) and a static supervisor (`ci/build-static-supervisor`); under
//! `ci/test` (`BERTH_REQUIRE_RUNTIMES=1`) a missing one is a failure, elsewhere the test says
//! it skips.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use berth_core::{RuntimeState, SandboxId, SandboxSpec, StartReply};
use berth_drivers::container::docker::DockerEngine;
use berth_drivers::container::podman::PodmanEngine;
use berth_drivers::container::{ContainerConfig, ContainerDriver, Engine, container_name, image, volume_name};
use berth_drivers::process::{ProcessConfig, ProcessDriver};
use berth_drivers::{Act, CrashPoint, Driver, Launch};
use berth_gateway::data_dir::SOCKET_DIR;
use berth_proto::v1 as pb;

use crate::harness::*;

mod crashes;
mod gateways;
mod lifecycle;
mod out_of_band;
mod races;
mod runs;
mod target;

use crashes::*;
use gateways::*;
use lifecycle::*;
use out_of_band::*;
use races::*;
pub(crate) use runs::supervisor_pids;
use runs::*;
use target::*;
pub(crate) use target::{Runtime, Target, clean_up, create_in, image_for, target, target_alone};

mod out_of_band_restart {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn docker() {
        super::an_out_of_band_restart_then_one_start_is_ready(Runtime::Docker).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn podman() {
        super::an_out_of_band_restart_then_one_start_is_ready(Runtime::Podman).await
    }
}

macro_rules! conformance {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn ready_through_the_supervisor() {
                    super::ready_through_the_supervisor(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn fifty_cycles_keep_the_workspace_with_polls_inside_starts() {
                    super::fifty_cycles_keep_the_workspace_with_polls_inside_starts(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_real_exit_is_an_error_with_its_code() {
                    super::a_real_exit_is_an_error_with_its_code(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn stop_and_delete_while_starting_or_stopping() {
                    super::stop_and_delete_while_starting_or_stopping(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_delete_gives_the_run_its_stop_grace() {
                    super::a_delete_gives_the_run_its_stop_grace(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn out_of_band_removal_and_kill() {
                    super::out_of_band_removal_and_kill(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_late_start_of_an_older_generation_is_refused_after_out_of_band_removal() {
                    super::a_late_start_of_an_older_generation_is_refused_after_out_of_band_removal(
                        Runtime::$runtime,
                    )
                    .await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_gateway_killed_at_each_step_of_start_stop_and_delete_leaves_one_run_per_generation() {
                    super::a_gateway_killed_at_each_step_of_start_stop_and_delete_leaves_one_run_per_generation(
                        Runtime::$runtime,
                    )
                    .await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_stop_after_a_crashed_start_stops_the_unrecorded_run() {
                    super::a_stop_after_a_crashed_start_stops_the_unrecorded_run(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_run_killed_after_a_crashed_start_is_not_started_again() {
                    super::a_run_killed_after_a_crashed_start_is_not_started_again(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_stop_decided_for_an_older_generation_leaves_the_newer_run_alone() {
                    super::a_stop_decided_for_an_older_generation_leaves_the_newer_run_alone(Runtime::$runtime)
                        .await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_start_landing_after_the_delete_makes_nothing() {
                    super::a_start_landing_after_the_delete_makes_nothing(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_look_between_a_crashed_start_and_its_redrive_does_not_pass_the_old_exit_for_the_new_run() {
                    super::a_look_between_a_crashed_start_and_its_redrive_does_not_pass_the_old_exit_for_the_new_run(
                        Runtime::$runtime,
                    )
                    .await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_restarted_gateway_adopts_running_sandboxes() {
                    super::a_restarted_gateway_adopts_running_sandboxes(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn two_gateways_racing_on_one_sandbox_get_only_what_the_contract_allows() {
                    super::two_gateways_racing_on_one_sandbox_get_only_what_the_contract_allows(Runtime::$runtime)
                        .await
                }
            }
        )*
    };
}

conformance!(Process => process, Docker => docker, Podman => podman);

/// The process driver only: its compute resource is the sandbox's folder, which an operator can
/// remove while the run in it goes on (see `crashes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_a_folder_removed_under_an_unrecorded_live_run_leaves_the_run_to_stop() {
    a_folder_removed_under_an_unrecorded_live_run_leaves_the_run_to_stop().await
}

/// The process driver only: a run's tree outlives its supervisor in the run's process group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_a_child_of_an_unrecorded_run_whose_supervisor_went_is_stopped_with_it() {
    a_child_of_an_unrecorded_run_whose_supervisor_went_is_stopped_with_it().await
}
