//! `berth sandbox logs`, and the output of a command as the CLI prints it: stdout to stdout,
//! stderr to stderr.

use berth_proto::v1 as pb;

use super::client::{Client, Failed};
use super::print::ended_output;

/// Writes a chunk of output where its stream goes: stderr to stderr, the rest to stdout.
pub(super) fn write_chunk(chunk: &pb::OutputChunk) -> Result<(), Failed> {
    use std::io::Write as _;
    if chunk.stream == i32::from(pb::OutputStream::Stderr) {
        return std::io::stderr().write_all(&chunk.data).map_err(|e| Failed(format!("cannot write the output: {e}")));
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(&chunk.data).and_then(|()| out.flush()) {
        ended_output(&e);
    }
    Ok(())
}

impl Client {
    /// `berth sandbox logs`: a generation's output (0: the current one's) from `offset`.
    pub(super) async fn logs(
        &mut self,
        sandbox: String,
        generation: u64,
        offset: u64,
        follow: bool,
    ) -> Result<u8, Failed> {
        let request = pb::ReadLogsRequest { sandbox, generation, offset, follow };
        print_logs(self.logs.read_logs(request).await?.into_inner()).await
    }
}

/// Writes a sandbox's logs as they come.
async fn print_logs(mut events: tonic::Streaming<pb::LogsOutput>) -> Result<u8, Failed> {
    use pb::logs_output::Output as Event;
    while let Some(event) = events.message().await? {
        match event.output {
            Some(Event::Chunk(chunk)) => write_chunk(&chunk)?,
            Some(Event::Gap(gap)) => {
                eprintln!("berth: output {}..{} is no longer kept (over the generation's cap)", gap.from, gap.to)
            }
            Some(Event::End(_)) => return Ok(0),
            None => {}
        }
    }
    Err(Failed("the gateway closed the logs' stream before their end".into()))
}
