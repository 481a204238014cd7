//! `berth-sim`: run one seed, explore many, or show that every known-bug switch is caught.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use berth_core::branch::Branch;
use berth_core::bugs::Bug;
use berth_sim::run::{Outcome, run};
use berth_sim::scenario::Scenario;
use clap::builder::TypedValueParser as _;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(name = "berth-sim", version, about = "Seeded simulation of the Berth gateway under injected races")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Phases {
    /// Simulated time with faults.
    #[arg(long, default_value = "60s", value_parser = humantime_duration)]
    fault_phase: Duration,
    /// Simulated time without faults, after which every sandbox must have converged.
    #[arg(long, default_value = "30s", value_parser = humantime_duration)]
    quiet_phase: Duration,
    /// Switch a known bug back on.
    #[arg(long, value_parser = bug)]
    bug: Option<Bug>,
    /// Gateways sharing the store: more than one is the multi-gateway mode (the reconcile
    /// lease, and faults aimed at its holder).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=3).map(usize::from))]
    gateways: usize,
    /// Nodes: more than one is the many-hosts mode (DESIGN 14), a gateway per node, each with
    /// its own process driver, node losses and partitions (N1, N2); it sets the gateways.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=3).map(usize::from))]
    nodes: usize,
    /// Run the exec workload too (E1-E4).
    #[arg(long)]
    execs: bool,
    /// Give sandboxes deadlines and restart policies, and renew them (T1).
    #[arg(long)]
    lifetimes: bool,
    /// Have every run ask for its providers' endpoints through the egress proxy (G1).
    #[arg(long)]
    egress: bool,
    /// Have clients pause and resume sandboxes, and idle timeouts pause them (S3).
    #[arg(long)]
    state: bool,
    /// Have clients take and delete snapshots, make sandboxes from them and fork (S1, S2, S4).
    #[arg(long)]
    snapshots: bool,
    /// Have clients make and delete volumes and the sandboxes that mount them (S2).
    #[arg(long)]
    volumes: bool,
    /// Have clients reach sandboxes' ports through the preview proxy with their URLs' tokens,
    /// across stops and starts (U1).
    #[arg(long)]
    ports: bool,
    /// Each gateway reads the store's clock off by up to this much, either way (drawn per
    /// gateway from the seed): expiries still wait for the store's clock (T1).
    #[arg(long, default_value = "0s", value_parser = humantime_duration)]
    clock_skew: Duration,
}

fn humantime_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = number.parse().map_err(|_| format!("{s:?} is not a duration like 30s or 500ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(60 * n)),
        _ => Err(format!("{s:?} is not a duration like 30s or 500ms")),
    }
}

fn bug(s: &str) -> Result<Bug, String> {
    Bug::ALL
        .into_iter()
        .find(|b| b.name() == s)
        .ok_or_else(|| format!("no bug {s:?}; known: {}", Bug::ALL.map(Bug::name).join(", ")))
}

#[derive(Subcommand)]
enum Command {
    /// Run one seed.
    Run {
        #[arg(long)]
        seed: u64,
        #[command(flatten)]
        phases: Phases,
        /// Write the trace as JSON lines.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Write an HTML timeline (one swimlane per actor).
        #[arg(long)]
        timeline: Option<PathBuf>,
        /// Print the gateways' own logs to stderr, at this filter (`info`, `berth_gateway=debug`),
        /// each line stamped with its simulated time.
        #[arg(long)]
        log: Option<String>,
    },
    /// Run many seeds.
    Explore {
        #[arg(long, default_value_t = 100)]
        seeds: u64,
        #[arg(long, default_value_t = 0)]
        from: u64,
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        #[command(flatten)]
        phases: Phases,
        /// Print how often each branch of core's decisions ran, and in how many seeds (the
        /// summary always names those never reached).
        #[arg(long)]
        branch_counts: bool,
    },
    /// Switch each known bug on in turn and count the seeds until the simulator catches it.
    Bugs {
        #[arg(long, default_value_t = 500)]
        max_seeds: u64,
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        #[arg(long, default_value = "60s", value_parser = humantime_duration)]
        fault_phase: Duration,
        #[arg(long, default_value = "30s", value_parser = humantime_duration)]
        quiet_phase: Duration,
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=3).map(usize::from))]
        gateways: usize,
    },
}

/// A log line's time: the simulation's, as the host writing it sees it.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{:>10.6}s", berth_sim::world::now().as_secs_f64())
    }
}

fn scenario(seed: u64, phases: &Phases) -> Scenario {
    Scenario::with_phases(seed, phases.fault_phase, phases.quiet_phase)
        .with_gateways(phases.gateways)
        .with_nodes(phases.nodes)
        .with_execs(phases.execs)
        .with_lifetimes(phases.lifetimes)
        .with_egress(phases.egress)
        .with_state(phases.state)
        .with_snapshots(phases.snapshots)
        .with_volumes(phases.volumes)
        .with_ports(phases.ports)
        .with_clock_skew(phases.clock_skew)
}

fn reproduce(o: &Outcome, phases: &Phases) -> String {
    let mut command = format!("berth-sim run --seed {}", o.seed);
    if phases.fault_phase != Duration::from_secs(60) || phases.quiet_phase != Duration::from_secs(30) {
        command += &format!(
            " --fault-phase {}s --quiet-phase {}s",
            phases.fault_phase.as_secs(),
            phases.quiet_phase.as_secs()
        );
    }
    if phases.nodes != 1 {
        command += &format!(" --nodes {}", phases.nodes);
    } else if phases.gateways != 1 {
        command += &format!(" --gateways {}", phases.gateways);
    }
    if phases.execs {
        command += " --execs";
    }
    if phases.lifetimes {
        command += " --lifetimes";
    }
    if phases.egress {
        command += " --egress";
    }
    if phases.state {
        command += " --state";
    }
    if phases.snapshots {
        command += " --snapshots";
    }
    if phases.volumes {
        command += " --volumes";
    }
    if phases.ports {
        command += " --ports";
    }
    if !phases.clock_skew.is_zero() {
        command += &format!(" --clock-skew {}ms", phases.clock_skew.as_millis());
    }
    if let Some(bug) = o.bug {
        command += &format!(" --bug {}", bug.name());
    }
    command + " --timeline timeline.html"
}

/// The faults the seed drew (those it left off are not shown), what it is focused on, its
/// sweep's page size and its driver.
fn fault_mix(scenario: &Scenario) -> String {
    let Ok(serde_json::Value::Object(faults)) = serde_json::to_value(&scenario.faults) else { return String::new() };
    let on: Vec<String> = faults
        .iter()
        .filter(|(_, rate)| rate.as_f64().is_some_and(|r| r > 0.0))
        .map(|(name, rate)| format!("{name} {:.3}", rate.as_f64().unwrap_or_default()))
        .collect();
    let focus = scenario.focus.map(|f| format!("; focus {f:?}")).unwrap_or_default();
    format!("{}{focus}; page size {}; {:?} driver", on.join(", "), scenario.page_size, scenario.driver)
}

fn print_violations(o: &Outcome, phases: &Phases) {
    for v in &o.violations {
        println!("seed {}: {} at {:.3}s: {}", o.seed, v.invariant, v.t as f64 / 1e6, v.message);
    }
    if !o.passed() {
        println!("  faults: {}", fault_mix(&scenario(o.seed, phases)));
        println!("  reproduce: {}", reproduce(o, phases));
    }
}

/// Runs `seeds` on `jobs` threads; calls `done` for each outcome as it lands, and stops early
/// once `stop` says so.
fn run_many(
    seeds: std::ops::Range<u64>,
    jobs: usize,
    make: impl Fn(u64) -> (Scenario, Option<Bug>) + Sync,
    done: impl Fn(Outcome) -> bool + Sync,
) {
    let next = AtomicU64::new(seeds.start);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= seeds.end || stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let (scenario, bug) = make(seed);
                    if done(run(scenario, bug)) {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
    });
}

/// How far a set of seeds reached into core's decisions: per branch, its runs and its seeds.
#[derive(Default)]
struct Reach {
    hits: Vec<(u64, u64)>,
}

impl Reach {
    fn add(&mut self, branches: &[u64]) {
        self.hits.resize(branches.len(), (0, 0));
        for ((hits, seeds), n) in self.hits.iter_mut().zip(branches) {
            *hits += n;
            *seeds += u64::from(*n > 0);
        }
    }

    fn print(&self, counts: bool) {
        let reached = |b: &Branch| self.hits.get(*b as usize).is_some_and(|(hits, _)| *hits > 0);
        if counts {
            println!("{:>12} {:>6}  branch", "runs", "seeds");
            for b in Branch::ALL {
                let (hits, seeds) = self.hits.get(b as usize).copied().unwrap_or_default();
                println!("{hits:>12} {seeds:>6}  {}", b.name());
            }
        }
        let never: Vec<Branch> = Branch::ALL.into_iter().filter(|b| !reached(b)).collect();
        println!("{} of {} branches of core's decisions never reached:", never.len(), Branch::ALL.len());
        for b in never {
            println!("  {}", b.name());
        }
    }
}

fn main() -> std::process::ExitCode {
    match Cli::parse().command {
        Command::Run { seed, phases, trace, timeline, log } => {
            if let Some(filter) = log {
                tracing_subscriber::fmt()
                    .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                    .with_timer(SimTime)
                    .with_writer(std::io::stderr)
                    .with_ansi(false)
                    .init();
            }
            let outcome = run(scenario(seed, &phases), phases.bug);
            if let Some(path) = trace {
                std::fs::write(&path, outcome.trace_lines()).expect("writing the trace");
            }
            if let Some(path) = timeline {
                std::fs::write(&path, berth_sim::timeline::html(&outcome)).expect("writing the timeline");
            }
            println!(
                "seed {}: {} ({:.1}s simulated in {:.2}s, {} trace events)",
                seed,
                if outcome.passed() { "ok" } else { "VIOLATION" },
                outcome.simulated.as_secs_f64(),
                outcome.wall.as_secs_f64(),
                outcome.trace.len()
            );
            print_violations(&outcome, &phases);
            if outcome.passed() { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE }
        }
        Command::Explore { seeds, from, jobs, phases, branch_counts } => {
            let started = Instant::now();
            let bar = ProgressBar::new(seeds);
            bar.set_style(
                ProgressStyle::with_template("{bar:40} {pos}/{len} seeds, {msg} [{elapsed} < {eta}]")
                    .expect("a valid template"),
            );
            let failed = Mutex::new(Vec::new());
            let simulated = Mutex::new(Duration::ZERO);
            let reach = Mutex::new(Reach::default());
            run_many(
                from..from + seeds,
                jobs,
                |seed| (scenario(seed, &phases), phases.bug),
                |o| {
                    *simulated.lock().unwrap() += o.simulated;
                    reach.lock().unwrap().add(&o.branches);
                    if !o.passed() {
                        bar.suspend(|| print_violations(&o, &phases));
                        failed.lock().unwrap().push(o.seed);
                    }
                    bar.inc(1);
                    bar.set_message(format!("{} failed", failed.lock().unwrap().len()));
                    false
                },
            );
            bar.finish();
            let wall = started.elapsed().as_secs_f64();
            let simulated = simulated.lock().unwrap().as_secs_f64();
            let failed = failed.into_inner().unwrap();
            println!(
                "{seeds} seeds from {from} in {wall:.1}s: {} failed; {:.2} seeds/s, {:.1} simulated seconds per wall second",
                failed.len(),
                seeds as f64 / wall,
                simulated / wall
            );
            reach.into_inner().unwrap().print(branch_counts);
            if failed.is_empty() { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE }
        }
        Command::Bugs { max_seeds, jobs, fault_phase, quiet_phase, gateways } => {
            println!("{:<24} {:>10} {:>8} {:>10}  caught by", "known bug", "seeds", "seed", "wall");
            let mut all_caught = true;
            for bug in Bug::ALL {
                let phases = Phases {
                    fault_phase,
                    quiet_phase,
                    bug: Some(bug),
                    gateways: gateways.max(bug.gateways()),
                    nodes: bug.nodes(),
                    execs: bug.execs(),
                    lifetimes: bug.lifetimes(),
                    egress: bug.egress(),
                    state: bug.state(),
                    snapshots: bug.snapshots(),
                    volumes: bug.volumes(),
                    ports: bug.ports(),
                    clock_skew: bug.clock_skew(),
                };
                let started = Instant::now();
                let caught: Mutex<Option<Outcome>> = Mutex::new(None);
                let tried = AtomicU64::new(0);
                run_many(
                    0..max_seeds,
                    jobs,
                    |seed| (scenario(seed, &phases), Some(bug)),
                    |o| {
                        tried.fetch_add(1, Ordering::Relaxed);
                        let mut c = caught.lock().unwrap();
                        if !o.passed() && c.as_ref().is_none_or(|prev| o.seed < prev.seed) {
                            *c = Some(o);
                        }
                        c.is_some()
                    },
                );
                let wall = started.elapsed().as_secs_f64();
                match caught.into_inner().unwrap() {
                    Some(o) => {
                        let v = &o.violations[0];
                        println!(
                            "{:<24} {:>10} {:>8} {:>9.1}s  {}: {}",
                            bug.name(),
                            o.seed + 1,
                            o.seed,
                            wall,
                            v.invariant,
                            v.message
                        );
                        // A catch is only useful if replaying its seed shows the same thing.
                        let replay = run(scenario(o.seed, &phases), Some(bug));
                        let same = replay.violations.first().map(|r| (r.invariant, &r.message, r.t))
                            == Some((v.invariant, &v.message, v.t));
                        let verdict = if same { "same violation" } else { "DIFFERENT" };
                        println!("{:<24} reproduce: {} (replayed: {verdict})", "", reproduce(&o, &phases));
                        all_caught &= same;
                    }
                    None => {
                        all_caught = false;
                        println!(
                            "{:<24} {:>10} {:>8} {:>9.1}s  NOT CAUGHT",
                            bug.name(),
                            format!(">{max_seeds}"),
                            "-",
                            wall
                        );
                    }
                }
            }
            if all_caught { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE }
        }
    }
}
