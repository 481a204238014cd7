use super::*;
use std::os::unix::fs::PermissionsExt;

fn archive(build: impl FnOnce(&mut tar::Builder<&mut File>)) -> File {
    let mut file = tempfile::tempfile().unwrap();
    {
        let mut builder = tar::Builder::new(&mut file);
        build(&mut builder);
        builder.finish().unwrap();
    }
    file.seek(SeekFrom::Start(0)).unwrap();
    file
}

fn file_entry(builder: &mut tar::Builder<&mut File>, path: &str, data: &[u8], mode: u32) {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    header.set_cksum();
    builder.append_data(&mut header, path, data).unwrap();
}

fn link_entry(builder: &mut tar::Builder<&mut File>, path: &str, target: &str) {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    header.set_mode(0o777);
    builder.append_link(&mut header, path, target).unwrap();
}

/// A raw header, for names the tar crate refuses to write.
fn raw_entry(builder: &mut tar::Builder<&mut File>, path: &[u8]) {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..path.len()].copy_from_slice(path);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(1);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append(&header, &b"x"[..]).unwrap();
}

#[test]
fn a_tree_goes_in_and_comes_out_with_modes_links_and_checksums() {
    let root = tempfile::tempdir().unwrap();
    let mut tar = archive(|b| {
        file_entry(b, "app/run.sh", b"#!/bin/sh\necho hi\n", 0o755);
        file_entry(b, "app/data/config.json", b"{}", 0o600);
        link_entry(b, "app/current", "data/config.json");
    });
    let sums = unpack(root.path(), Path::new("dest"), &mut tar, Limits::default()).unwrap();
    let names: Vec<(&str, Kind)> = sums.iter().map(|s| (s.path.as_str(), s.kind)).collect();
    assert_eq!(
        names,
        [("app/run.sh", Kind::File), ("app/data/config.json", Kind::File), ("app/current", Kind::Symlink)]
    );
    assert_eq!(sums[1].sha256, hex::encode(Sha256::digest(b"{}")));
    let run = root.path().join("dest/app/run.sh");
    assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(std::fs::read_link(root.path().join("dest/app/current")).unwrap(), Path::new("data/config.json"));

    let mut out = Vec::new();
    let packed = pack(root.path(), Path::new("dest/app"), &mut out, Limits::default()).unwrap();
    let listed: Vec<&str> = packed.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(listed, ["app", "app/current", "app/data", "app/data/config.json", "app/run.sh"]);
    assert_eq!(packed[3].sha256, sums[1].sha256);
    let mut back = tar::Archive::new(out.as_slice());
    let entries: Vec<(String, u32)> = back
        .entries()
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.path().unwrap().display().to_string(), e.header().mode().unwrap() & 0o777))
        .collect();
    assert!(entries.contains(&("app/run.sh".to_string(), 0o755)), "{entries:?}");
}

#[test]
fn every_escape_is_refused_and_nothing_is_written() {
    let outside = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let escapes: Vec<(&str, File)> = vec![
        ("..", archive(|b| raw_entry(b, b"../escaped"))),
        ("absolute", archive(|b| raw_entry(b, b"/tmp/escaped"))),
        ("target", archive(|b| link_entry(b, "link", "../../etc"))),
        ("absolute target", archive(|b| link_entry(b, "link", "/etc/passwd"))),
    ];
    for (what, mut tar) in escapes {
        let ok_first = unpack(root.path(), Path::new(""), &mut tar, Limits::default());
        assert!(matches!(ok_first, Err(FilesError::Invalid { .. })), "{what}: {ok_first:?}");
    }
    // A link already in the workspace that leads out is never followed, whatever it is.
    std::os::unix::fs::symlink(outside.path(), root.path().join("out")).unwrap();
    std::os::unix::fs::symlink("/etc", root.path().join("etc")).unwrap();
    for into in ["out", "out/deeper", "etc"] {
        let mut tar = archive(|b| file_entry(b, "f", b"x", 0o644));
        let refused = unpack(root.path(), Path::new(into), &mut tar, Limits::default());
        assert!(matches!(refused, Err(FilesError::Invalid { .. })), "{into}: {refused:?}");
    }
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "written outside");
    let names: Vec<_> = std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "only the two links: {names:?}");
    let mut out = Vec::new();
    let refused = pack(root.path(), Path::new("out/secret"), &mut out, Limits::default());
    assert!(matches!(refused, Err(FilesError::Invalid { .. })), "{refused:?}");
    assert_eq!(
        workspace_path("path", "/etc/passwd").unwrap_err(),
        invalid("path", "/etc/passwd is outside the workspace (/workspace)")
    );
    assert!(workspace_path("path", "a/../../b").is_err());
    assert_eq!(workspace_path("path", "/workspace/a/./b").unwrap(), Path::new("a/b"));
}

#[test]
fn a_bad_entry_late_in_an_archive_writes_nothing_before_it() {
    let root = tempfile::tempdir().unwrap();
    let mut tar = archive(|b| {
        file_entry(b, "good", b"fine", 0o644);
        link_entry(b, "bad", "../../x");
    });
    assert!(unpack(root.path(), Path::new(""), &mut tar, Limits::default()).is_err());
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    let mut many = archive(|b| {
        for i in 0..5 {
            file_entry(b, &format!("f{i}"), b"x", 0o644);
        }
    });
    let limits = Limits { max_entries: 4, ..Limits::default() };
    assert!(matches!(unpack(root.path(), Path::new(""), &mut many, limits), Err(FilesError::TooLarge(_))));
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

#[test]
fn entries_that_only_together_would_escape_or_clash_are_refused_before_a_write() {
    let root = tempfile::tempdir().unwrap();
    let together: Vec<(&str, File)> = vec![
        // `d` -> `.`, then `d/l` -> `../x`: each harmless alone, out of the workspace together.
        (
            "link through a link",
            archive(|b| {
                link_entry(b, "d", ".");
                link_entry(b, "d/l", "../x");
            }),
        ),
        (
            "through a file",
            archive(|b| {
                file_entry(b, "a", b"x", 0o644);
                file_entry(b, "a/b", b"x", 0o644);
            }),
        ),
        (
            "a file and a directory",
            archive(|b| {
                file_entry(b, "same", b"x", 0o644);
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                header.set_mode(0o755);
                b.append_data(&mut header, "same", io::empty()).unwrap();
            }),
        ),
        ("a long name", archive(|b| file_entry(b, &"n".repeat(300), b"x", 0o644))),
    ];
    for (what, mut tar) in together {
        let refused = unpack(root.path(), Path::new(""), &mut tar, Limits::default());
        assert!(matches!(refused, Err(FilesError::Invalid { .. })), "{what}: {refused:?}");
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0, "{what}: written before the refusal");
    }
}

#[test]
fn a_long_name_too_large_to_hold_is_refused_before_it_is_read() {
    let root = tempfile::tempdir().unwrap();
    let mut tar = archive(|b| {
        let name = vec![b'n'; 100 * 1024];
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::GNULongName);
        header.set_size(name.len() as u64);
        header.set_mode(0o644);
        b.append_data(&mut header, "././@LongLink", name.as_slice()).unwrap();
        file_entry(b, "short", b"x", 0o644);
    });
    let refused = unpack(root.path(), Path::new(""), &mut tar, Limits::default());
    assert!(matches!(refused, Err(FilesError::TooLarge(_))), "{refused:?}");
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

#[test]
fn a_pax_global_header_as_git_archive_writes_is_skipped() {
    let root = tempfile::tempdir().unwrap();
    let mut tar = archive(|b| {
        let comment = b"52 comment=0123456789012345678901234567890123456789\n";
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::XGlobalHeader);
        header.set_size(comment.len() as u64);
        header.set_mode(0o644);
        b.append_data(&mut header, "pax_global_header", &comment[..]).unwrap();
        file_entry(b, "repo/README", b"hi", 0o644);
    });
    let sums = unpack(root.path(), Path::new(""), &mut tar, Limits::default()).unwrap();
    assert_eq!(sums.iter().map(|s| s.path.as_str()).collect::<Vec<_>>(), ["repo/README"]);
    assert!(!root.path().join("pax_global_header").exists());
}

#[test]
fn a_read_only_directory_still_takes_its_entries_and_too_deep_a_tree_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let mut tar = archive(|b| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_size(0);
        header.set_mode(0o555);
        b.append_data(&mut header, "ro", io::empty()).unwrap();
        file_entry(b, "ro/inside", b"x", 0o644);
    });
    unpack(root.path(), Path::new(""), &mut tar, Limits::default()).unwrap();
    assert_eq!(std::fs::read(root.path().join("ro/inside")).unwrap(), b"x");
    assert_eq!(std::fs::metadata(root.path().join("ro")).unwrap().permissions().mode() & 0o777, 0o555);
    std::fs::set_permissions(root.path().join("ro"), std::fs::Permissions::from_mode(0o755)).unwrap();

    let deep: PathBuf = (0..MAX_DEPTH + 1).map(|_| "d").collect();
    std::fs::create_dir_all(root.path().join(&deep)).unwrap();
    let refused = pack(root.path(), Path::new(""), io::sink(), Limits::default());
    assert!(matches!(refused, Err(FilesError::TooLarge(_))), "{refused:?}");
}

#[test]
fn a_file_replaced_in_place_is_whole_and_a_missing_path_is_not_found() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("f"), b"old content").unwrap();
    let mut tar = archive(|b| file_entry(b, "f", b"new", 0o640));
    unpack(root.path(), Path::new(""), &mut tar, Limits::default()).unwrap();
    assert_eq!(std::fs::read(root.path().join("f")).unwrap(), b"new");
    let left: Vec<_> = std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["f"], "nothing written aside is left");
    let mut out = Vec::new();
    assert_eq!(
        pack(root.path(), Path::new("nope"), &mut out, Limits::default()),
        Err(FilesError::NotFound("nope".into()))
    );
}

/// A write the disk has no room for (`/dev/full` answers every write so) is refused as one too
/// large: RESOURCE_EXHAUSTED through the files API, a failed copy for a snapshot; never an
/// outage to retry.
#[test]
fn a_full_disk_refuses_the_write_for_good() {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let e = std::io::Write::write_all(&mut &full, b"x").unwrap_err();
    assert!(no_space(&e), "{e:?}");
    assert!(matches!(io_error("writing f", e), FilesError::TooLarge(m) if m.starts_with("writing f: ")));
    let other = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    assert!(matches!(io_error("writing f", other), FilesError::Io(_)));
}
