//! What the trace records: each event's kind as a type, so the timeline and the tests match
//! kinds (and the few facts they need, such as a phase change's new phase or a lease's term)
//! rather than text. The printed and JSON trace keep each kind's name as a short phrase, with
//! the event's human-readable detail beside it.

use std::fmt;

use berth_core::PhaseKind;
use serde::{Serialize, Serializer};

/// The kind of one traced event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    // The simulation itself.
    /// Faults stop; liveness is checked from here.
    Quiet,
    Violation,
    GatewayRestarts,
    GatewayShutsDown,
    GatewayCrashes,
    /// The runtime's host asked for a gateway to crash after a call took effect.
    GatewayToCrash,
    Partition,
    Repair,
    StoreStalls,
    StoreReplyLate,
    /// A node's host is lost, its gateway and its runs with it.
    NodeLost,
    // Gateways.
    Boot,
    /// The store granted a lease (the reconcile lease, or the node's) to the event's actor (a
    /// take-over), at `term`.
    Lease {
        term: u64,
    },
    /// A sandbox's phase changed in a commit; `to` is `None` when the record was removed.
    Phase {
        to: Option<PhaseKind>,
    },
    Expired,
    /// A sandbox's placement changed: the node (and epoch) it is placed on.
    Placed,
    ExpiredIdle,
    PolicyRestart,
    /// A driver call other than the reconcile loop's polls.
    Driver,
    /// The reconcile loop's list of the runtime (a poll, or a page of one).
    Poll,
    DriverReply,
    // Clients.
    Call,
    Reply,
    /// A client moves to the next gateway.
    Moves,
    Exec,
    Attach,
    Cancel,
    /// An exec's end as a reader saw it.
    End,
    // The runtime host.
    Created,
    StartBegins,
    Running,
    Spawned,
    Signalled,
    Exited,
    /// A run was frozen (paused) or thawed.
    Paused,
    Resumed,
    /// A run was written to a checkpoint, or restored from one.
    Checkpointed,
    Restored,
    /// A paused run's host rebooted: the run is gone.
    PausedRunLost,
    Removed,
    WorkloadExits,
    /// A run's command could not be started.
    Unstartable,
    RestartOutOfBand,
    StaleSupervisor,
    VolumeLingers,
    CallFailed,
    Refused,
    ReplyLost,
    ReplyLate,
    EventDropped,
    EventLate,
    WatchStreamsDropped,
    // Supervisors and egress.
    Accepted,
    Rejected,
    ExitReport,
    Egress,
    EgressRefused,
}

impl Kind {
    /// The kind as the trace prints it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Quiet => "quiet",
            Kind::Violation => "violation",
            Kind::GatewayRestarts => "gateway restarts",
            Kind::GatewayShutsDown => "gateway shuts down",
            Kind::GatewayCrashes => "gateway crashes",
            Kind::GatewayToCrash => "gateway to crash",
            Kind::Partition => "partition",
            Kind::Repair => "repair",
            Kind::StoreStalls => "store stalls",
            Kind::StoreReplyLate => "store reply late",
            Kind::NodeLost => "node lost",
            Kind::Boot => "boot",
            Kind::Lease { .. } => "lease",
            Kind::Phase { .. } => "phase",
            Kind::Expired => "expired",
            Kind::Placed => "placed",
            Kind::ExpiredIdle => "expired idle",
            Kind::PolicyRestart => "policy restart",
            Kind::Driver => "driver",
            Kind::Poll => "poll",
            Kind::DriverReply => "driver reply",
            Kind::Call => "call",
            Kind::Reply => "reply",
            Kind::Moves => "moves",
            Kind::Exec => "exec",
            Kind::Paused => "paused",
            Kind::Resumed => "resumed",
            Kind::Checkpointed => "checkpointed",
            Kind::Restored => "restored",
            Kind::PausedRunLost => "paused run lost",
            Kind::Attach => "attach",
            Kind::Cancel => "cancel",
            Kind::End => "end",
            Kind::Created => "created",
            Kind::StartBegins => "start begins",
            Kind::Running => "running",
            Kind::Spawned => "spawned",
            Kind::Signalled => "signalled",
            Kind::Exited => "exited",
            Kind::Removed => "removed",
            Kind::WorkloadExits => "workload exits",
            Kind::Unstartable => "command cannot start",
            Kind::RestartOutOfBand => "restart out of band",
            Kind::StaleSupervisor => "stale supervisor",
            Kind::VolumeLingers => "volume lingers",
            Kind::CallFailed => "call failed",
            Kind::Refused => "refused",
            Kind::ReplyLost => "reply lost",
            Kind::ReplyLate => "reply late",
            Kind::EventDropped => "event dropped",
            Kind::EventLate => "event late",
            Kind::WatchStreamsDropped => "watch streams dropped",
            Kind::Accepted => "accepted",
            Kind::Rejected => "rejected",
            Kind::ExitReport => "exit report",
            Kind::Egress => "egress",
            Kind::EgressRefused => "egress refused",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// As its name: what a kind carries is in the event's detail too, for the reader.
impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}
