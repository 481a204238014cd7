//! berth-logs: a sandbox's output on disk (DESIGN 8.1, 8.2): its main process's, per
//! generation, and each exec's.
//!
//! The supervisor writes it ([`Writer`]); the driver's host reads it ([`read`]), while the run
//! goes on and after it is over, so the output of a command that failed is there to read once
//! its sandbox is Stopped or in Error, and an exec's output is there for any gateway on the
//! host. The two meet only in a directory of the sandbox's state, outside its workspace, and in
//! this format:
//!
//! ```text
//! g<generation>-<offset>.log       a segment: records of the generation's output from <offset>
//! g<generation>.end                its exit code (or nothing): the output is complete
//! x<generation>.<exec id>-<offset>.log, x<generation>.<exec id>.end    the same, of an exec
//! ```
//!
//! A record is a stream byte (1 stdout, 2 stderr), a little-endian `u32` length, and that many
//! bytes. Offsets count the output's bytes, both streams together in the order they were read,
//! so one number says where a reader is. A segment holds about a quarter of the cap; past the
//! cap the oldest segment is removed, and a reader asking for what it held is told the gap.
//!
//! A run may write into this directory (a container mounts it), so the reader trusts none of it:
//! it opens nothing through a symbolic link, reads only regular files, and takes a malformed
//! record for the end of what was written.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, ErrorKind, Read as _, Seek, SeekFrom, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The output kept per generation, by default.
pub const DEFAULT_CAP: u64 = 16 << 20;
/// How many generations' output is kept (their execs' too): the newest run removes older ones.
pub const KEPT_GENERATIONS: u64 = 8;

/// Whose output a log holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Log {
    Main {
        generation: u64,
    },
    /// An exec's: its id is a record's (letters, digits, `-`, `_`, `.`).
    Exec {
        generation: u64,
        id: String,
    },
}

impl Log {
    fn prefix(&self) -> String {
        match self {
            Log::Main { generation } => format!("g{generation}"),
            Log::Exec { generation, id } => format!("x{generation}.{id}"),
        }
    }
}

/// The generation a segment's or end's prefix belongs to.
fn generation_of(prefix: &str) -> Option<u64> {
    match prefix.strip_prefix('g') {
        Some(generation) => generation.parse().ok(),
        None => prefix.strip_prefix('x')?.split_once('.')?.0.parse().ok(),
    }
}
const HEADER: u64 = 5;
/// The most a record holds: what one read of a pipe gives is far less.
const MAX_RECORD: u32 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
    /// Everything a command run on a terminal wrote.
    Tty,
}

impl Stream {
    fn byte(self) -> u8 {
        match self {
            Stream::Stdout => 1,
            Stream::Stderr => 2,
            Stream::Tty => 3,
        }
    }

    fn of(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(Stream::Stdout),
            2 => Some(Stream::Stderr),
            3 => Some(Stream::Tty),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub stream: Stream,
    pub offset: u64,
    pub data: Vec<u8>,
}

/// What a read from an offset found.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Output from the offset asked, in order.
    Data(Vec<Chunk>),
    /// `[from, to)` is no longer kept: read on from `to`.
    Gap { from: u64, to: u64 },
    /// Nothing past the offset yet; the run may write more.
    Wait,
    /// The output is complete and `offset` is its end; the exit code if the supervisor saw it.
    End { offset: u64, exit_code: Option<i32> },
}

fn segment_name(prefix: &str, start: u64) -> String {
    format!("{prefix}-{start}.log")
}

fn end_name(prefix: &str) -> String {
    format!("{prefix}.end")
}

/// Every segment in `dir`: `(prefix, start)`, ordered.
fn segments(dir: &Path) -> io::Result<Vec<(String, u64)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut all = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        let parsed = name.to_str().and_then(|n| n.strip_suffix(".log")).and_then(|n| {
            let (prefix, start) = n.rsplit_once('-')?;
            generation_of(prefix)?;
            Some((prefix.to_string(), start.parse().ok()?))
        });
        all.extend(parsed);
    }
    all.sort_unstable();
    Ok(all)
}

/// The generations whose main output `dir` keeps, oldest first.
pub fn generations(dir: &Path) -> io::Result<Vec<u64>> {
    let mut generations: Vec<u64> =
        segments(dir)?.into_iter().filter(|(p, _)| p.starts_with('g')).filter_map(|(p, _)| generation_of(&p)).collect();
    generations.sort_unstable();
    generations.dedup();
    Ok(generations)
}

/// Removes all of `log`'s output.
pub fn remove(dir: &Path, log: &Log) -> io::Result<()> {
    let prefix = log.prefix();
    for (p, start) in segments(dir)? {
        if p == prefix {
            remove_file(&dir.join(segment_name(&p, start)))?;
        }
    }
    remove_file(&dir.join(end_name(&prefix)))
}

/// Removes the output (main and execs') of generations [`KEPT_GENERATIONS`] or more older than
/// `generation`: the newest run's first act on the logs.
pub fn prune(dir: &Path, generation: u64) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        let prefix =
            name.strip_suffix(".end").or_else(|| name.strip_suffix(".log").and_then(|n| Some(n.rsplit_once('-')?.0)));
        if prefix.and_then(generation_of).is_some_and(|g| g + KEPT_GENERATIONS <= generation) {
            remove_file(&dir.join(name))?;
        }
    }
    Ok(())
}

/// Opens a file the run may have put there: never through a symbolic link, only a regular file.
fn open_untrusted(path: &Path) -> io::Result<File> {
    let flags = nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY;
    let file = OpenOptions::new().read(true).custom_flags(flags).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(ErrorKind::InvalidData, format!("{} is not a regular file", path.display())));
    }
    Ok(file)
}

/// The next record's header, or `None` at the end of what was completely written.
fn next_header(reader: &mut impl io::Read) -> io::Result<Option<(Stream, u32)>> {
    let mut header = [0u8; HEADER as usize];
    match reader.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes([header[1], header[2], header[3], header[4]]);
    // The writer never writes an empty record: one is malformed (and would cost a reader
    // without giving it a byte).
    Ok(Stream::of(header[0]).filter(|_| (1..=MAX_RECORD).contains(&len)).map(|stream| (stream, len)))
}

/// Walks a segment's complete records: `visit(stream, offset, len, reader)` for each, the reader
/// at the record's data, returning how many of its bytes it read, or `None` to stop the walk.
/// The offset after the last complete record, and the file length it ends at.
fn walk(
    file: File,
    start: u64,
    mut visit: impl FnMut(Stream, u64, u32, &mut BufReader<File>) -> io::Result<Option<u64>>,
) -> io::Result<(u64, u64)> {
    let size = file.metadata()?.len();
    let mut reader = BufReader::new(file);
    let (mut offset, mut at) = (start, 0u64);
    while let Some((stream, len)) = next_header(&mut reader)? {
        if at + HEADER + u64::from(len) > size {
            break; // Still being written, or cut short by a crash.
        }
        let Some(read) = visit(stream, offset, len, &mut reader)? else { break };
        // Past the rest of the record, keeping what is buffered.
        reader.seek_relative(i64::from(len) - i64::try_from(read).unwrap_or(i64::MAX))?;
        offset += u64::from(len);
        at += HEADER + u64::from(len);
    }
    Ok((offset, at))
}

/// Up to about `max` bytes of `log`'s output from `from`. `over`: the caller knows the command
/// has ended (the driver saw its run exit, the exec's record is final), so what is written is
/// all there is, whether or not its supervisor recorded the end.
pub fn read(dir: &Path, log: &Log, from: u64, max: usize, over: bool) -> io::Result<Read> {
    let prefix = log.prefix();
    // A segment removed between the listing and its opening (the writer past its cap): list again.
    for _ in 0..4 {
        match read_once(dir, &prefix, from, max, over) {
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            other => return other,
        }
    }
    read_once(dir, &prefix, from, max, over)
}

fn read_once(dir: &Path, prefix: &str, from: u64, max: usize, over: bool) -> io::Result<Read> {
    let starts: Vec<u64> = segments(dir)?.into_iter().filter(|(p, _)| p == prefix).map(|(_, s)| s).collect();
    if let Some(&first) = starts.first()
        && from < first
    {
        return Ok(Read::Gap { from, to: first });
    }
    let mut chunks = Vec::new();
    let mut taken = 0usize;
    let mut end = 0;
    // The segment holding `from`, and the ones after it.
    let first = starts.partition_point(|s| *s <= from).saturating_sub(1);
    for &start in starts.iter().skip(first) {
        let file = open_untrusted(&dir.join(segment_name(prefix, start)))?;
        (end, _) = walk(file, start, |stream, offset, len, reader| {
            let record_end = offset + u64::from(len);
            if taken >= max {
                return Ok(None);
            }
            if record_end <= from {
                return Ok(Some(0));
            }
            let skip = from.saturating_sub(offset);
            reader.seek_relative(i64::try_from(skip).unwrap_or(i64::MAX))?;
            let want = (u64::from(len) - skip).min(max.saturating_sub(taken).max(1) as u64);
            let mut data = vec![0; usize::try_from(want).unwrap_or(usize::MAX)];
            reader.read_exact(&mut data)?;
            // Headers count too: records of a byte each cost what they are.
            taken += HEADER as usize + data.len();
            chunks.push(Chunk { stream, offset: offset + skip, data });
            Ok(Some(skip + want))
        })?;
        if taken >= max {
            break;
        }
    }
    if !chunks.is_empty() {
        return Ok(Read::Data(chunks));
    }
    match ended(dir, prefix)? {
        Some(exit_code) => Ok(Read::End { offset: end, exit_code }),
        None if over => Ok(Read::End { offset: end, exit_code: None }),
        None => Ok(Read::Wait),
    }
}

/// Whether the output is complete, and the exit code its end recorded.
fn ended(dir: &Path, prefix: &str) -> io::Result<Option<Option<i32>>> {
    let mut file = match open_untrusted(&dir.join(end_name(prefix))) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut text = String::new();
    io::Read::take(&mut file, 32).read_to_string(&mut text)?;
    Ok(Some(text.trim().parse().ok()))
}

/// A log's output, written as the supervisor reads it from its command's pipes.
pub struct Writer {
    dir: PathBuf,
    prefix: String,
    cap: u64,
    /// The segments kept, oldest first: their start offsets.
    starts: Vec<u64>,
    file: File,
    /// The file length of the open segment.
    written: u64,
    /// The offset after the last byte written.
    end: u64,
}

impl Writer {
    /// Opens `log` in `dir`, going on after whatever an earlier run of the same generation wrote
    /// (a container restarted out of band).
    pub fn open(dir: &Path, log: &Log, cap: u64) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let prefix = log.prefix();
        remove_file(&dir.join(end_name(&prefix)))?;
        let starts: Vec<u64> = segments(dir)?.into_iter().filter(|(p, _)| *p == prefix).map(|(_, s)| s).collect();
        let mut writer = match starts.last() {
            None => {
                let file = create(&dir.join(segment_name(&prefix, 0)))?;
                Self { dir: dir.to_path_buf(), prefix, cap, starts: vec![0], file, written: 0, end: 0 }
            }
            Some(&last) => {
                let path = dir.join(segment_name(&prefix, last));
                let (end, written) = walk(open_untrusted(&path)?, last, |_, _, _, _| Ok(Some(0)))?;
                // A record cut short by a crash is dropped: what follows starts clean.
                let file = OpenOptions::new().write(true).custom_flags(nix::libc::O_NOFOLLOW).open(&path)?;
                file.set_len(written)?;
                Self { dir: dir.to_path_buf(), prefix, cap, starts, file, written, end }
            }
        };
        writer.file.seek(SeekFrom::End(0))?;
        Ok(writer)
    }

    fn segment_size(&self) -> u64 {
        (self.cap / 4).max(1)
    }

    pub fn append(&mut self, stream: Stream, data: &[u8]) -> io::Result<()> {
        for piece in data.chunks(MAX_RECORD as usize) {
            if self.written > 0 && self.written + HEADER + piece.len() as u64 > self.segment_size() {
                self.rotate()?;
            }
            let len = u32::try_from(piece.len()).expect("a piece is at most MAX_RECORD");
            let mut record = Vec::with_capacity(HEADER as usize + piece.len());
            record.push(stream.byte());
            record.extend_from_slice(&len.to_le_bytes());
            record.extend_from_slice(piece);
            self.file.write_all(&record)?;
            self.written += record.len() as u64;
            self.end += piece.len() as u64;
        }
        Ok(())
    }

    /// A new segment from the end; the oldest go while what is kept exceeds the cap.
    fn rotate(&mut self) -> io::Result<()> {
        self.file = create(&self.dir.join(segment_name(&self.prefix, self.end)))?;
        self.starts.push(self.end);
        self.written = 0;
        while self.starts.len() > 1 && self.end - self.starts[0] > self.cap.saturating_sub(self.segment_size()) {
            remove_file(&self.dir.join(segment_name(&self.prefix, self.starts.remove(0))))?;
        }
        Ok(())
    }

    /// How many bytes were written in all, kept or not.
    pub fn total(&self) -> u64 {
        self.end
    }

    /// The command ended (with `exit_code`, when it is one): the output is complete.
    pub fn finish(self, exit_code: Option<i32>) -> io::Result<()> {
        self.file.sync_data()?;
        let path = self.dir.join(end_name(&self.prefix));
        let tmp = self.dir.join(format!(".{}.tmp", end_name(&self.prefix)));
        std::fs::write(&tmp, exit_code.map(|code| format!("{code}\n")).unwrap_or_default())?;
        std::fs::rename(tmp, path)
    }
}

fn create(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

fn remove_file(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn main(generation: u64) -> Log {
        Log::Main { generation }
    }

    fn data(read: Read) -> Vec<(Stream, u64, Vec<u8>)> {
        match read {
            Read::Data(chunks) => chunks.into_iter().map(|c| (c.stream, c.offset, c.data)).collect(),
            other => panic!("expected data, got {other:?}"),
        }
    }

    #[test]
    fn offsets_count_both_streams_and_a_read_starts_inside_a_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), &main(1), DEFAULT_CAP).unwrap();
        w.append(Stream::Stdout, b"hello ").unwrap();
        w.append(Stream::Stderr, b"oops\n").unwrap();
        assert_eq!(
            data(read(dir.path(), &main(1), 0, 1024, false).unwrap()),
            vec![(Stream::Stdout, 0, b"hello ".to_vec()), (Stream::Stderr, 6, b"oops\n".to_vec())]
        );
        assert_eq!(data(read(dir.path(), &main(1), 8, 2, false).unwrap()), vec![(Stream::Stderr, 8, b"ps".to_vec())]);
        assert_eq!(read(dir.path(), &main(1), 11, 1024, false).unwrap(), Read::Wait);
        assert_eq!(read(dir.path(), &main(1), 11, 1024, true).unwrap(), Read::End { offset: 11, exit_code: None });
        w.finish(Some(3)).unwrap();
        assert_eq!(read(dir.path(), &main(1), 11, 1024, false).unwrap(), Read::End { offset: 11, exit_code: Some(3) });
        assert_eq!(read(dir.path(), &main(2), 0, 1024, true).unwrap(), Read::End { offset: 0, exit_code: None });
    }

    #[test]
    fn past_the_cap_the_oldest_segment_goes_and_a_reader_is_told_the_gap() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), &main(4), 400).unwrap();
        for i in 0..100u8 {
            w.append(Stream::Stdout, &[i; 10]).unwrap();
        }
        assert_eq!(w.total(), 1000);
        let Read::Gap { from: 0, to } = read(dir.path(), &main(4), 0, 1024, false).unwrap() else { panic!("no gap") };
        assert!((600..=800).contains(&to), "{to}");
        let got = data(read(dir.path(), &main(4), to, 10_000, false).unwrap());
        assert_eq!(got.first().map(|c| c.1), Some(to));
        let bytes: Vec<u8> = got.into_iter().flat_map(|c| c.2).collect();
        let expected: Vec<u8> = (0..100u8).flat_map(|i| [i; 10]).skip(usize::try_from(to).unwrap()).collect();
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_restarted_run_goes_on_after_a_record_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), &main(2), DEFAULT_CAP).unwrap();
        w.append(Stream::Stdout, b"first").unwrap();
        w.finish(Some(0)).unwrap();
        // A crash mid-record: a header promising more than follows.
        let mut f = OpenOptions::new().append(true).open(dir.path().join(segment_name("g2", 0))).unwrap();
        f.write_all(&[1, 9, 0, 0, 0, b'x']).unwrap();
        assert_eq!(read(dir.path(), &main(2), 5, 100, false).unwrap(), Read::End { offset: 5, exit_code: Some(0) });
        let mut w = Writer::open(dir.path(), &main(2), DEFAULT_CAP).unwrap();
        assert_eq!(read(dir.path(), &main(2), 5, 100, false).unwrap(), Read::Wait, "the restart reopened the output");
        w.append(Stream::Stdout, b" again").unwrap();
        let bytes: Vec<u8> =
            data(read(dir.path(), &main(2), 0, 100, false).unwrap()).into_iter().flat_map(|c| c.2).collect();
        assert_eq!(bytes, b"first again");
    }

    #[test]
    fn a_new_generation_removes_the_output_of_ones_too_old_to_keep_and_their_execs() {
        let dir = tempfile::tempdir().unwrap();
        for generation in 1..=10 {
            prune(dir.path(), generation).unwrap();
            let exec = Log::Exec { generation, id: format!("job-{generation}.1") };
            Writer::open(dir.path(), &exec, DEFAULT_CAP).unwrap().finish(None).unwrap();
            let mut w = Writer::open(dir.path(), &main(generation), DEFAULT_CAP).unwrap();
            w.append(Stream::Stdout, format!("run {generation}").as_bytes()).unwrap();
            w.finish(Some(0)).unwrap();
        }
        assert_eq!(generations(dir.path()).unwrap(), (3..=10).collect::<Vec<_>>());
        assert!(!dir.path().join(end_name("g2")).exists());
        let exec = |generation: u64| Log::Exec { generation, id: format!("job-{generation}.1") };
        assert_eq!(read(dir.path(), &exec(2), 0, 10, false).unwrap(), Read::Wait, "pruned with its generation");
        assert_eq!(read(dir.path(), &exec(3), 0, 10, false).unwrap(), Read::End { offset: 0, exit_code: None });
    }

    #[test]
    fn a_symbolic_link_in_place_of_a_segment_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, [1, 6, 0, 0, 0, b's', b'e', b'c', b'r', b'e', b't']).unwrap();
        let logs = dir.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        std::os::unix::fs::symlink(&secret, logs.join(segment_name("g1", 0))).unwrap();
        let err = read(&logs, &main(1), 0, 100, false).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::ELOOP), "{err}");
        std::fs::remove_file(logs.join(segment_name("g1", 0))).unwrap();
        std::fs::create_dir(logs.join(segment_name("g1", 0))).unwrap();
        assert_eq!(read(&logs, &main(1), 0, 100, false).unwrap_err().kind(), ErrorKind::InvalidData);
    }

    #[test]
    fn a_malformed_record_ends_what_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(dir.path(), &main(1), DEFAULT_CAP).unwrap();
        w.append(Stream::Stdout, b"ok").unwrap();
        let mut f = OpenOptions::new().append(true).open(dir.path().join(segment_name("g1", 0))).unwrap();
        // Empty records (a flood of them would cost a reader without giving it a byte), an
        // unknown stream, a length past any record's.
        f.write_all(&[1, 0, 0, 0, 0].repeat(1000)).unwrap();
        f.write_all(&[7, 1, 0, 0, 0, b'x', 1, 0xff, 0xff, 0xff, 0xff]).unwrap();
        assert_eq!(data(read(dir.path(), &main(1), 0, 100, true).unwrap()), vec![(Stream::Stdout, 0, b"ok".to_vec())]);
        assert_eq!(read(dir.path(), &main(1), 2, 100, true).unwrap(), Read::End { offset: 2, exit_code: None });
    }

    #[test]
    fn an_execs_output_is_apart_from_its_generations_whatever_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let exec = Log::Exec { generation: 1, id: "g1-0.log".into() };
        let mut main_log = Writer::open(dir.path(), &main(1), DEFAULT_CAP).unwrap();
        let mut exec_log = Writer::open(dir.path(), &exec, DEFAULT_CAP).unwrap();
        main_log.append(Stream::Stdout, b"main").unwrap();
        exec_log.append(Stream::Tty, b"exec").unwrap();
        exec_log.finish(None).unwrap();
        assert_eq!(
            data(read(dir.path(), &main(1), 0, 100, false).unwrap()),
            vec![(Stream::Stdout, 0, b"main".to_vec())]
        );
        assert_eq!(data(read(dir.path(), &exec, 0, 100, false).unwrap()), vec![(Stream::Tty, 0, b"exec".to_vec())]);
        assert_eq!(read(dir.path(), &exec, 4, 100, false).unwrap(), Read::End { offset: 4, exit_code: None });
        assert_eq!(read(dir.path(), &main(1), 4, 100, false).unwrap(), Read::Wait);
        assert_eq!(generations(dir.path()).unwrap(), [1]);
    }

    #[test]
    fn a_removed_log_is_gone_and_the_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        let exec = Log::Exec { generation: 1, id: "a".into() };
        let mut w = Writer::open(dir.path(), &exec, 40).unwrap();
        for _ in 0..10 {
            w.append(Stream::Stdout, b"0123456789").unwrap();
        }
        w.finish(None).unwrap();
        Writer::open(dir.path(), &main(1), DEFAULT_CAP).unwrap().finish(Some(0)).unwrap();
        remove(dir.path(), &exec).unwrap();
        assert_eq!(read(dir.path(), &exec, 0, 100, false).unwrap(), Read::Wait);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "the main log's segment and end stay");
    }
}
