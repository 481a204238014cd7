//! Pooled connections and what their errors mean.

use deadpool_postgres::Object;
use tokio_postgres::error::SqlState;

use super::UNCHANGED;

/// A pooled connection lent to one commit. A commit abandoned part way (its caller gone) may
/// leave it inside a transaction with answers still to come: unless given back, it leaves the
/// pool and closes (PostgreSQL then rolls the transaction back) rather than serve the next caller.
pub(super) struct Lent(pub(super) Option<Object>);

impl Lent {
    /// Back to the pool, idle: the commit read every answer.
    pub(super) fn give_back(mut self) {
        drop(self.0.take());
    }
}

impl std::ops::Deref for Lent {
    type Target = Object;
    fn deref(&self) -> &Object {
        self.0.as_ref().expect("emptied only by give_back and drop, which consume it")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(Object::take(client));
        }
    }
}

/// `user@host:port/database`, for messages.
pub(super) fn target(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("?");
    let database = config.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{database}")
}

/// Whether the store is on this host (loopback or a Unix socket), where plaintext never crosses
/// a network.
pub(super) fn local(config: &tokio_postgres::Config) -> bool {
    config.get_hosts().iter().all(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => {
            name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        tokio_postgres::config::Host::Unix(_) => true,
    })
}

/// libpq's `verify-ca` and `verify-full` are not spelled so here: say what is.
pub(super) const VERIFY_HINT: &str =
    " (Berth's sslmode=require checks the server's certificate and name, as libpq's verify-full does)";

/// The server's own message where there is one (tokio-postgres's Display says only "db error"),
/// else the error with its causes (a TLS handshake's says only that it failed; its cause, why).
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.code().code(), db.message());
    }
    crate::error::with_causes(e)
}

/// Why the pool lent no connection.
pub(super) fn unlent(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => describe(e),
        other => other.to_string(),
    }
}

/// Aborted by PostgreSQL for a reason that passes, or a write that changed nothing although its
/// conditions held when checked: run the commit again, as a transaction, whose checks then see
/// what happened.
pub(super) fn retryable(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_DEADLOCK_DETECTED
            || *c == SqlState::T_R_SERIALIZATION_FAILURE
            || *c == SqlState::UNIQUE_VIOLATION
            || c.code() == UNCHANGED
    })
}
