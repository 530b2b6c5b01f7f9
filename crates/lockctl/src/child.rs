//! `lockctl run`'s child: a supervisor process that leads CMD's process group and stops it
//! when lockctl dies, the signals lockctl answers, and the terminal hand-over.
//!
//! ```text
//! lockctl ──spawns──▶ lockctl __supervise (group leader, parent-death signal SIGTERM)
//!                          └──spawns──▶ CMD (same group; may start more)
//! ```
//!
//! lockctl stops the group with `killpg` (lease lost, or lockctl got a signal). If lockctl is
//! SIGKILLed instead, the kernel sends the supervisor its parent-death signal; the supervisor
//! then stops the group itself (SIGTERM, 0.5 s, SIGKILL). This needs no `unsafe`: the
//! supervisor sets the parent-death signal on itself (`prctl`) and spawns CMD normally, rather
//! than lockctl running code between fork and exec.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::prctl;
use nix::sys::signal::{killpg, pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::unistd::{getpgrp, getppid, tcgetpgrp, tcsetpgrp, Pid};
use tokio::signal::unix::{signal, SignalKind};

/// The hidden first argument that makes lockctl a supervisor.
const SUPERVISE: &str = "__supervise";
/// How long CMD's group gets between SIGTERM and SIGKILL once lockctl has died.
const ORPHAN_GRACE: Duration = Duration::from_millis(500);

/// The four signals that end lockctl gracefully: SIGTERM (`timeout`, systemd, Kubernetes),
/// SIGHUP (a closed terminal), SIGQUIT and SIGINT (Ctrl-\ and Ctrl-C).
pub struct Signals {
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers: from here on these signals no longer kill lockctl outright.
    pub fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next signal's number.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM as i32,
            _ = self.hup.recv() => Signal::SIGHUP as i32,
            _ = self.quit.recv() => Signal::SIGQUIT as i32,
            _ = self.int.recv() => Signal::SIGINT as i32,
        }
    }
}

/// CMD running under its supervisor, in a process group of its own.
pub struct Child {
    proc: tokio::process::Child,
    pgid: Pid,
    /// The terminal was handed to CMD's group and must be taken back.
    foreground: bool,
}

impl Child {
    /// CMD's process group (the supervisor's pid).
    pub fn pgid(&self) -> Pid {
        self.pgid
    }

    /// Waits for CMD; its exit code, or 128 + N if a signal ended it, as the supervisor saw.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.proc.wait().await
    }

    /// Takes the terminal back from CMD's group, if it was handed over.
    pub fn restore_terminal(&mut self) {
        if std::mem::take(&mut self.foreground) {
            let _ = with_sigttou_blocked(|| tcsetpgrp(std::io::stdin().as_fd(), getpgrp()));
        }
    }
}

/// Spawns CMD under a supervisor in a new process group. Its stdin is `/dev/null` unless
/// `pass_stdin`, which also makes the group the terminal's foreground job when lockctl is.
pub fn spawn(
    command: &[String],
    env: &[(&str, String)],
    pass_stdin: bool,
) -> std::io::Result<Child> {
    let me = std::env::current_exe()?;
    let stdin = std::io::stdin();
    let foreground =
        pass_stdin && stdin.is_terminal() && tcgetpgrp(stdin.as_fd()).is_ok_and(|p| p == getpgrp());
    let mut cmd = tokio::process::Command::new(me);
    cmd.arg(SUPERVISE)
        .arg(std::process::id().to_string())
        .arg(if foreground { "fg" } else { "bg" })
        .arg("--")
        .args(command)
        .envs(env.iter().map(|(k, v)| (k, v)))
        // The namespace's credential is lockctl's, not the command's to read or pass on.
        .env_remove("LOCKD_AUTH_TOKEN")
        .process_group(0)
        .stdin(if pass_stdin {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
    let proc = cmd.spawn()?;
    let pgid = Pid::from_raw(proc.id().map_or(0, |p| p as i32));
    Ok(Child {
        proc,
        pgid,
        foreground,
    })
}

/// Runs `f` with SIGTTOU blocked: a process outside the terminal's foreground group may then
/// change it (the kernel treats a blocked SIGTTOU as consent, as shells rely on).
fn with_sigttou_blocked<T>(f: impl FnOnce() -> T) -> T {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTTOU);
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None);
    let r = f();
    let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
    r
}

/// If lockctl was started as a supervisor (`lockctl __supervise PARENT fg|bg -- CMD…`), runs
/// it and returns its exit code; otherwise `None`.
pub async fn supervisor_main() -> Option<ExitCode> {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_none_or(|a| a != SUPERVISE) {
        return None;
    }
    let parent: i32 = args.get(2)?.to_str()?.parse().ok()?;
    let foreground = args.get(3).is_some_and(|a| a == "fg");
    let cmd = args.get(5..).filter(|c| !c.is_empty())?;
    Some(supervise(parent, foreground, cmd).await)
}

async fn supervise(parent: i32, foreground: bool, cmd: &[OsString]) -> ExitCode {
    // Handlers first, then the death signal, then the check that lockctl is still there: a
    // death after the check is signalled, one before it is seen by the check.
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lockctl: error: supervisor cannot watch signals: {e}");
            return ExitCode::from(125);
        }
    };
    if let Err(e) = prctl::set_pdeathsig(Signal::SIGTERM) {
        eprintln!("lockctl: error: cannot set the parent-death signal: {e}");
        return ExitCode::from(125);
    }
    if getppid().as_raw() != parent {
        return ExitCode::from(125);
    }
    if foreground {
        let _ = with_sigttou_blocked(|| tcsetpgrp(std::io::stdin().as_fd(), getpgrp()));
    }
    let mut child = match tokio::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "lockctl: error: cannot run {}: {e}",
                cmd[0].to_string_lossy()
            );
            return ExitCode::from(127);
        }
    };
    loop {
        tokio::select! {
            st = child.wait() => return ExitCode::from(match st {
                Ok(st) => code_of(st),
                Err(_) => 1,
            }),
            _ = signals.recv() => {
                // lockctl's own killpg reaches CMD as well, so there is nothing to do while
                // lockctl lives; once it is gone, nobody else will stop the group.
                if getppid().as_raw() != parent {
                    let group = getpgrp();
                    let _ = killpg(group, Signal::SIGTERM);
                    let _ = tokio::time::timeout(ORPHAN_GRACE, child.wait()).await;
                    let _ = killpg(group, Signal::SIGKILL);
                }
            }
        }
    }
}

/// 128 + signal for a command a signal ended, like a shell.
pub fn code_of(st: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => 128u8.wrapping_add(s as u8),
        _ => 1,
    }
}
