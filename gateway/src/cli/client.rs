//! The client layer the commands share: where the gateway is and the token it takes (flags,
//! `BERTH_*` variables, or its data directory), the connection, and what a stream does when its
//! gateway goes away.

use std::path::PathBuf;
use std::time::Duration;

use berth_proto::v1::execs_client::ExecsClient;
use berth_proto::v1::files_client::FilesClient;
use berth_proto::v1::gateway_client::GatewayClient;
use berth_proto::v1::logs_client::LogsClient;
use berth_proto::v1::nodes_client::NodesClient;
use berth_proto::v1::providers_client::ProvidersClient;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use berth_proto::v1::snapshots_client::SnapshotsClient;
use berth_proto::v1::templates_client::TemplatesClient;
use berth_proto::v1::volumes_client::VolumesClient;
use clap::Args;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use super::Output;
use crate::data_dir::{self, DEFAULT_NAME, DataDir, address_file};

/// The wait before the first attempt to connect again after a stream was lost.
const FIRST_WAIT: Duration = Duration::from_millis(200);
/// The longest wait between attempts: it doubles with each attempt that fails, up to this.
const LONGEST_WAIT: Duration = Duration::from_secs(5);
/// How often the CLI pings the gateway over its connection, and how long it waits for the
/// answer before it gives the connection (and the calls on it) up.
const PING_EVERY: Duration = Duration::from_secs(5);
const PING_WITHIN: Duration = Duration::from_secs(10);

/// Where the gateway is, and the token it takes.
#[derive(Args, Clone)]
pub(super) struct Connection {
    /// The gateway's address (a bare HOST:PORT is taken as http://HOST:PORT). [default: from
    /// <data-dir>/<name>.addr, else http://127.0.0.1:7420]
    #[arg(long, env = "BERTH_GATEWAY", global = true)]
    gateway: Option<String>,
    /// Which gateway of the data directory, by its --name. [default: "gateway", or the only one
    /// there]
    #[arg(long = "name", env = "BERTH_GATEWAY_NAME", global = true)]
    gateway_name: Option<String>,
    /// The API token. [default: from <data-dir>/api-token]
    #[arg(long, env = "BERTH_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// The gateway's data directory, to find its address and token.
    #[arg(long, env = "BERTH_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// PEM CA certificates to check an https:// gateway's certificate against. [default: the
    /// system's roots]
    #[arg(long, env = "BERTH_CA_FILE", global = true)]
    ca_file: Option<PathBuf>,
}

pub(super) type Authed = InterceptedService<Channel, Bearer>;

#[derive(Clone)]
pub(super) struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request.metadata_mut().insert("authorization", self.0.clone());
        Ok(request)
    }
}

/// A connected gateway: a client per service, all on one connection.
pub(super) struct Client {
    /// How it connected, to connect again.
    connection: Connection,
    pub(super) sandboxes: SandboxesClient<Authed>,
    pub(super) providers: ProvidersClient<Authed>,
    pub(super) execs: ExecsClient<Authed>,
    pub(super) logs: LogsClient<Authed>,
    pub(super) files: FilesClient<Authed>,
    pub(super) templates: TemplatesClient<Authed>,
    pub(super) snapshots: SnapshotsClient<Authed>,
    pub(super) volumes: VolumesClient<Authed>,
    pub(super) nodes: NodesClient<Authed>,
    pub(super) gateway: GatewayClient<Authed>,
    pub(super) output: Output,
    /// The API token it presents, for what hands it on (`berth e2b env`).
    pub(super) token: String,
}

/// A failure, printed as `error: ...`.
pub(super) struct Failed(pub(super) String);

impl From<Status> for Failed {
    /// The code and message, and for a status the transport made (the gateway unreached, or
    /// gone silent) what broke under it: "keep-alive timed out" says more than "http2 error".
    fn from(s: Status) -> Self {
        Failed(with_causes_after(format!("{:?}: {}", s.code(), s.message()), std::error::Error::source(&s)))
    }
}

/// Why a stream the CLI follows stopped before its end: the gateway's status (which may mean
/// that it went away, see [`Reconnect`]), or the CLI's own failure.
pub(super) enum Broke {
    Status(Status),
    Failed(Failed),
}

impl From<Status> for Broke {
    fn from(s: Status) -> Self {
        Broke::Status(s)
    }
}

impl From<Failed> for Broke {
    fn from(f: Failed) -> Self {
        Broke::Failed(f)
    }
}

impl From<Broke> for Failed {
    fn from(b: Broke) -> Self {
        match b {
            Broke::Status(s) => s.into(),
            Broke::Failed(f) => f,
        }
    }
}

/// Whether a stream ended with `code` because the gateway went away (a restart, a graceful
/// shutdown's UNAVAILABLE, a lost connection), so that it is worth connecting again.
fn lost(code: tonic::Code) -> bool {
    matches!(code, tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Aborted)
}

/// What every stream the CLI follows does when its gateway goes away: it connects again, to
/// the gateway's address file's address (a restarted gateway may listen elsewhere), however
/// long the gateway takes to come back, and the caller opens the stream again from where it got
/// to. The waits between attempts double up to [`LONGEST_WAIT`], and start over once a stream
/// got somewhere, so a gateway that takes the connection and then fails every stream at once
/// is not hammered.
pub(super) struct Reconnect {
    wait: Duration,
}

impl Reconnect {
    pub(super) fn new() -> Self {
        Self { wait: FIRST_WAIT }
    }

    /// The stream got somewhere since it was opened.
    pub(super) fn progressed(&mut self) {
        self.wait = FIRST_WAIT;
    }

    /// After `ended` broke a stream of `client`'s off: the failure, unless the gateway went
    /// away; then says so, connects `client` again, and says how it goes on (`resume`).
    pub(super) async fn after(&mut self, client: &mut Client, ended: Broke, resume: &str) -> Result<(), Failed> {
        let ended = match ended {
            Broke::Status(s) if lost(s.code()) => s,
            other => return Err(other.into()),
        };
        eprintln!("berth: lost the gateway ({}); reconnecting", ended.message());
        loop {
            tokio::time::sleep(self.wait).await;
            self.wait = (self.wait * 2).min(LONGEST_WAIT);
            if let Ok(connected) = connect(&client.connection, client.output).await {
                *client = connected;
                break;
            }
        }
        eprintln!("berth: reconnected; {resume}");
        Ok(())
    }
}

/// Where the gateway is, and where that was learnt: the flag (a bare `HOST:PORT` taken as
/// plain HTTP), the address file of the gateway named, of the one gateway of the data
/// directory, or the default.
fn gateway_address(cli: &Connection, data: &DataDir) -> Result<(String, String), Failed> {
    if let Some(address) = &cli.gateway {
        let address = if address.contains("://") { address.clone() } else { format!("http://{address}") };
        return Ok((address, "--gateway".to_string()));
    }
    let from_file =
        |name: &str| data.read_address(name).map(|address| (address, data.address_path(name).display().to_string()));
    if let Some(name) = &cli.gateway_name {
        return from_file(name).ok_or_else(|| {
            Failed(format!(
                "no gateway named {name:?} has run from {} (no {})",
                data.path().display(),
                address_file(name)
            ))
        });
    }
    if let Some(found) = from_file(DEFAULT_NAME) {
        return Ok(found);
    }
    match data.addressed_gateways().as_slice() {
        [] => Ok(("http://127.0.0.1:7420".to_string(), "the default".to_string())),
        [one] => from_file(one).ok_or_else(|| Failed(format!("{} is empty", data.address_path(one).display()))),
        several => Err(Failed(format!(
            "several gateways have run from {}: {}; pick one with --name (or --gateway)",
            data.path().display(),
            several.join(", ")
        ))),
    }
}

/// An error and every cause under it: a transport error says why ("connection refused").
fn with_causes(e: &dyn std::error::Error) -> String {
    with_causes_after(e.to_string(), e.source())
}

/// `message`, then `cause` and every cause under it, each unless the text already says it.
fn with_causes_after(mut message: String, mut cause: Option<&(dyn std::error::Error + 'static)>) -> String {
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        cause = c.source();
    }
    message
}

/// A client of the gateway `cli` names, connected.
pub(super) async fn connect(cli: &Connection, output: Output) -> Result<Client, Failed> {
    let data = DataDir::at(cli.data_dir.clone().unwrap_or_else(data_dir::default_path));
    let (address, source) = gateway_address(cli, &data)?;
    let token = cli.token.clone().or_else(|| data.read_api_token()).ok_or_else(|| {
        Failed(format!(
            "no API token: pass --token, set BERTH_TOKEN, or point --data-dir at the gateway's ({})",
            data.path().display()
        ))
    })?;
    let bearer = MetadataValue::try_from(format!("Bearer {token}"))
        .map_err(|_| Failed("the token is not valid ASCII".into()))?;
    let endpoint = Endpoint::from_shared(address.clone())
        .map_err(|e| Failed(format!("{address:?} (from {source}) is not a gateway address: {e}")))?;
    let endpoint = crate::tls::endpoint(endpoint, &address, cli.ca_file.as_deref()).map_err(Failed)?;
    // Wide: `port-forward` and file transfers are bulk streams. No deadline on a call (an upload
    // or a followed log may rightly take hours): HTTP/2 pings tell a live gateway from one that
    // took the connection and never answers, which fails the call within PING_EVERY + PING_WITHIN.
    let endpoint = berth_proto::carry::wide(endpoint)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(PING_EVERY)
        .keep_alive_timeout(PING_WITHIN)
        .keep_alive_while_idle(true);
    let channel = endpoint.connect().await.map_err(|e| {
        Failed(format!("cannot reach the gateway at {address} (from {source}): {}; is it running?", with_causes(&e)))
    })?;
    let auth = Bearer(bearer);
    Ok(Client {
        connection: cli.clone(),
        sandboxes: SandboxesClient::with_interceptor(channel.clone(), auth.clone()),
        providers: ProvidersClient::with_interceptor(channel.clone(), auth.clone()),
        execs: ExecsClient::with_interceptor(channel.clone(), auth.clone()),
        logs: LogsClient::with_interceptor(channel.clone(), auth.clone()),
        files: FilesClient::with_interceptor(channel.clone(), auth.clone()),
        templates: TemplatesClient::with_interceptor(channel.clone(), auth.clone()),
        snapshots: SnapshotsClient::with_interceptor(channel.clone(), auth.clone()),
        volumes: VolumesClient::with_interceptor(channel.clone(), auth.clone()),
        nodes: NodesClient::with_interceptor(channel.clone(), auth.clone()),
        gateway: GatewayClient::with_interceptor(channel, auth),
        output,
        token,
    })
}
