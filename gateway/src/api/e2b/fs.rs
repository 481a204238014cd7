//! E2B's in-sandbox filesystem (envd's `filesystem.Filesystem` and its `/files` HTTP API) over
//! the sandbox's workspace (DESIGN 8.3): the same workspace Berth's files API reaches, each path
//! resolved beneath it, links never followed, a file written whole or not at all.
//!
//! Paths are the workspace's: relative to it, or absolute under `/workspace` (where a container
//! mounts it; the same on every driver). Any other absolute path (E2B's `/home/user`) is
//! refused naming it: outside the workspace, a sandbox's files are its own.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Query, Request as HttpRequest, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_drivers::files::entries::{self, Entry};
use berth_drivers::files::{FilesError, Kind, workspace_path};
use futures_util::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};

use super::E2b;
use super::envd::{ConnectError, connect_error, sandbox, unary, unary_message};

/// The deepest listing asked for at once.
const MAX_DEPTH: usize = 32;

/// A workspace and a path in it, as the call named them.
struct Place {
    workspace: PathBuf,
    path: PathBuf,
}

/// Why a call reaches no file: the sandbox refused it (as the in-sandbox API says), or the
/// path did.
enum Refused {
    Sandbox(ConnectError),
    Files(FilesError),
}

impl From<FilesError> for Refused {
    fn from(e: FilesError) -> Self {
        Refused::Files(e)
    }
}

async fn place(e2b: &E2b, headers: &HeaderMap, field: &str, path: &str) -> Result<Place, Refused> {
    let sandbox = sandbox(e2b, headers).await.map_err(Refused::Sandbox)?;
    let path = workspace_path(field, path)?;
    let files = crate::engine::files::Files::new(e2b.engine.clone());
    let workspace =
        files.workspace(&sandbox.name).await.map_err(|e| Refused::Sandbox(ConnectError::from_status(&e.into())))?;
    Ok(Place { workspace, path })
}

/// The sandbox and the path, for an RPC; every refusal as Connect says it.
async fn rpc_place(e2b: &E2b, headers: &HeaderMap, field: &str, path: &str) -> Result<Place, ConnectError> {
    place(e2b, headers, field, path).await.map_err(|refused| match refused {
        Refused::Sandbox(e) => e,
        Refused::Files(e) => rpc_error(e),
    })
}

fn rpc_error(e: FilesError) -> ConnectError {
    let code = match e {
        FilesError::Invalid { .. } => "invalid_argument",
        FilesError::NotFound(_) => "not_found",
        FilesError::TooLarge(_) => "resource_exhausted",
        FilesError::Io(_) => "internal",
    };
    connect_error(code, e.to_string())
}

/// Runs a filesystem call off the async threads.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, FilesError> + Send + 'static,
) -> Result<T, FilesError> {
    tokio::task::spawn_blocking(call).await.map_err(|e| FilesError::Io(e.to_string()))?
}

fn shown(path: &Path) -> String {
    Path::new(berth_drivers::files::WORKSPACE).join(path).display().to_string()
}

fn permissions(kind: Kind, mode: u32) -> String {
    let mut text = String::from(match kind {
        Kind::Directory => "d",
        Kind::Symlink => "l",
        Kind::File => "-",
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

/// An `EntryInfo`, in the Connect JSON codec's names.
fn entry_info(entry: &Entry) -> Value {
    let modified = std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::try_from(entry.modified).unwrap_or(0));
    let mut info = json!({
        "name": entry.path.file_name().map_or_else(|| "workspace".into(), |n| n.to_string_lossy().into_owned()),
        "type": match entry.kind {
            Kind::File => "FILE_TYPE_FILE",
            Kind::Directory => "FILE_TYPE_DIRECTORY",
            Kind::Symlink => "FILE_TYPE_SYMLINK",
        },
        "path": shown(&entry.path),
        "size": entry.size.to_string(),
        "mode": entry.mode,
        "permissions": permissions(entry.kind, entry.mode),
        "modifiedTime": humantime::format_rfc3339_seconds(modified).to_string(),
        "isSymlink": entry.kind == Kind::Symlink,
    });
    if let Some(target) = &entry.link {
        info["symlinkTarget"] = json!(target.display().to_string());
    }
    info
}

fn field(message: &Value, name: &str) -> String {
    message[name].as_str().unwrap_or_default().to_string()
}

/// The unary calls of `filesystem.Filesystem`: Stat, ListDir, MakeDir, Move, Remove.
pub(super) async fn call(
    State(e2b): State<Arc<E2b>>,
    axum::extract::Path(method): axum::extract::Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let answered = async {
        let message = unary_message(&bytes)?;
        let reply = match method.as_str() {
            "Stat" => {
                let Place { workspace, path } = rpc_place(&e2b, &headers, "path", &field(&message, "path")).await?;
                let entry = blocking(move || entries::stat(&workspace, &path)).await.map_err(rpc_error)?;
                json!({"entry": entry_info(&entry)})
            }
            "ListDir" => {
                let depth = message["depth"]
                    .as_u64()
                    .map_or(1, |d| usize::try_from(d).unwrap_or(MAX_DEPTH))
                    .clamp(1, MAX_DEPTH);
                let Place { workspace, path } = rpc_place(&e2b, &headers, "path", &field(&message, "path")).await?;
                let max = e2b.engine.settings().files.max_entries;
                let listed = blocking(move || entries::list(&workspace, &path, depth, max)).await.map_err(rpc_error)?;
                json!({"entries": listed.iter().map(entry_info).collect::<Vec<_>>()})
            }
            "MakeDir" => {
                let Place { workspace, path } = rpc_place(&e2b, &headers, "path", &field(&message, "path")).await?;
                let made = blocking(move || {
                    let made = entries::make_dir(&workspace, &path)?;
                    Ok((made, entries::stat(&workspace, &path)?))
                })
                .await
                .map_err(rpc_error)?;
                match made {
                    (true, entry) => json!({"entry": entry_info(&entry)}),
                    (false, _) => return Err(connect_error("already_exists", "the directory exists already")),
                }
            }
            "Move" => {
                let Place { workspace, path: from } =
                    rpc_place(&e2b, &headers, "source", &field(&message, "source")).await?;
                let to = workspace_path("destination", &field(&message, "destination")).map_err(rpc_error)?;
                let entry = blocking(move || entries::rename(&workspace, &from, &to)).await.map_err(rpc_error)?;
                json!({"entry": entry_info(&entry)})
            }
            "Remove" => {
                let Place { workspace, path } = rpc_place(&e2b, &headers, "path", &field(&message, "path")).await?;
                blocking(move || entries::remove(&workspace, &path)).await.map_err(rpc_error)?;
                json!({})
            }
            other => {
                return Err(connect_error(
                    "unimplemented",
                    format!("Berth does not serve filesystem.Filesystem/{other} (watching a directory, among others)"),
                ));
            }
        };
        Ok::<_, ConnectError>(unary(reply))
    };
    answered.await.unwrap_or_else(IntoResponse::into_response)
}

/// An error of `/files`, as envd's HTTP API answers it: the status and `{"message"}`. A sandbox
/// that does not run is 502, which the SDKs take for one that is not running.
fn files_error(refused: Refused) -> Response {
    let (status, message) = match refused {
        Refused::Files(e) => (
            match e {
                FilesError::Invalid { .. } => StatusCode::BAD_REQUEST,
                FilesError::NotFound(_) => StatusCode::NOT_FOUND,
                FilesError::TooLarge(_) => StatusCode::INSUFFICIENT_STORAGE,
                FilesError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
            },
            e.to_string(),
        ),
        Refused::Sandbox(e) => match e.code {
            "unauthenticated" => (StatusCode::UNAUTHORIZED, e.message),
            "invalid_argument" => (StatusCode::BAD_REQUEST, e.message),
            _ => (StatusCode::BAD_GATEWAY, e.message),
        },
    };
    (status, axum::Json(json!({"message": message}))).into_response()
}

#[derive(Deserialize)]
pub(super) struct FilesQuery {
    path: Option<String>,
    /// Whose the call is: as for a command, only the sandbox's own user.
    username: Option<String>,
}

impl FilesQuery {
    fn check_user(&self) -> Result<(), FilesError> {
        match self.username.as_deref() {
            None | Some("" | "user") => Ok(()),
            Some(other) => Err(FilesError::Invalid {
                field: "username".into(),
                reason: format!("Berth reaches files as the sandbox's own user: user {other:?} is not supported"),
            }),
        }
    }
}

/// `GET /files?path=`: the file's content.
pub(super) async fn download(State(e2b): State<Arc<E2b>>, headers: HeaderMap, Query(q): Query<FilesQuery>) -> Response {
    let read = async {
        q.check_user()?;
        let Place { workspace, path } = place(&e2b, &headers, "path", q.path.as_deref().unwrap_or_default()).await?;
        let max = e2b.engine.settings().files.max_bytes;
        Ok::<_, Refused>(blocking(move || entries::read(&workspace, &path, max)).await?)
    };
    match read.await {
        Ok(content) => ([(header::CONTENT_TYPE, "application/octet-stream")], content).into_response(),
        Err(e) => files_error(e),
    }
}

/// `POST /files?path=`: a file's content as the body (`application/octet-stream`), or files as
/// multipart parts named `file` (each part's file name its path when the query names none).
/// What was written, as envd answers it.
pub(super) async fn upload(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Query(q): Query<FilesQuery>,
    request: HttpRequest,
) -> Response {
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("multipart/form-data"));
    let written = if let Err(e) = q.check_user() {
        Err(e.into())
    } else if multipart {
        write_parts(&e2b, &headers, q.path, request).await
    } else {
        let path = q.path.unwrap_or_default();
        let body = request.into_body();
        write_one(&e2b, &headers, &path, body).await.map(|entry| vec![entry])
    };
    match written {
        Ok(entries) => axum::Json(
            entries
                .iter()
                .map(|e| {
                    let kind = if e.kind == Kind::Directory { "dir" } else { "file" };
                    let name = e.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    json!({"name": name, "type": kind, "path": shown(&e.path)})
                })
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => files_error(e),
    }
}

async fn write_one(e2b: &E2b, headers: &HeaderMap, path: &str, body: Body) -> Result<Entry, Refused> {
    if headers.get(header::CONTENT_ENCODING).is_some_and(|v| v != "identity") {
        return Err(Refused::Files(FilesError::Invalid {
            field: "Content-Encoding".into(),
            reason: "Berth takes an upload uncompressed (no gzip=True)".into(),
        }));
    }
    let place = place(e2b, headers, "path", path).await?;
    let spooled = spool(body.into_data_stream(), e2b.engine.settings().files.max_bytes).await?;
    Ok(write_spooled(place, spooled).await?)
}

/// An upload's bytes, in a file aside: the write itself blocks, and the body does not.
async fn spool<E: std::fmt::Display>(
    chunks: impl Stream<Item = Result<Bytes, E>>,
    max: u64,
) -> Result<std::fs::File, FilesError> {
    use tokio::io::AsyncWriteExt;
    let io = |e: std::io::Error| FilesError::Io(format!("keeping the upload: {e}"));
    let mut file = tokio::fs::File::from_std(tempfile::tempfile().map_err(io)?);
    let mut chunks = std::pin::pin!(chunks);
    let mut total = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| FilesError::Io(format!("reading the upload: {e}")))?;
        total += chunk.len() as u64;
        if total > max {
            return Err(FilesError::TooLarge(format!("the upload is larger than {max} bytes")));
        }
        file.write_all(&chunk).await.map_err(io)?;
    }
    file.flush().await.map_err(io)?;
    Ok(file.into_std().await)
}

async fn write_spooled(place: Place, mut spooled: std::fs::File) -> Result<Entry, FilesError> {
    let Place { workspace, path } = place;
    blocking(move || {
        use std::io::Seek;
        spooled.seek(std::io::SeekFrom::Start(0)).map_err(|e| FilesError::Io(e.to_string()))?;
        entries::write(&workspace, &path, &mut spooled)
    })
    .await
}

async fn write_parts(
    e2b: &E2b,
    headers: &HeaderMap,
    path: Option<String>,
    request: HttpRequest,
) -> Result<Vec<Entry>, Refused> {
    let invalid = |reason: String| Refused::Files(FilesError::Invalid { field: "multipart".into(), reason });
    let mut parts = Multipart::from_request(request, &()).await.map_err(|e| invalid(e.body_text()))?;
    let mut written = Vec::new();
    while let Some(part) = parts.next_field().await.map_err(|e| invalid(e.body_text()))? {
        if part.name() != Some("file") {
            continue;
        }
        let target = match (&path, part.file_name()) {
            (Some(path), _) => path.clone(),
            (None, Some(name)) => name.to_string(),
            (None, None) => return Err(invalid("a part names no file".into())),
        };
        let place = place(e2b, headers, "file", &target).await?;
        let spooled = spool(part, e2b.engine.settings().files.max_bytes).await?;
        written.push(write_spooled(place, spooled).await?);
    }
    if written.is_empty() {
        return Err(invalid("no part named `file`".into()));
    }
    Ok(written)
}
