//! `berth sandbox cp`: files into and out of a sandbox's workspace, as tar streams, by
//! `docker cp`'s rules: a file lands as the destination (over a file, or where nothing was) or
//! in it (a directory); a directory lands in an existing directory under its own name, or as a
//! new one; `SRC/.` copies a directory's contents; `-` is a tar stream on stdin or stdout.

use std::fs::File;
use std::io::{Read as _, Seek as _, Write as _};
use std::path::Path;

use berth_proto::v1 as pb;

use super::client::{Client, Failed};

/// `NAME:PATH` as a sandbox and a path in it; a local path otherwise.
fn sandbox_path(arg: &str) -> Option<(&str, &str)> {
    let (name, path) = arg.split_once(':')?;
    let named = !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    named.then_some((name, path))
}

/// What is at a copy's destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Found {
    Missing,
    File,
    Directory,
}

/// Where a copy's source lands, by docker cp's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Landing {
    /// In the directory DST, under the source's own name.
    Into,
    /// As DST itself: a file over a file or where nothing was, a directory where nothing was.
    As,
    /// The source directory's contents in the directory DST (`SRC/.`).
    ContentsInto,
}

/// Where a source (a directory or not; `contents`: named as `DIR/.`) lands at `dst`, where
/// `found` is; or why it cannot.
fn landing(source_dir: bool, contents: bool, dst: &str, found: Found) -> Result<Landing, String> {
    let wants_dir = dst.ends_with('/');
    match (source_dir, found) {
        (true, Found::Directory) if contents => Ok(Landing::ContentsInto),
        (_, Found::Directory) => Ok(Landing::Into),
        (false, Found::Missing) if wants_dir => Err(format!("{dst}: no such directory")),
        (false, Found::File) if wants_dir => Err(format!("{dst}: not a directory")),
        (false, _) => Ok(Landing::As),
        (true, Found::File) => Err(format!("cannot copy a directory onto the file {dst}")),
        // Made, as a copy of the source (or of its contents, which is the same thing).
        (true, Found::Missing) => Ok(Landing::As),
    }
}

/// `path` as the tar entry naming it: without trailing slashes and `/.`.
fn trimmed(path: &str) -> &str {
    let mut path = path;
    loop {
        let shorter = path.strip_suffix("/.").or_else(|| path.strip_suffix('/').filter(|p| !p.is_empty()));
        match shorter {
            Some(p) => path = p,
            None => return path,
        }
    }
}

/// Whether `path` names the workspace itself, whose download holds its contents under no
/// entry of its own.
fn is_workspace(path: &str) -> bool {
    matches!(trimmed(path), "" | "." | "/workspace")
}

/// The last component of `path` and the directory it is in ("" for the workspace's own).
fn split(path: &str) -> (&str, &str) {
    let path = trimmed(path);
    match path.rsplit_once('/') {
        Some(("", name)) => ("/", name),
        Some((parent, name)) => (parent, name),
        None => ("", path),
    }
}

fn spool_failed(e: std::io::Error) -> Failed {
    Failed(format!("cannot spool the copy: {e}"))
}

/// `src` packed as a tar stream (links as links), in a file: under the name `name`, or with
/// `name` `None` its contents (a directory's entries) at the top.
fn pack_local(src: &Path, name: Option<&str>) -> Result<File, Failed> {
    let failed = |e: std::io::Error| Failed(format!("cannot pack {}: {e}", src.display()));
    let mut spool = tempfile::tempfile().map_err(failed)?;
    {
        let mut builder = tar::Builder::new(&mut spool);
        builder.follow_symlinks(false);
        let mut add = |path: &Path, name: &Path| {
            if std::fs::symlink_metadata(path)?.is_dir() {
                builder.append_dir_all(name, path)
            } else {
                builder.append_path_with_name(path, name)
            }
        };
        match name {
            Some(name) => add(src, Path::new(name)).map_err(failed)?,
            None => {
                let mut children: Vec<_> =
                    std::fs::read_dir(src).map_err(failed)?.collect::<Result<_, _>>().map_err(failed)?;
                children.sort_by_key(std::fs::DirEntry::file_name);
                for child in children {
                    add(&child.path(), Path::new(&child.file_name())).map_err(failed)?;
                }
            }
        }
        builder.finish().map_err(failed)?;
    }
    spool.seek(std::io::SeekFrom::Start(0)).map_err(failed)?;
    Ok(spool)
}

/// `archive` again with its top entry `top` (and everything under it) put as `to`; `top`
/// `None`: the archive holds contents with no top entry; `to` `None`: the contents alone.
fn relabel(archive: &mut File, top: Option<&str>, to: Option<&str>) -> Result<File, Failed> {
    let failed = |e: std::io::Error| Failed(format!("cannot unpack the copy: {e}"));
    archive.seek(std::io::SeekFrom::Start(0)).map_err(failed)?;
    let mut out = tempfile::tempfile().map_err(failed)?;
    {
        let mut builder = tar::Builder::new(&mut out);
        if let (None, Some(to)) = (top, to) {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            builder.append_data(&mut header, to, std::io::empty()).map_err(failed)?;
        }
        for entry in tar::Archive::new(&mut *archive).entries().map_err(failed)? {
            let mut entry = entry.map_err(failed)?;
            let path = entry.path().map_err(failed)?.to_string_lossy().into_owned();
            let rest = match top {
                Some(top) if path.trim_end_matches('/') == top => None,
                Some(top) => match path.strip_prefix(top).and_then(|r| r.strip_prefix('/')) {
                    Some(rest) => Some(rest.to_string()),
                    None => return Err(Failed(format!("the copy holds {path:?}, outside {top:?}"))),
                },
                None => Some(path),
            };
            let name = match (rest, to) {
                (None, Some(to)) => to.to_string(),
                (None, None) => continue,
                (Some(rest), Some(to)) => format!("{to}/{rest}"),
                (Some(rest), None) => rest,
            };
            let mut header = entry.header().clone();
            match entry.link_name().map_err(failed)? {
                Some(link) => builder.append_link(&mut header, &name, &link).map_err(failed)?,
                None => builder.append_data(&mut header, &name, &mut entry).map_err(failed)?,
            }
        }
        builder.finish().map_err(failed)?;
    }
    out.seek(std::io::SeekFrom::Start(0)).map_err(failed)?;
    Ok(out)
}

/// The top entry of a download: its name and whether it is a directory (`None`: the archive
/// is empty).
fn top_entry(archive: &mut File) -> Result<Option<(String, bool)>, Failed> {
    let failed = |e: std::io::Error| Failed(format!("cannot read the copy: {e}"));
    archive.seek(std::io::SeekFrom::Start(0)).map_err(failed)?;
    let top = {
        let mut reader = tar::Archive::new(&mut *archive);
        match reader.entries().map_err(failed)?.next().transpose().map_err(failed)? {
            Some(entry) => {
                let name = entry.path().map_err(failed)?.to_string_lossy().trim_end_matches('/').to_string();
                Some((name, entry.header().entry_type().is_dir()))
            }
            None => None,
        }
    };
    archive.seek(std::io::SeekFrom::Start(0)).map_err(failed)?;
    Ok(top)
}

impl Client {
    pub(super) async fn cp(&mut self, src: &str, dst: &str) -> Result<u8, Failed> {
        match (sandbox_path(src), sandbox_path(dst)) {
            (None, Some((sandbox, path))) => self.copy_in(src, sandbox, path).await,
            (Some((sandbox, path)), None) => self.copy_out(sandbox, path, dst).await,
            _ => Err(Failed("one side of cp is NAME:PATH in a sandbox, the other a local path or -".into())),
        }
    }

    /// What is at `path` in the sandbox: the first entry of its download, the rest not read.
    async fn found(&mut self, sandbox: &str, path: &str) -> Result<Found, Failed> {
        if is_workspace(path) {
            return Ok(Found::Directory);
        }
        let request = pb::DownloadRequest { sandbox: sandbox.to_string(), path: trimmed(path).to_string() };
        let mut stream = match self.files.download(request).await {
            Err(status) if status.code() == tonic::Code::NotFound => return Ok(Found::Missing),
            reply => reply?.into_inner(),
        };
        let mut head = Vec::new();
        while head.len() < 512 {
            match stream.message().await {
                Ok(Some(pb::DownloadOutput { output: Some(pb::download_output::Output::Data(data)) })) => {
                    head.extend_from_slice(&data)
                }
                Err(status) if status.code() == tonic::Code::NotFound => return Ok(Found::Missing),
                Err(status) => return Err(status.into()),
                Ok(_) => break,
            }
        }
        let header = head.get(..512).map(tar::Header::from_byte_slice);
        Ok(match header.map(tar::Header::entry_type) {
            Some(kind) if kind.is_dir() => Found::Directory,
            Some(_) => Found::File,
            None => Found::Missing,
        })
    }

    async fn copy_in(&mut self, src: &str, sandbox: &str, dst: &str) -> Result<u8, Failed> {
        let found = self.found(sandbox, dst).await?;
        let (directory, spool) = if src == "-" {
            if found != Found::Directory {
                return Err(Failed(format!(
                    "{sandbox}:{dst}: a tar stream from stdin goes into a directory that exists"
                )));
            }
            let mut spool = tempfile::tempfile().map_err(spool_failed)?;
            std::io::copy(&mut std::io::stdin().lock(), &mut spool).map_err(spool_failed)?;
            spool.seek(std::io::SeekFrom::Start(0)).map_err(spool_failed)?;
            (trimmed(dst), spool)
        } else {
            let path = Path::new(src);
            let metadata = std::fs::symlink_metadata(path).map_err(|e| Failed(format!("{src}: {e}")))?;
            let landing = landing(metadata.is_dir(), src.ends_with("/."), dst, found).map_err(Failed)?;
            let own = path.canonicalize().ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
            let own = own.ok_or_else(|| Failed(format!("{src} names no file")))?;
            match landing {
                Landing::Into => (trimmed(dst), pack_local(path, Some(&own))?),
                Landing::As => (split(dst).0, pack_local(path, Some(split(dst).1))?),
                Landing::ContentsInto => (trimmed(dst), pack_local(path, None)?),
            }
        };
        self.upload(spool, sandbox, directory).await
    }

    async fn upload(&mut self, mut spool: File, sandbox: &str, directory: &str) -> Result<u8, Failed> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let start = pb::UploadStart { sandbox: sandbox.to_string(), path: directory.to_string() };
        tx.send(pb::UploadInput { input: Some(pb::upload_input::Input::Start(start)) }).await.ok();
        let sending = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match spool.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let data = pb::UploadInput { input: Some(pb::upload_input::Input::Data(buf[..n].to_vec())) };
                        if tx.blocking_send(data).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let reply = self.files.upload(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
        sending.abort();
        let files = reply?.into_inner().files;
        let bytes: u64 = files.iter().map(|f| f.size).sum();
        let into = if directory.is_empty() { "the workspace" } else { directory };
        eprintln!("copied {} entries ({bytes} bytes) into {sandbox}:{into}", files.len());
        Ok(0)
    }

    async fn copy_out(&mut self, sandbox: &str, src: &str, dst: &str) -> Result<u8, Failed> {
        let (mut spool, end) = self.download(sandbox, trimmed(src)).await?;
        if dst == "-" {
            let mut out = std::io::stdout().lock();
            std::io::copy(&mut spool, &mut out).and_then(|_| out.flush()).map_err(spool_failed)?;
            return Ok(0);
        }
        // The workspace's download holds its contents under no entry of their own.
        let top = if is_workspace(src) { None } else { top_entry(&mut spool)? };
        let source_dir = top.as_ref().is_none_or(|(_, dir)| *dir);
        let contents = top.is_none() || src.ends_with("/.");
        let found = match std::fs::metadata(dst) {
            Ok(m) if m.is_dir() => Found::Directory,
            Ok(_) => Found::File,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Found::Missing,
            Err(e) => return Err(Failed(format!("{dst}: {e}"))),
        };
        let landing = landing(source_dir, contents, dst, found).map_err(Failed)?;
        let top = top.map(|(name, _)| name);
        let (base, archive) = match landing {
            Landing::Into => (trimmed(dst), relabel(&mut spool, top.as_deref(), top.as_deref())?),
            Landing::ContentsInto => (trimmed(dst), relabel(&mut spool, top.as_deref(), None)?),
            Landing::As => {
                let (parent, name) = split(dst);
                (parent, relabel(&mut spool, top.as_deref(), Some(name))?)
            }
        };
        let base = if base.is_empty() { "." } else { base };
        let failed = |e: std::io::Error| Failed(format!("cannot unpack into {base}: {e}"));
        if !Path::new(base).is_dir() {
            return Err(Failed(format!("{base}: no such directory")));
        }
        tar::Archive::new(archive).unpack(base).map_err(failed)?;
        eprintln!("copied {} entries ({} bytes of tar) from {sandbox}:{src}", end.files.len(), end.bytes);
        Ok(0)
    }

    /// The download of `path`, checked against the checksum the gateway sent, in a file.
    async fn download(&mut self, sandbox: &str, path: &str) -> Result<(File, pb::DownloadEnd), Failed> {
        use sha2::Digest as _;
        let request = pb::DownloadRequest { sandbox: sandbox.to_string(), path: path.to_string() };
        let mut stream = self.files.download(request).await?.into_inner();
        let mut spool = tempfile::tempfile().map_err(spool_failed)?;
        let mut hasher = sha2::Sha256::new();
        let end = loop {
            match stream.message().await?.and_then(|m| m.output) {
                Some(pb::download_output::Output::Data(data)) => {
                    hasher.update(&data);
                    spool.write_all(&data).map_err(spool_failed)?;
                }
                Some(pb::download_output::Output::End(end)) => break end,
                None => return Err(Failed("the gateway closed the download before its end".into())),
            }
        };
        let got = hex::encode(hasher.finalize());
        if got != end.sha256 {
            return Err(Failed(format!("the download arrived damaged: SHA-256 {got}, sent {}", end.sha256)));
        }
        spool.seek(std::io::SeekFrom::Start(0)).map_err(spool_failed)?;
        Ok((spool, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_lands_where_docker_cp_puts_it() {
        use Found::*;
        use Landing::*;
        // A file: into a directory, as the destination otherwise, never into a directory that
        // is not there.
        assert_eq!(landing(false, false, "d", Directory), Ok(Into));
        assert_eq!(landing(false, false, "new", Missing), Ok(As));
        assert_eq!(landing(false, false, "old", File), Ok(As));
        assert!(landing(false, false, "new/", Missing).unwrap_err().contains("no such directory"));
        assert!(landing(false, false, "old/", File).unwrap_err().contains("not a directory"));
        // A directory: into an existing one under its name, its contents with `/.`, made anew
        // where nothing is, never onto a file.
        assert_eq!(landing(true, false, "d", Directory), Ok(Into));
        assert_eq!(landing(true, true, "d", Directory), Ok(ContentsInto));
        assert_eq!(landing(true, false, "new", Missing), Ok(As));
        assert_eq!(landing(true, true, "new", Missing), Ok(As));
        assert!(landing(true, false, "f", File).unwrap_err().contains("onto the file"));
    }

    #[test]
    fn paths_are_split_and_trimmed_as_tar_entries_name_them() {
        assert_eq!(trimmed("a/b/."), "a/b");
        assert_eq!(trimmed("a/b//"), "a/b");
        assert_eq!(trimmed("/"), "/");
        assert_eq!(split("a/b/c.txt"), ("a/b", "c.txt"));
        assert_eq!(split("c.txt"), ("", "c.txt"));
        assert_eq!(split("/workspace/x/"), ("/workspace", "x"));
        assert_eq!(split("/x"), ("/", "x"));
        assert!(is_workspace(".") && is_workspace("/workspace/") && is_workspace("") && !is_workspace("w"));
    }
}
