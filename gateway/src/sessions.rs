//! The supervisor sessions this gateway holds, by sandbox: how an exec, its input and its output
//! reach the run that serves it. At most one session per sandbox is current here: a newer
//! connection (a reconnect, or a newer generation) replaces the older, and a session removes
//! only itself when it ends.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use berth_core::SandboxId;
use berth_proto::v1 as pb;
use berth_proto::v1::gateway_message::Message as ToSupervisor;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;

use crate::egress::Connection;

/// What a reader of an exec's output hears through a session.
#[derive(Debug)]
pub enum OutputEvent {
    Data(pb::OutputChunk),
    Gap {
        from: u64,
        to: u64,
    },
    /// The output is complete up to `offset`, or (`unknown`) this run has no such exec.
    End {
        offset: u64,
        unknown: bool,
    },
}

/// How much output a reader lets the supervisor send ahead of what it consumed.
pub const READ_WINDOW: u64 = 4 << 20;

pub struct Session {
    pub sandbox: SandboxId,
    pub generation: u64,
    /// Tells this connection from a later one of the same run.
    connection: u64,
    tx: mpsc::Sender<Result<pb::GatewayMessage, Status>>,
    /// Unbounded: what the supervisor sends a reader is bounded by the credit it granted.
    readers: Mutex<BTreeMap<u64, mpsc::UnboundedSender<OutputEvent>>>,
    next_subscription: AtomicU64,
    /// Connections into the run asked for and not yet answered, by tunnel id.
    tunnels: Mutex<BTreeMap<u64, Tunnel>>,
    next_tunnel: AtomicU64,
}

/// Where a connection into the run asked for is handed over: the connection, or why the run
/// could not make it.
pub type Tunnel = oneshot::Sender<Result<Box<dyn Connection>, String>>;

/// Why a connection into a run was not made.
#[derive(Debug, PartialEq, Eq)]
pub enum PortError {
    /// The supervisor could not connect: nothing listens, most likely (its reason).
    Refused(String),
    /// The run did not answer in time, or its connection is gone.
    NoAnswer(String),
}

/// How long a run's supervisor gets to answer an `OpenPort`: a closed port answers at once.
pub const OPEN_PORT_WITHIN: Duration = Duration::from_secs(1);

impl Session {
    /// Sends `m` to the supervisor; false once the connection is gone.
    pub async fn send(&self, m: ToSupervisor) -> bool {
        self.tx.send(Ok(pb::GatewayMessage { message: Some(m) })).await.is_ok()
    }

    /// Has the run run `exec` (a no-op for one it knows) and send its output from `offset` on,
    /// [`READ_WINDOW`] ahead of what [`Session::grant`] says was consumed. The events end with
    /// the output, or when the connection does (the receiver then closes without an end).
    pub async fn run_and_read(
        &self,
        mut exec: pb::RunExec,
        offset: u64,
    ) -> Option<(u64, mpsc::UnboundedReceiver<OutputEvent>)> {
        let subscription = self.next_subscription.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.readers.lock().unwrap_or_else(PoisonError::into_inner).insert(subscription, tx);
        let read = pb::ReadOutput { subscription, exec_id: exec.exec_id.clone(), offset, credit: READ_WINDOW };
        exec.read = Some(read);
        if self.send(ToSupervisor::RunExec(exec)).await {
            return Some((subscription, rx));
        }
        self.readers.lock().unwrap_or_else(PoisonError::into_inner).remove(&subscription);
        None
    }

    /// A connection to `port` on the run's loopback, made by its supervisor (DESIGN 13.1).
    pub async fn open_port(&self, port: u16) -> Result<Box<dyn Connection>, PortError> {
        let tunnel = self.next_tunnel.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.tunnels.lock().unwrap_or_else(PoisonError::into_inner).insert(tunnel, tx);
        let gone = || PortError::NoAnswer("the run's session is gone".into());
        if !self.send(ToSupervisor::OpenPort(pb::OpenPort { tunnel, port: port.into() })).await {
            self.take_tunnel(tunnel);
            return Err(gone());
        }
        let answer = tokio::time::timeout(OPEN_PORT_WITHIN, rx).await;
        self.take_tunnel(tunnel);
        match answer {
            Ok(Ok(Ok(connection))) => Ok(connection),
            Ok(Ok(Err(refused))) => Err(PortError::Refused(refused)),
            Ok(Err(_)) => Err(gone()),
            Err(_) => Err(PortError::NoAnswer(format!("the run did not answer within {OPEN_PORT_WITHIN:?}"))),
        }
    }

    /// The request waiting for tunnel `tunnel`, once: an answer for a tunnel nobody waits for
    /// (answered already, given up on) finds none.
    pub fn take_tunnel(&self, tunnel: u64) -> Option<Tunnel> {
        self.tunnels.lock().unwrap_or_else(PoisonError::into_inner).remove(&tunnel)
    }

    /// Whether the connection is gone (its session may not have noticed yet).
    pub fn closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// The reader of `subscription` consumed `bytes` more.
    pub async fn grant(&self, subscription: u64, bytes: u64) {
        self.send(ToSupervisor::MoreOutput(pb::MoreOutput { subscription, credit: bytes })).await;
    }

    /// A reader gave up: the supervisor stops sending. Never waits (the session's loop calls
    /// it): were the connection full, the supervisor stops anyway once the reader's credit runs
    /// out.
    pub fn stop_reading(&self, subscription: u64) {
        let known = self.readers.lock().unwrap_or_else(PoisonError::into_inner).remove(&subscription).is_some();
        if known {
            let stop = ToSupervisor::StopReading(pb::StopReading { subscription });
            let _ = self.tx.try_send(Ok(pb::GatewayMessage { message: Some(stop) }));
        }
    }

    /// Passes output from the supervisor to its reader. Never waits: the session's one loop
    /// also carries heartbeats, and the credit a reader grants bounds what it is sent.
    pub fn deliver(&self, subscription: u64, event: OutputEvent) {
        let end = matches!(event, OutputEvent::End { .. });
        let reader = {
            let mut readers = self.readers.lock().unwrap_or_else(PoisonError::into_inner);
            if end { readers.remove(&subscription) } else { readers.get(&subscription).cloned() }
        };
        if let Some(reader) = reader
            && reader.send(event).is_err()
        {
            self.stop_reading(subscription);
        }
    }
}

#[derive(Clone, Default)]
pub struct Sessions {
    current: Arc<Mutex<BTreeMap<SandboxId, Arc<Session>>>>,
    /// Told whenever a session opens or closes.
    changed: Arc<watch::Sender<()>>,
    connections: Arc<AtomicU64>,
}

impl Sessions {
    fn current(&self) -> std::sync::MutexGuard<'_, BTreeMap<SandboxId, Arc<Session>>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes a new connection of `sandbox`'s run `generation` the current one.
    pub fn open(
        &self,
        sandbox: SandboxId,
        generation: u64,
        tx: mpsc::Sender<Result<pb::GatewayMessage, Status>>,
    ) -> Arc<Session> {
        let session = Arc::new(Session {
            sandbox: sandbox.clone(),
            generation,
            connection: self.connections.fetch_add(1, Ordering::Relaxed),
            tx,
            readers: Mutex::default(),
            next_subscription: AtomicU64::new(0),
            tunnels: Mutex::default(),
            next_tunnel: AtomicU64::new(0),
        });
        self.current().insert(sandbox, session.clone());
        self.changed.send_replace(());
        session
    }

    /// The session ended: forgotten, unless a newer one took its place. Its readers' streams
    /// close, so they read on through the next session.
    pub fn close(&self, session: &Session) {
        session.readers.lock().unwrap_or_else(PoisonError::into_inner).clear();
        let mut current = self.current();
        if current.get(&session.sandbox).is_some_and(|s| s.connection == session.connection) {
            current.remove(&session.sandbox);
        }
        drop(current);
        self.changed.send_replace(());
    }

    /// The current session of `sandbox`'s run `generation`, if this gateway holds it.
    pub fn get(&self, sandbox: &SandboxId, generation: u64) -> Option<Arc<Session>> {
        self.current().get(sandbox).filter(|s| s.generation == generation || berth_core::bug!(ExecNotFenced)).cloned()
    }

    pub fn changed(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }
}
