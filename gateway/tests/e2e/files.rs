//! Files on every driver (DESIGN 8.3): a tree with modes and links uploaded into a running
//! sandbox, seen by its command, downloaded with the same checksums, and the same while it is
//! Stopped; every escape refused with nothing written outside the workspace. Then bad input.

use berth_proto::v1 as pb;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::conformance::{Runtime, Target, clean_up, create_in, target};
use crate::exec::{run, start};
use crate::harness::*;

/// Small pieces, as a client streams a large archive.
const PIECE: usize = 700;

pub(crate) type FilesService = berth_proto::v1::files_client::FilesClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

pub(crate) async fn files(gateway: &Gateway) -> FilesService {
    berth_proto::v1::files_client::FilesClient::with_interceptor(gateway.channel().await, Bearer(gateway.token.clone()))
}

fn file(builder: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    builder.append_data(&mut header, path, data).unwrap();
}

fn link(builder: &mut tar::Builder<Vec<u8>>, path: &str, target: &str) {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    header.set_mode(0o777);
    builder.append_link(&mut header, path, target).unwrap();
}

/// An archive with an entry named `name` as it is, which the tar crate's writer refuses.
fn raw(name: &[u8]) -> Vec<u8> {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(1);
    header.set_mode(0o644);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, &b"x"[..]).unwrap();
    builder.into_inner().unwrap()
}

fn tree() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    file(&mut builder, "tree/run.sh", b"#!/bin/sh\necho ran\n", 0o755);
    file(&mut builder, "tree/conf/secret.txt", b"hunter2\n", 0o600);
    link(&mut builder, "tree/current", "conf/secret.txt");
    builder.into_inner().unwrap()
}

/// Uploads `archive` in messages of `piece` bytes.
pub(crate) async fn upload(
    files: &mut FilesService,
    sandbox: &str,
    path: &str,
    archive: Vec<u8>,
    piece: usize,
) -> Result<Vec<pb::FileSum>, tonic::Status> {
    let start = pb::UploadStart { sandbox: sandbox.into(), path: path.into() };
    let mut messages = vec![pb::UploadInput { input: Some(pb::upload_input::Input::Start(start)) }];
    for piece in archive.chunks(piece) {
        messages.push(pb::UploadInput { input: Some(pb::upload_input::Input::Data(piece.to_vec())) });
    }
    let (tx, rx) = tokio::sync::mpsc::channel(messages.len());
    for m in messages {
        tx.send(m).await.unwrap();
    }
    drop(tx);
    Ok(files.upload(ReceiverStream::new(rx)).await?.into_inner().files)
}

/// The tar stream and its end, checked against each other.
async fn download(
    files: &mut FilesService,
    sandbox: &str,
    path: &str,
) -> Result<(Vec<u8>, pb::DownloadEnd), tonic::Status> {
    use sha2::Digest as _;
    let request = pb::DownloadRequest { sandbox: sandbox.into(), path: path.into() };
    let mut stream = files.download(request).await?.into_inner();
    let mut tar = Vec::new();
    loop {
        match stream.message().await?.and_then(|m| m.output).expect("the stream ends with its end") {
            pb::download_output::Output::Data(data) => tar.extend(data),
            pb::download_output::Output::End(end) => {
                assert_eq!(
                    (tar.len() as u64, hex::encode(sha2::Sha256::digest(&tar))),
                    (end.bytes, end.sha256.clone())
                );
                return Ok((tar, end));
            }
        }
    }
}

/// `(path, mode, content or link target)` of every entry.
fn entries(tar: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
    use std::io::Read as _;
    let mut archive = tar::Archive::new(tar);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let mode = e.header().mode().unwrap() & 0o7777;
            let mut body = Vec::new();
            match e.link_name().unwrap() {
                Some(target) => body.extend(target.to_string_lossy().as_bytes()),
                None => {
                    e.read_to_end(&mut body).unwrap();
                }
            }
            (path, mode, body)
        })
        .collect()
}

fn sha(data: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(data))
}

/// A gateway on `target` with a Ready sandbox "box", and clients of it.
async fn a_ready_box(target: &Target, data: &DataDir) -> (Gateway, Sandboxes, FilesService, Execs) {
    let gateway = target.gateway(data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    create_in(target, &mut sandboxes, "box", &["sleep", "3600"]).await;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    let (files, execs) = (files(&gateway).await, gateway.execs().await);
    (gateway, sandboxes, files, execs)
}

async fn a_tree_goes_in_and_out_while_it_runs_and_while_it_is_stopped(runtime: Runtime) {
    let Some(target) = target(runtime, "files").await else { return };
    let data = DataDir::new();
    let (_gateway, mut sandboxes, mut files, mut execs) = a_ready_box(&target, &data).await;

    let written = upload(&mut files, "box", "/workspace/data", tree(), PIECE).await.unwrap();
    let sums: Vec<(&str, u64, &str)> = written.iter().map(|f| (f.path.as_str(), f.size, f.sha256.as_str())).collect();
    let secret_sum = sha(b"hunter2\n");
    assert_eq!(sums[1], ("tree/conf/secret.txt", 8, secret_sum.as_str()), "{runtime:?}");
    assert_eq!(sums.len(), 3);
    // The command sees it: through the link, with its mode.
    let seen = run(
        &mut execs,
        start("box", &["sh", "-c", "cat data/tree/current; stat -c %a data/tree/run.sh; ./data/tree/run.sh"]),
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&seen.stdout), "hunter2\n755\nran\n", "{runtime:?}");

    let (tar, end) = download(&mut files, "box", "data/tree").await.unwrap();
    let got = entries(&tar);
    let expected = [
        ("tree".to_string(), 0o755, b"".to_vec()),
        ("tree/conf".into(), 0o755, b"".to_vec()),
        ("tree/conf/secret.txt".into(), 0o600, b"hunter2\n".to_vec()),
        ("tree/current".into(), 0o777, b"conf/secret.txt".to_vec()),
        ("tree/run.sh".into(), 0o755, b"#!/bin/sh\necho ran\n".to_vec()),
    ];
    let got_no_dir_modes: Vec<(String, Vec<u8>)> = got.iter().map(|(p, _, b)| (p.clone(), b.clone())).collect();
    assert_eq!(
        got_no_dir_modes,
        expected.iter().map(|(p, _, b)| (p.clone(), b.clone())).collect::<Vec<_>>(),
        "{runtime:?}"
    );
    assert_eq!((got[2].1, got[4].1), (0o600, 0o755), "{runtime:?}");
    assert!(end.files.iter().any(|f| f.path == "tree/conf/secret.txt" && f.sha256 == secret_sum));

    // Stopped: the same workspace, through the driver.
    lifecycle(&mut sandboxes, "stop", "box").await.unwrap();
    wait_phase(&mut sandboxes, "box", pb::Phase::Stopped).await;
    let mut later = tar::Builder::new(Vec::new());
    file(&mut later, "note.txt", b"written while stopped\n", 0o644);
    upload(&mut files, "box", "", later.into_inner().unwrap(), PIECE).await.unwrap();
    let (tar, _) = download(&mut files, "box", "/workspace/note.txt").await.unwrap();
    assert_eq!(entries(&tar), [("note.txt".to_string(), 0o644, b"written while stopped\n".to_vec())], "{runtime:?}");
    let (again, _) = download(&mut files, "box", "data/tree/conf/secret.txt").await.unwrap();
    assert_eq!(entries(&again)[0].2, b"hunter2\n");
    lifecycle(&mut sandboxes, "start", "box").await.unwrap();
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    let seen = run(&mut execs, start("box", &["cat", "note.txt"])).await;
    assert_eq!(seen.stdout, b"written while stopped\n", "{runtime:?}");
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn every_escape_is_refused_and_nothing_is_written_outside(runtime: Runtime) {
    let Some(target) = target(runtime, "filesesc").await else { return };
    let data = DataDir::new();
    let (_gateway, mut sandboxes, mut files, mut execs) = a_ready_box(&target, &data).await;
    // Links the sandbox makes to the host's root and to a directory outside its workspace.
    let outside = tempfile::tempdir().unwrap();
    let outside_path = outside.path().display().to_string();
    let made =
        run(&mut execs, start("box", &["sh", "-c", &format!("ln -s / root; ln -s {outside_path} away; ln -s .. up")]))
            .await;
    assert_eq!(made.exit_code(), Some(0), "{runtime:?}");

    let mut one = tar::Builder::new(Vec::new());
    file(&mut one, "planted", b"x", 0o644);
    let one = one.into_inner().unwrap();
    for into in ["root/tmp", "away", "up", "up/x", "/etc", "../x", "a/../../x"] {
        let refused = upload(&mut files, "box", into, one.clone(), PIECE).await.expect_err(into);
        assert_eq!(refused.code(), Code::InvalidArgument, "{runtime:?} {into}: {refused}");
        assert!(refused.message().contains("path"), "{refused}");
    }
    let mut outward = tar::Builder::new(Vec::new());
    link(&mut outward, "link", "../../etc");
    for archive in [raw(b"../escaped"), raw(b"/tmp/escaped"), outward.into_inner().unwrap()] {
        let refused = upload(&mut files, "box", "", archive, PIECE).await.expect_err("an escaping entry");
        assert_eq!(refused.code(), Code::InvalidArgument, "{runtime:?}: {refused}");
        assert!(refused.message().contains("archive entry"), "{refused}");
    }
    for from in ["root/etc/passwd", "away/x", "up/x", "/etc/passwd"] {
        let refused = download(&mut files, "box", from).await.expect_err(from);
        assert!(matches!(refused.code(), Code::InvalidArgument | Code::NotFound), "{runtime:?} {from}: {refused}");
        assert!(!refused.message().contains("root:"), "{refused}");
    }
    // The links themselves come out as links, never as what they lead to.
    let (tar, _) = download(&mut files, "box", "").await.unwrap();
    let top: Vec<(String, Vec<u8>)> = entries(&tar).into_iter().map(|(p, _, b)| (p, b)).collect();
    let names: Vec<&str> = top.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["away", "root", "up"], "{runtime:?}");
    // busybox's ln may write the root as "//".
    assert!(top[0].1 == outside_path.as_bytes() && top[1].1.iter().all(|b| *b == b'/') && top[2].1 == b"..", "{top:?}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "written outside the workspace");
    assert!(!std::path::Path::new("/tmp/planted").exists() && !std::path::Path::new("/tmp/escaped").exists());
    clean_up(&target, &data, &mut sandboxes).await;
}

macro_rules! on_every_driver {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_tree_goes_in_and_out_while_it_runs_and_while_it_is_stopped() {
                    super::a_tree_goes_in_and_out_while_it_runs_and_while_it_is_stopped(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn every_escape_is_refused_and_nothing_is_written_outside() {
                    super::every_escape_is_refused_and_nothing_is_written_outside(Runtime::$runtime).await
                }
            }
        )*
    };
}

on_every_driver!(Process => process, Docker => docker, Podman => podman);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_names_its_field_and_status_and_over_the_cap_writes_nothing() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &["--max-upload-bytes", "4096"]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut files = files(&gateway).await;
    create(&mut sandboxes, "box", &["sleep", "3600"], &[]).await;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;

    let missing = upload(&mut files, "missing", "", tree(), PIECE).await.expect_err("no such sandbox");
    assert_eq!(missing.code(), Code::NotFound, "{missing}");
    let missing = download(&mut files, "box", "nothing/here").await.expect_err("no such file");
    assert_eq!(missing.code(), Code::NotFound, "{missing}");
    assert!(missing.message().contains("nothing/here"), "{missing}");
    let mut big = tar::Builder::new(Vec::new());
    file(&mut big, "big", &[7u8; 10_000], 0o644);
    let over = upload(&mut files, "box", "", big.into_inner().unwrap(), PIECE).await.expect_err("over the cap");
    assert_eq!(over.code(), Code::ResourceExhausted, "{over}");
    assert!(over.message().contains("max_upload_bytes"), "{over}");
    let garbage = upload(&mut files, "box", "", vec![1u8; 1024], PIECE).await.expect_err("not a tar stream");
    assert_eq!(garbage.code(), Code::InvalidArgument, "{garbage}");
    let (tar, _) = download(&mut files, "box", "").await.unwrap();
    assert!(entries(&tar).is_empty(), "nothing was written: {:?}", entries(&tar));

    let mut anonymous = berth_proto::v1::files_client::FilesClient::new(gateway.channel().await);
    let request = pb::DownloadRequest { sandbox: "box".into(), path: String::new() };
    assert_eq!(anonymous.download(request).await.expect_err("no token").code(), Code::Unauthenticated);
}
