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

impl Client {
    /// `berth sandbox logs`: a generation's output (0: the current one's) from `offset`.
    /// Through a lost gateway it reads on from the offset it got to, of the same generation.
    pub(super) async fn logs(
        &mut self,
        sandbox: String,
        mut generation: u64,
        offset: u64,
        follow: bool,
    ) -> Result<u8, Failed> {
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
