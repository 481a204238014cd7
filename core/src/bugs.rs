//! Known-bug switches, compiled only with the `bugs` feature, which only the simulator enables.
//! Each puts one motivating race back, so the simulator can show that it catches it. All are
//! off unless a run turns one on, for its own thread (a simulation runs on one thread).

use std::cell::Cell;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bug {
    /// R3: polled snapshots (get and list) skip the exit fence.
    PollBypassesFence,
    /// The event-path R3: watch events skip the exit fence, so a delayed exit event of the
    /// previous run applied after a restart counts.
    EventBypassesFence,
    /// R2: a delete that meets a conflicting write fails instead of re-deciding.
    DeleteWithoutRetry,
    /// R1: the identity rotation is not part of the Starting write: the start effect launches
    /// the next generation, and a later write (the driver's reply) persists it.
    RotationOutsideStart,
}

impl Bug {
    pub const ALL: [Bug; 4] =
        [Bug::PollBypassesFence, Bug::EventBypassesFence, Bug::DeleteWithoutRetry, Bug::RotationOutsideStart];

    pub fn name(self) -> &'static str {
        match self {
            Bug::PollBypassesFence => "poll-bypasses-fence",
            Bug::EventBypassesFence => "event-bypasses-fence",
            Bug::DeleteWithoutRetry => "delete-without-retry",
            Bug::RotationOutsideStart => "rotation-outside-start",
        }
    }
}

thread_local! {
    static ON: Cell<Option<Bug>> = const { Cell::new(None) };
}

/// Turns `bug` on (or every bug off) for this thread.
pub fn set(bug: Option<Bug>) {
    ON.with(|on| on.set(bug));
}

pub fn on(bug: Bug) -> bool {
    ON.with(|on| on.get() == Some(bug))
}
