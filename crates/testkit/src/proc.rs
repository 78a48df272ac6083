//! Child processes owned by a test or a harness, killed (by pid) when dropped.

use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::wait::{Deadline, TimedOut};

/// A running child process; SIGKILLed when dropped (resumed first if it was stopped).
pub struct Proc {
    child: Child,
    stopped: bool,
}

impl Proc {
    /// Spawns `cmd`.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Self> {
        Ok(Self { child: cmd.kill_on_drop(true).spawn()?, stopped: false })
    }

    /// The pid, while the process has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, `KILL`, …) to the process.
    pub fn signal(&mut self, sig: &str) -> std::io::Result<()> {
        if let Some(pid) = self.pid() {
            let status = std::process::Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status()?;
            if !status.success() {
                return Err(std::io::Error::other(format!("kill -{sig} {pid} failed")));
            }
            match sig {
                "STOP" => self.stopped = true,
                "CONT" => self.stopped = false,
                _ => {}
            }
        }
        Ok(())
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Whether it has exited (without waiting).
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// Waits (at most `limit`) for it to exit by itself.
    pub async fn wait_exit(&mut self, limit: Duration) -> Result<ExitStatus, TimedOut> {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => Ok(status),
            _ => Err(TimedOut { what: "the process to exit".into(), after: limit }),
        }
    }

    /// SIGKILL and reap.
    pub async fn kill(&mut self) {
        if self.stopped {
            let _ = self.signal("CONT");
        }
        let _ = self.child.kill().await;
    }

    /// Waits until `probe` returns `Some` (e.g. it listens) or the process has exited.
    pub async fn wait_ready<T, F, Fut>(
        &mut self,
        limit: Duration,
        what: &str,
        mut probe: F,
    ) -> Result<Ready<T>, TimedOut>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let mut deadline = Deadline::after(limit, what);
        loop {
            if let Some(v) = probe().await {
                return Ok(Ready::Up(v));
            }
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return Ok(Ready::Exited);
            }
            deadline.next_poll().await?;
        }
    }
}

/// What [`Proc::wait_ready`] saw.
pub enum Ready<T> {
    Up(T),
    Exited,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.stopped {
            let _ = self.signal("CONT");
        }
        let _ = self.child.start_kill();
    }
}
