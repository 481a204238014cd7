//! Activity that holds a sandbox's idle timeout off (DESIGN 9.1) while a stream is open: an
//! attach or a logs follow touches the record when it opens and every quarter of the timeout
//! while it stays open, so a sandbox watched through a gateway that dies expires a timeout
//! after the last touch, never while a live gateway serves the stream.

use berth_core::{Command, Request};
use tokio::task::JoinHandle;
use tracing::warn;

use super::Engine;
use crate::error::ApiError;

/// Touches a sandbox's record while it lives; nothing for a sandbox without an idle timeout.
pub struct Active(Option<JoinHandle<()>>);

impl Drop for Active {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// What the streaming APIs count as activity on a sandbox.
#[derive(Clone)]
pub struct Activity {
    engine: Engine,
}

impl Activity {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    /// Counts a stream on the sandbox named `name` as activity for as long as the returned
    /// guard lives. The first touch is committed before this returns: a client holding the
    /// stream has been counted.
    pub async fn keep_active(&self, name: &str) -> Result<Active, ApiError> {
        let Some(sandbox) = self.engine.inner.store.sandbox_by_name(name).await? else { return Ok(Active(None)) };
        let Some(timeout) = sandbox.spec.lifetime.idle_timeout else { return Ok(Active(None)) };
        let request = Request::new(Command::TouchSandbox { name: name.to_string(), id: sandbox.id }, None);
        self.engine.execute(&request).await?;
        let engine = self.engine.clone();
        let every = timeout / 4;
        Ok(Active(Some(tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    () = engine.shutdown().begun() => return,
                    () = tokio::time::sleep(every) => {}
                }
                if let Err(e) = engine.execute(&request).await {
                    warn!(sandbox = %request.plan().sandbox.map(|s| s.name).unwrap_or_default(), error = %e, "cannot count an open stream as activity; tried again in a quarter of the idle timeout");
                }
            }
        }))))
    }
}
