//! A child process driven by pid: kill, terminate, pause, resume.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A child process, SIGKILLed (by pid) and reaped on drop.
pub struct Proc {
    pub child: Option<Child>,
}

impl Proc {
    /// Starts `program args…` with stdout and stderr appended to `log`.
    pub fn spawn<S: AsRef<OsStr>>(program: &Path, args: &[S], log: &Path) -> std::io::Result<Proc> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        Ok(Proc { child: Some(child) })
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn signal(&self, s: Signal) {
        if self.child.is_some() {
            kill(self.pid(), s).expect("signal a child by pid");
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM (a node's graceful leave), then wait up to `grace` for the exit; panics if the
    /// process is still there, since a node that ignores SIGTERM is a bug.
    pub fn terminate(&mut self, grace: Duration) -> std::process::ExitStatus {
        self.signal(Signal::SIGCONT);
        self.signal(Signal::SIGTERM);
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + grace;
        loop {
            if let Some(st) = child.try_wait().expect("wait for a child") {
                return st;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "pid {} did not exit within {grace:?} of SIGTERM",
                    child.id()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process state letter in /proc/PID/status (`T` = stopped).
    pub fn state(&self) -> char {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("State:"))
            .and_then(|v| v.trim().chars().next())
            .unwrap_or('?')
    }

    /// Sends SIGSTOP and waits until the kernel reports the process stopped.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
        for _ in 0..500 {
            if self.state() == 'T' {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("process {} did not stop", self.pid());
    }

    /// Sends SIGCONT.
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_resume_terminate_by_pid() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Proc::spawn(Path::new("sleep"), &["30"], &dir.path().join("log")).unwrap();
        p.pause();
        assert_eq!(p.state(), 'T');
        p.resume();
        let st = p.terminate(Duration::from_secs(5));
        assert!(!st.success(), "sleep ended by SIGTERM: {st}");
        assert!(!p.is_running());
    }
}
