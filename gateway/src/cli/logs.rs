//! `berth sandbox logs`, and the output of a command as the CLI prints it: stdout to stdout,
//! stderr to stderr.

use berth_proto::v1 as pb;

use super::client::{Broke, Client, Failed, Reconnect};
use super::print::ended_output;

/// Where a reader of output (an exec's, or a generation's logs) got to: the offset a stream
/// opened again after a lost gateway reads on from. Output a stream brings again below it is
/// not printed twice.
pub(super) struct Position(pub(super) u64);

impl Position {
    /// Moves past `gap`; whether it was not told already.
    pub(super) fn skip(&mut self, gap: &pb::OutputGap) -> bool {
        let new = gap.to > self.0;
        self.0 = self.0.max(gap.to);
        new
    }

    /// Writes what of `chunk` was not written yet where its stream goes: stderr to stderr, the
    /// rest to stdout.
    pub(super) fn write(&mut self, chunk: &pb::OutputChunk) -> Result<(), Failed> {
        use std::io::Write as _;
        let seen = usize::try_from(self.0.saturating_sub(chunk.offset)).unwrap_or(usize::MAX);
        let data = &chunk.data[seen.min(chunk.data.len())..];
        self.0 = self.0.max(chunk.offset + chunk.data.len() as u64);
        if chunk.stream == i32::from(pb::OutputStream::Stderr) {
            return std::io::stderr().write_all(data).map_err(|e| Failed(format!("cannot write the output: {e}")));
        }
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(data).and_then(|()| out.flush()) {
            ended_output(&e);
        }
        Ok(())
    }
}

/// Where `berth sandbox logs` begins.
pub(super) enum Beginning {
    Offset(u64),
    /// The last this many lines of what is written when it asks.
    Tail(usize),
}

/// Where the last `lines` lines of the output in `chunks` (offset-ordered, the output from
/// `start` to `end`) begin: just past the newline ending the line before them, or `start` when
/// there are no more lines than that. Output that does not end in a newline ends with a line.
fn tail_offset(chunks: &[pb::OutputChunk], start: u64, end: u64, lines: usize) -> u64 {
    if lines == 0 {
        return end;
    }
    let newlines: Vec<u64> = chunks
        .iter()
        .flat_map(|c| c.data.iter().enumerate().filter(|(_, b)| **b == b'\n').map(move |(i, _)| c.offset + i as u64))
        .collect();
    // The newline that ends the last line does not begin one.
    let ends_a_line = newlines.last().is_some_and(|n| n + 1 == end);
    let before = lines + usize::from(ends_a_line);
    match newlines.len().checked_sub(before) {
        Some(i) => newlines[i] + 1,
        None => start,
    }
}

impl Client {
    /// `berth sandbox logs`: a generation's output (0: the current one's) from `from`.
    /// Through a lost gateway it reads on from the offset it got to, of the same generation.
    pub(super) async fn logs(
        &mut self,
        sandbox: String,
        mut generation: u64,
        from: Beginning,
        follow: bool,
    ) -> Result<u8, Failed> {
        let offset = match from {
            Beginning::Offset(offset) => offset,
            Beginning::Tail(lines) => {
                // The generation is fixed first: the tail and what follows it are of one run.
                if generation == 0 {
                    let request = pb::GetSandboxRequest { name: sandbox.clone() };
                    generation =
                        self.sandboxes.get_sandbox(request).await?.into_inner().sandbox.map_or(0, |s| s.generation);
                }
                let request = pb::ReadLogsRequest { sandbox: sandbox.clone(), generation, offset: 0, follow: false };
                let mut events = self.logs.read_logs(request).await?.into_inner();
                let (mut chunks, mut start, mut end) = (Vec::new(), 0, 0);
                while let Some(event) = events.message().await? {
                    match event.output {
                        Some(pb::logs_output::Output::Chunk(chunk)) => chunks.push(chunk),
                        // The oldest output is no longer kept: the tail begins after it at most.
                        Some(pb::logs_output::Output::Gap(gap)) => start = start.max(gap.to),
                        Some(pb::logs_output::Output::End(e)) => end = e.offset,
                        None => {}
                    }
                }
                tail_offset(&chunks, start, end, lines)
            }
        };
        let mut at = Position(offset);
        let mut reconnect = Reconnect::new();
        loop {
            let request = pb::ReadLogsRequest { sandbox: sandbox.clone(), generation, offset: at.0, follow };
            let before = at.0;
            let ended = match self.logs.read_logs(request).await {
                Ok(events) => {
                    if generation == 0 {
                        // The generation the read is of, to read on from it after a reconnect
                        // even if another began meanwhile (only one begun since the read
                        // started is missed).
                        let request = pb::GetSandboxRequest { name: sandbox.clone() };
                        if let Ok(reply) = self.sandboxes.get_sandbox(request).await {
                            generation = reply.into_inner().sandbox.map_or(0, |s| s.generation);
                        }
                    }
                    print_logs(events.into_inner(), &mut at).await
                }
                Err(status) => Err(status.into()),
            };
            if at.0 != before {
                reconnect.progressed();
            }
            match ended {
                Ok(code) => return Ok(code),
                Err(broke) => reconnect.after(self, broke, &format!("reading on from offset {}", at.0)).await?,
            }
        }
    }
}

/// Writes a sandbox's logs as they come.
async fn print_logs(mut events: tonic::Streaming<pb::LogsOutput>, at: &mut Position) -> Result<u8, Broke> {
    use pb::logs_output::Output as Event;
    while let Some(event) = events.message().await? {
        match event.output {
            Some(Event::Chunk(chunk)) => at.write(&chunk)?,
            Some(Event::Gap(gap)) if at.skip(&gap) => {
                eprintln!("berth: output {}..{} is no longer kept (over the generation's cap)", gap.from, gap.to)
            }
            Some(Event::End(_)) => return Ok(0),
            Some(Event::Gap(_)) | None => {}
        }
    }
    Err(Failed("the gateway closed the logs' stream before their end".into()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(offset: u64, text: &str) -> pb::OutputChunk {
        pb::OutputChunk { stream: 0, offset, data: text.as_bytes().to_vec() }
    }

    #[test]
    fn the_tail_begins_at_its_first_line_across_chunks_and_streams() {
        // "a\nb\nc\n" written in three chunks: offsets 0..6.
        let chunks = [chunk(0, "a\nb"), chunk(3, "\nc"), chunk(5, "\n")];
        assert_eq!(tail_offset(&chunks, 0, 6, 1), 4);
        assert_eq!(tail_offset(&chunks, 0, 6, 2), 2);
        assert_eq!(tail_offset(&chunks, 0, 6, 3), 0);
        assert_eq!(tail_offset(&chunks, 0, 6, 10), 0);
        assert_eq!(tail_offset(&chunks, 0, 6, 0), 6);
        // A last line without its newline is a line.
        let unended = [chunk(0, "a\nb\nc")];
        assert_eq!(tail_offset(&unended, 0, 5, 1), 4);
        assert_eq!(tail_offset(&unended, 0, 5, 2), 2);
        // After a gap, no earlier than what is kept; nothing written, nothing to show.
        assert_eq!(tail_offset(&[chunk(10, "x\ny\n")], 10, 14, 5), 10);
        assert_eq!(tail_offset(&[], 0, 0, 3), 0);
    }
}
