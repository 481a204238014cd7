//! A gateway's shutdown as its long-lived streams hear it. It is a handle of its own, so that a
//! feature holding only its service and this can end its streams without the whole engine.

use tokio::sync::watch;

/// Set once the gateway shuts down; never unset.
#[derive(Clone, Default)]
pub struct Shutdown(watch::Sender<bool>);

impl Shutdown {
    /// Asks every long-lived stream (supervisor sessions, egress, watches, exec output, logs
    /// followed) to end.
    pub fn begin(&self) {
        self.0.send_replace(true);
    }

    /// Resolves once the gateway is shutting down.
    pub async fn begun(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|down| *down).await;
    }

    /// Whether the gateway is shutting down.
    pub fn is_begun(&self) -> bool {
        *self.0.borrow()
    }
}
