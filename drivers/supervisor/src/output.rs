//! A command's output, kept with byte offsets under a cap (DESIGN 8.1).
//!
//! Offsets count the command's streams together, in the order its output was read, so one
//! number says where a reader is. Past the cap the oldest output is dropped first, and a reader
//! asking for dropped bytes is told the gap and carries on after it: every reader sees the same
//! bytes at the same offsets (E4), whenever it reads.
//!
//! A reader that follows the output as it is written holds back what it has not read yet: the
//! command then waits to write (its pipe fills) rather than the reader losing output, as it
//! would reading a local pipe. Nobody following, the command never waits.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

/// A chunk of output, and the stream it came from: as the logs on disk keep them, at the same
/// offsets.
pub use berth_logs::{Chunk, Stream};

/// What a read from an offset found.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Output from the offset asked, in order.
    Data(Vec<Chunk>),
    /// `[from, to)` is no longer kept: read on from `to`.
    Gap { from: u64, to: u64 },
    /// Nothing yet past the offset; wait for [`Output::changed`].
    Wait,
    /// The output is complete and the offset is its end.
    End { offset: u64 },
}

struct Kept {
    chunks: VecDeque<Chunk>,
    /// The first offset still kept.
    start: u64,
    /// The offset after the last byte written.
    end: u64,
    kept: usize,
    complete: bool,
    /// Where each follower has read to: nothing from there on is dropped.
    followers: BTreeMap<u64, u64>,
    next_follower: u64,
    /// A write waits for a follower.
    held_back: bool,
    /// The same output on disk, in the same order (the offsets agree).
    log: Option<berth_logs::Writer>,
}

impl Kept {
    /// Drops the oldest output until `more` bytes fit, unless a follower still needs it.
    fn make_room(&mut self, more: usize, cap: usize) -> bool {
        let needed = self.followers.values().copied().min().unwrap_or(u64::MAX);
        while self.kept + more > cap && !self.chunks.is_empty() {
            let oldest = &self.chunks[0];
            let end = oldest.offset + oldest.data.len() as u64;
            if end > needed {
                return false;
            }
            self.kept -= oldest.data.len();
            self.start = end;
            self.chunks.pop_front();
        }
        true
    }
}

/// A reader following the output; what it has not read is kept until it has, or it goes.
pub struct Follower {
    output: Arc<Output>,
    id: u64,
}

impl Follower {
    /// It has read everything before `offset`.
    pub fn advance(&self, offset: u64) {
        self.output.lock().followers.insert(self.id, offset);
        self.output.progress.send_replace(());
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.output.lock().followers.remove(&self.id);
        self.output.progress.send_replace(());
    }
}

pub struct Output {
    cap: usize,
    kept: Mutex<Kept>,
    /// Told of every write and of the completion.
    changed: watch::Sender<()>,
    /// Told whenever a follower reads on or goes.
    progress: watch::Sender<()>,
}

impl Output {
    pub fn new(cap: usize) -> Self {
        let kept = Kept {
            chunks: VecDeque::new(),
            start: 0,
            end: 0,
            kept: 0,
            complete: false,
            followers: BTreeMap::new(),
            next_follower: 0,
            held_back: false,
            log: None,
        };
        Self { cap, kept: Mutex::new(kept), changed: watch::Sender::new(()), progress: watch::Sender::new(()) }
    }

    /// Keeps the output in `log` as well.
    pub fn with_log(self, log: berth_logs::Writer) -> Self {
        self.lock().log = Some(log);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds what the command wrote, dropping the oldest output past the cap; waits while a
    /// follower still needs the oldest.
    pub async fn append(&self, stream: Stream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut progress = self.progress.subscribe();
        loop {
            progress.borrow_and_update();
            {
                let mut k = self.lock();
                let fits = k.make_room(data.len(), self.cap);
                k.held_back = !fits;
                if fits {
                    let offset = k.end;
                    if let Some(log) = k.log.as_mut()
                        && let Err(e) = log.append(stream, data)
                    {
                        eprintln!(
                            "berth-supervisor: cannot keep an exec's output on disk: {e}; it is kept in memory only"
                        );
                        k.log = None;
                    }
                    k.chunks.push_back(Chunk { stream, offset, data: data.to_vec() });
                    k.end += data.len() as u64;
                    k.kept += data.len();
                    break;
                }
            }
            if progress.changed().await.is_err() {
                return;
            }
        }
        self.changed.send_replace(());
    }

    /// Follows the output from `offset`: nothing from there on is dropped until the follower
    /// reads on or is dropped.
    pub fn follow(self: &Arc<Self>, offset: u64) -> Follower {
        let mut k = self.lock();
        let id = k.next_follower;
        k.next_follower += 1;
        k.followers.insert(id, offset);
        Follower { output: self.clone(), id }
    }

    /// Whether a write waits for a follower.
    pub fn held_back(&self) -> bool {
        self.lock().held_back
    }

    /// No more output will come.
    pub fn complete(&self) {
        let log = {
            let mut k = self.lock();
            k.complete = true;
            k.log.take()
        };
        if let Some(Err(e)) = log.map(|log| log.finish(None)) {
            eprintln!("berth-supervisor: cannot mark an exec's output complete on disk: {e}");
        }
        self.changed.send_replace(());
    }

    /// How many bytes were written in all, kept or not.
    pub fn total(&self) -> u64 {
        self.lock().end
    }

    pub fn changed(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Up to about `max` bytes from `offset`.
    pub fn read(&self, offset: u64, max: usize) -> Read {
        let k = self.lock();
        if offset < k.start {
            return Read::Gap { from: offset, to: k.start };
        }
        if offset >= k.end {
            return if k.complete { Read::End { offset: k.end } } else { Read::Wait };
        }
        // The chunk holding `offset`: the last one starting at or before it.
        let first = k.chunks.partition_point(|c| c.offset <= offset) - 1;
        let mut out = Vec::new();
        let mut taken = 0;
        for chunk in k.chunks.range(first..) {
            if taken >= max {
                break;
            }
            let skip = usize::try_from(offset.saturating_sub(chunk.offset)).unwrap_or(usize::MAX);
            let data = &chunk.data[skip.min(chunk.data.len())..];
            let data = &data[..data.len().min(max - taken)];
            taken += data.len();
            out.push(Chunk { stream: chunk.stream, offset: chunk.offset + skip as u64, data: data.to_vec() });
        }
        Read::Data(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(read: Read) -> Vec<(Stream, u64, Vec<u8>)> {
        match read {
            Read::Data(chunks) => chunks.into_iter().map(|c| (c.stream, c.offset, c.data)).collect(),
            other => panic!("expected data, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn reads_from_any_offset_give_the_same_bytes_at_the_same_offsets() {
        let out = Output::new(1024);
        out.append(Stream::Stdout, b"hello ").await;
        out.append(Stream::Stderr, b"oops").await;
        out.append(Stream::Stdout, b" world").await;
        assert_eq!(
            data(out.read(0, 100)),
            vec![
                (Stream::Stdout, 0, b"hello ".to_vec()),
                (Stream::Stderr, 6, b"oops".to_vec()),
                (Stream::Stdout, 10, b" world".to_vec())
            ]
        );
        assert_eq!(
            data(out.read(8, 100)),
            vec![(Stream::Stderr, 8, b"ps".to_vec()), (Stream::Stdout, 10, b" world".to_vec())]
        );
        assert_eq!(
            data(out.read(3, 5)),
            vec![(Stream::Stdout, 3, b"lo ".to_vec()), (Stream::Stderr, 6, b"oo".to_vec())]
        );
        assert_eq!(out.read(16, 100), Read::Wait);
        out.complete();
        assert_eq!(out.read(16, 100), Read::End { offset: 16 });
        assert_eq!(out.total(), 16);
    }

    #[tokio::test]
    async fn past_the_cap_the_oldest_output_is_dropped_and_reported_as_a_gap() {
        let out = Output::new(10);
        for part in [b"aaaa", b"bbbb", b"cccc"] {
            out.append(Stream::Stdout, part).await;
        }
        assert_eq!(out.read(0, 100), Read::Gap { from: 0, to: 4 });
        assert_eq!(out.read(3, 100), Read::Gap { from: 3, to: 4 });
        assert_eq!(
            data(out.read(4, 100)),
            vec![(Stream::Stdout, 4, b"bbbb".to_vec()), (Stream::Stdout, 8, b"cccc".to_vec())]
        );
        assert_eq!(out.total(), 12);
    }

    #[tokio::test]
    async fn completion_wakes_a_reader_waiting_at_the_end() {
        let out = Output::new(10);
        out.append(Stream::Stdout, b"x").await;
        let mut changed = out.changed();
        changed.borrow_and_update();
        out.complete();
        assert!(changed.has_changed().unwrap());
        assert_eq!(out.read(1, 10), Read::End { offset: 1 });
    }

    #[tokio::test]
    async fn a_follower_holds_back_the_writer_instead_of_losing_output() {
        let out = Arc::new(Output::new(8));
        let follower = out.follow(0);
        out.append(Stream::Stdout, b"aaaa").await;
        out.append(Stream::Stdout, b"bbbb").await;
        let writer = tokio::spawn({
            let out = out.clone();
            async move { out.append(Stream::Stdout, b"cccc").await }
        });
        tokio::task::yield_now().await;
        assert!(out.held_back() && !writer.is_finished(), "the follower has not read the oldest");
        assert_eq!(data(out.read(0, 4)), vec![(Stream::Stdout, 0, b"aaaa".to_vec())]);
        follower.advance(4);
        writer.await.unwrap();
        assert!(!out.held_back());
        assert_eq!(out.read(0, 4), Read::Gap { from: 0, to: 4 });
        // A follower gone holds nothing back.
        drop(follower);
        out.append(Stream::Stdout, b"dddddddd").await;
        assert_eq!(out.read(4, 100), Read::Gap { from: 4, to: 12 });
    }
}
