//! A run as a picture: an HTML page with one SVG swimlane per actor (clients, gateways, runtime,
//! supervisors), every traced event on its lane, and the violated invariant marked. With a
//! violation it zooms on the seconds that led to it.

use std::fmt::Write as _;

use berth_core::PhaseKind;

use crate::run::Outcome;
use crate::trace::Kind;
use crate::world::Event;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// An actor's lane: its own, but one for all the supervisors ("client 0" draws as "client0").
fn lane(actor: &str) -> String {
    if actor.contains("supervisor") { "supervisors".to_string() } else { actor.replace(' ', "") }
}

fn colour(e: &Event) -> &'static str {
    match e.kind {
        Kind::Violation => "#d00000",
        Kind::Phase { to: Some(PhaseKind::Error) } => "#e85d04",
        Kind::Phase { .. } => "#2a9d8f",
        Kind::StartBegins | Kind::Running => "#6a4c93",
        Kind::Exited | Kind::Removed | Kind::WorkloadExits => "#9d0208",
        Kind::Driver | Kind::Poll => "#adb5bd",
        Kind::Rejected => "#f48c06",
        Kind::Accepted => "#52b788",
        _ => "#457b9d",
    }
}

pub fn html(outcome: &Outcome) -> String {
    let violation = outcome.trace.iter().find(|e| e.kind == Kind::Violation);
    let end = violation.map_or_else(|| outcome.trace.last().map_or(1, |e| e.t), |v| v.t) + 500_000;
    let start = if violation.is_some() { end.saturating_sub(10_500_000) } else { 0 };
    // With a violation, the sandbox it names, the gateway's polls of the runtime, and the faults.
    let focus =
        violation.and_then(|v| v.detail.split_whitespace().find(|w| w.starts_with("sb") || w.starts_with("r2c")));
    let relevant = |e: &Event| match focus {
        None => true,
        Some(name) => {
            e.kind == Kind::Violation
                || e.actor == "sim"
                || e.kind == Kind::Poll
                || e.detail.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w == name.trim_end_matches(':'))
        }
    };
    let events: Vec<&Event> = outcome.trace.iter().filter(|e| e.t >= start && e.t <= end && relevant(e)).collect();
    let mut lanes: Vec<String> = Vec::new();
    for wanted in [
        "client0",
        "client1",
        "client2",
        "client3",
        "gateway0",
        "gateway1",
        "gateway2",
        "runtime",
        "supervisors",
        "sim",
        "checker",
    ] {
        if events.iter().any(|e| lane(&e.actor) == wanted) {
            lanes.push(wanted.to_string());
        }
    }
    for e in &events {
        if !lanes.contains(&lane(&e.actor)) {
            lanes.push(lane(&e.actor));
        }
    }
    let (left, width, row) = (120.0, 1600.0, 60.0);
    let x = |t: u64| left + (t - start) as f64 / (end - start).max(1) as f64 * width;
    // Lanes start below the violation's headline.
    let top = 50.0;
    let height = top + row * lanes.len() as f64 + 40.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="monospace" font-size="11">"#,
        left + width + 40.0
    );
    for (i, name) in lanes.iter().enumerate() {
        let y = top + row * i as f64;
        let _ = write!(
            svg,
            r##"<line x1="{left}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="4" y="{}">{}</text>"##,
            left + width,
            y + 4.0,
            escape(name)
        );
    }
    for s in (start / 1_000_000)..=(end / 1_000_000) {
        let t = s * 1_000_000;
        if t >= start {
            let _ = write!(
                svg,
                r##"<line x1="{0}" y1="10" x2="{0}" y2="{1}" stroke="#f1f1f1"/><text x="{0}" y="{2}" fill="#999">{s}s</text>"##,
                x(t),
                height - 30.0,
                height - 14.0
            );
        }
    }
    let mut labelled_until = vec![0.0f64; lanes.len()];
    for e in &events {
        let index = lanes.iter().position(|l| *l == lane(&e.actor)).unwrap_or(0);
        let y = top + row * index as f64;
        let cx = x(e.t);
        let tip = escape(&format!("{:.3}s {} {}: {}", e.t as f64 / 1e6, e.actor, e.kind, e.detail));
        if e.kind == Kind::Violation {
            let _ = write!(
                svg,
                r##"<line x1="{cx}" y1="10" x2="{cx}" y2="{}" stroke="#d00000" stroke-width="2"><title>{tip}</title></line>"##,
                height - 30.0
            );
            let _ = write!(
                svg,
                r##"<text x="{}" y="20" fill="#d00000" font-weight="bold">{}</text>"##,
                (cx - 300.0).max(left),
                escape(&e.detail)
            );
            continue;
        }
        let _ = write!(svg, r#"<circle cx="{cx}" cy="{y}" r="4" fill="{}"><title>{tip}</title></circle>"#, colour(e));
        let important = matches!(
            e.kind,
            Kind::Phase { .. }
                | Kind::StartBegins
                | Kind::Running
                | Kind::Exited
                | Kind::Rejected
                | Kind::Call
                | Kind::Lease { .. }
                | Kind::GatewayCrashes
                | Kind::Partition
                | Kind::StoreStalls
        );
        if important && cx > labelled_until[index] {
            let label = escape(&format!("{} {}", e.kind, e.detail));
            let label =
                if label.len() > 60 { format!("{}…", &label[..label.floor_char_boundary(60)]) } else { label };
            let offset = if labelled_until[index] > 0.0 && (index % 2 == 0) { 16.0 } else { -8.0 };
            let _ = write!(svg, r#"<text x="{}" y="{}" fill="{}">{label}</text>"#, cx + 5.0, y + offset, colour(e));
            labelled_until[index] = cx + 6.5 * label.len() as f64;
        }
    }
    svg.push_str("</svg>");
    let title = match violation {
        Some(v) => format!("seed {}: {}", outcome.seed, v.detail),
        None => format!("seed {}: no violation", outcome.seed),
    };
    let bug = outcome.bug.map(|b| format!(" (known bug switched on: {})", b.name())).unwrap_or_default();
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>berth-sim seed {}</title></head><body style=\"font-family:sans-serif\">\
         <h2>{}{}</h2><p>{:.3}s to {:.3}s of simulated time; hover a point for the event. \
         Lanes: clients, the gateways (phase changes, driver calls, the lease), the runtime, the supervisors.</p>{svg}</body></html>\n",
        outcome.seed,
        escape(&title),
        escape(&bug),
        start as f64 / 1e6,
        end as f64 / 1e6
    )
}
