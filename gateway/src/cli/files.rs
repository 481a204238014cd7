//! `berth sandbox cp`: files into and out of a sandbox's workspace, as tar streams.

use berth_proto::v1 as pb;

use super::client::{Client, Failed};

/// `NAME:PATH` as a sandbox and a path in it; a local path otherwise.
fn sandbox_path(arg: &str) -> Option<(&str, &str)> {
    let (name, path) = arg.split_once(':')?;
    let named = !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    named.then_some((name, path))
}

/// `src` packed as a tar stream (links as links), in a file.
fn pack_local(src: &std::path::Path) -> Result<std::fs::File, Failed> {
    use std::io::Seek as _;
    let failed = |e: std::io::Error| Failed(format!("cannot pack {}: {e}", src.display()));
    let name = src.file_name().ok_or_else(|| Failed(format!("{} names no file", src.display())))?;
    let mut spool = tempfile::tempfile().map_err(failed)?;
    {
        let mut builder = tar::Builder::new(&mut spool);
        builder.follow_symlinks(false);
        if std::fs::symlink_metadata(src).map_err(failed)?.is_dir() {
            builder.append_dir_all(name, src).map_err(failed)?;
        } else {
            builder.append_path_with_name(src, name).map_err(failed)?;
        }
        builder.finish().map_err(failed)?;
    }
    spool.seek(std::io::SeekFrom::Start(0)).map_err(failed)?;
    Ok(spool)
}

impl Client {
    pub(super) async fn cp(&mut self, src: &str, dst: &str) -> Result<u8, Failed> {
        match (sandbox_path(src), sandbox_path(dst)) {
            (None, Some((sandbox, path))) => self.upload(std::path::Path::new(src), sandbox, path).await,
            (Some((sandbox, path)), None) => self.download(sandbox, path, std::path::Path::new(dst)).await,
            _ => Err(Failed("one side of cp is NAME:PATH in a sandbox, the other a local path".into())),
        }
    }

    async fn upload(&mut self, src: &std::path::Path, sandbox: &str, path: &str) -> Result<u8, Failed> {
        use std::io::Read as _;
        let mut spool = pack_local(src)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let start = pb::UploadStart { sandbox: sandbox.to_string(), path: path.to_string() };
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
        say!("copied {} entries ({bytes} bytes) into {sandbox}:{path}", files.len());
        Ok(0)
    }

    async fn download(&mut self, sandbox: &str, path: &str, dst: &std::path::Path) -> Result<u8, Failed> {
        use sha2::Digest as _;
        use std::io::{Seek as _, Write as _};
        let request = pb::DownloadRequest { sandbox: sandbox.to_string(), path: path.to_string() };
        let mut stream = self.files.download(request).await?.into_inner();
        let failed = |e: std::io::Error| Failed(format!("cannot unpack into {}: {e}", dst.display()));
        let mut spool = tempfile::tempfile().map_err(failed)?;
        let mut hasher = sha2::Sha256::new();
        let end = loop {
            match stream.message().await?.and_then(|m| m.output) {
                Some(pb::download_output::Output::Data(data)) => {
                    hasher.update(&data);
                    spool.write_all(&data).map_err(failed)?;
                }
                Some(pb::download_output::Output::End(end)) => break end,
                None => return Err(Failed("the gateway closed the download before its end".into())),
            }
        };
        let got = hex::encode(hasher.finalize());
        if got != end.sha256 {
            return Err(Failed(format!("the download arrived damaged: SHA-256 {got}, sent {}", end.sha256)));
        }
        spool.seek(std::io::SeekFrom::Start(0)).map_err(failed)?;
        std::fs::create_dir_all(dst).map_err(failed)?;
        tar::Archive::new(spool).unpack(dst).map_err(failed)?;
        say!("copied {} entries ({} bytes of tar) from {sandbox}:{path}", end.files.len(), end.bytes);
        Ok(0)
    }
}
