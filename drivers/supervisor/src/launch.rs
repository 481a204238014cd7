//! What runs an exec's command: [`Host`], this machine's processes. The simulator brings its
//! own [`Launcher`], so the exec rules of [`crate::exec`] run there as they do here.

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::pin::Pin;
use std::process::Stdio;

use berth_handoff::var;
use berth_proto::v1 as pb;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::output::Stream;

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

/// A started command: what it writes, where its input goes, its end, and how to signal it.
pub struct Launched {
    pub outputs: Vec<(Box<dyn AsyncRead + Send + Unpin>, Stream)>,
    pub input: Input,
    pub exit: Pin<Box<dyn Future<Output = std::io::Result<Exit>> + Send>>,
    /// Signals everything the command started (its process group).
    pub signal: Box<dyn Fn(Signal) + Send + Sync>,
}

pub trait Launcher: Send + Sync + 'static {
    /// Starts exec `exec_id`'s command. An error is the command's: it cannot be run.
    fn launch(&self, exec_id: &str, run: &pb::RunExec) -> std::io::Result<Launched>;
    /// How many processes the kernel has killed for memory where the commands run, if that can
    /// be read: an exec that fails while it grows failed for memory.
    fn memory_kills(&self) -> Option<u64>;
}

/// Where a client's stdin goes: a pipe, or the terminal of a command run with one.
pub enum Input {
    Pipe(Box<dyn AsyncWrite + Send + Unpin>),
    Terminal(pty_process::OwnedWritePty),
    Closed,
}

impl Input {
    pub async fn write(&mut self, data: &[u8]) {
        let written = match self {
            Input::Pipe(pipe) => pipe.write_all(data).await,
            Input::Terminal(terminal) => terminal.write_all(data).await,
            Input::Closed => return,
        };
        if written.is_err() {
            *self = Input::Closed;
        }
    }

    /// No more input. A terminal stays the command's output, so it is told end of file as a
    /// terminal's user tells it: Ctrl-D.
    pub async fn close(&mut self) {
        if let Input::Terminal(terminal) = self {
            let _ = terminal.write_all(&[4]).await;
        } else {
            *self = Input::Closed;
        }
    }

    pub fn resize(&self, window: &pb::WindowSize) {
        if let Input::Terminal(terminal) = self {
            let _ = terminal.resize(size(window));
        }
    }
}

fn size(window: &pb::WindowSize) -> pty_process::Size {
    let clamp = |n: u32| u16::try_from(n.max(1)).unwrap_or(u16::MAX);
    pty_process::Size::new(clamp(window.rows), clamp(window.cols))
}

/// This machine's processes. A command leads its own process group, so a timeout or a cancel
/// reaches everything it started.
pub struct Host;

impl Launcher for Host {
    fn launch(&self, _exec_id: &str, run: &pb::RunExec) -> std::io::Result<Launched> {
        if run.tty { on_terminal(run) } else { on_pipes(run) }
    }

    /// Execs run in the supervisor's own cgroup, the sandbox's.
    fn memory_kills(&self) -> Option<u64> {
        crate::cgroup::oom_kills()
    }
}

fn launched(
    mut child: tokio::process::Child,
    outputs: Vec<(Box<dyn AsyncRead + Send + Unpin>, Stream)>,
    input: Input,
) -> Launched {
    let pid = child.id().and_then(|p| i32::try_from(p).ok());
    let exit = Box::pin(async move {
        let status = child.wait().await?;
        Ok(match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(signal)) => Exit::Signal(signal),
            (None, None) => Exit::Code(1),
        })
    });
    let signal = Box::new(move |signal| {
        if let Some(pid) = pid {
            let _ = killpg(Pid::from_raw(pid), signal);
        }
    });
    Launched { outputs, input, exit, signal }
}

fn on_pipes(run: &pb::RunExec) -> std::io::Result<Launched> {
    let mut command = tokio::process::Command::new(&run.argv[0]);
    command.args(&run.argv[1..]).envs(&run.env);
    for name in var::KEPT_FROM_EXEC {
        command.env_remove(name);
    }
    command
        .stdin(if run.stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if !run.cwd.is_empty() {
        command.current_dir(&run.cwd);
    }
    let mut child = command.spawn()?;
    let mut outputs: Vec<(Box<dyn AsyncRead + Send + Unpin>, Stream)> = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        outputs.push((Box::new(stdout), Stream::Stdout));
    }
    if let Some(stderr) = child.stderr.take() {
        outputs.push((Box::new(stderr), Stream::Stderr));
    }
    let input = child.stdin.take().map_or(Input::Closed, |stdin| Input::Pipe(Box::new(stdin)));
    Ok(launched(child, outputs, input))
}

/// The command on a terminal of its own: it leads a new session (so its process group too),
/// and everything it writes is one stream.
fn on_terminal(run: &pb::RunExec) -> std::io::Result<Launched> {
    let (terminal, pts) = pty_process::open().map_err(std::io::Error::other)?;
    terminal
        .resize(size(&run.window.unwrap_or(pb::WindowSize { rows: 24, cols: 80 })))
        .map_err(std::io::Error::other)?;
    let mut command = pty_process::Command::new(&run.argv[0]).args(&run.argv[1..]).envs(&run.env).kill_on_drop(true);
    for name in var::KEPT_FROM_EXEC {
        command = command.env_remove(name);
    }
    if !run.env.contains_key("TERM") {
        command = command.env("TERM", "xterm");
    }
    if !run.cwd.is_empty() {
        command = command.current_dir(&run.cwd);
    }
    let child = command.spawn(pts).map_err(std::io::Error::other)?;
    let (output, input) = terminal.into_split();
    Ok(launched(child, vec![(Box::new(output), Stream::Tty)], Input::Terminal(input)))
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// An exec's environment is the gateway's message laid over the supervisor's own, but never
    /// with the run's token, its gateway or its generation, even were the message to name them.
    #[tokio::test]
    async fn an_exec_gets_its_message_environment_without_what_the_supervisor_keeps() {
        let env = [("KEPT", "yes"), (var::RUNTIME_TOKEN, "t"), (var::SUPERVISOR_GATEWAY, "g"), (var::GENERATION, "3")];
        let run = pb::RunExec {
            argv: vec!["env".into()],
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        let mut launched = Host.launch("x", &run).unwrap();
        let (mut stdout, _) = launched.outputs.remove(0);
        let mut printed = String::new();
        stdout.read_to_string(&mut printed).await.unwrap();
        assert_eq!(launched.exit.await.unwrap(), Exit::Code(0));
        let names: Vec<&str> = printed.lines().filter_map(|line| line.split_once('=')).map(|(name, _)| name).collect();
        assert!(printed.lines().any(|line| line == "KEPT=yes"), "{printed}");
        for kept in var::KEPT_FROM_EXEC {
            assert!(!names.contains(&kept), "{kept} reached the exec");
        }
    }
}
