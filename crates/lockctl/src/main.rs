//! `lockctl`: the lockd command line.
//!
//! ```text
//! lockctl status
//! lockctl inspect payouts/merchant-48213
//! lockctl acquire payouts/merchant-48213 --wait 10s        # holds until Ctrl-C
//! lockctl release payouts/merchant-48213 --session s_… --token 7340291
//! lockctl run nightly-report --wait 1m -- ./build-report.sh --full
//! ```
//!
//! Exit codes: 0 success; 1 an error (printed, never a stack trace); 2 bad usage;
//! 69 the cluster could not be reached (no endpoint answered; they are named); 75 not acquired (held, or the wait ran out; `--conflict-exit-code`); 76 the lease was lost
//! (`--lost-exit-code`); 128 + N when lockctl itself got signal N (SIGTERM, SIGHUP, SIGQUIT,
//! SIGINT: CMD's process group is stopped and the lock released first). `run` otherwise exits
//! with CMD's own code (128 + N when a signal N ended it).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use lockd_client::{admin, host_pid, Client, ClientOptions, Error, LockGuard, Mode};
use nix::sys::signal::{killpg, Signal};
use serde_json::{json, Value};
use tokio::time::Instant;

mod child;
mod duration;

use child::Signals;
use duration::{parse_duration, parse_wait};

/// No endpoint answered (sysexits' EX_UNAVAILABLE): a script can tell "the cluster is down or
/// the address is wrong" from "the command failed" (1).
const EXIT_UNREACHABLE: u8 = 69;
/// The lock was not acquired (held by another, or the wait ran out).
const EXIT_NOT_ACQUIRED: u8 = 75;
/// The lease was lost while holding the lock.
const EXIT_LOST: u8 = 76;
/// How long CMD gets between SIGTERM and SIGKILL once the lease is lost: the lease is gone,
/// so this is short whatever `--kill-grace` says.
const LOST_GRACE: Duration = Duration::from_millis(500);

#[derive(Parser, Clone)]
#[command(
    name = "lockctl",
    version,
    about = "Talk to a lockd cluster",
    after_help = "Exit codes: 0 success; 1 the command failed; 2 bad usage; 69 no endpoint \
                  answered; 75 not acquired; 76 the lease was lost; 128+N a signal N. `run` \
                  otherwise exits with its command's code."
)]
struct Cli {
    /// gRPC addresses of some nodes, comma-separated.
    #[arg(
        long,
        env = "LOCKD_ENDPOINTS",
        default_value = "127.0.0.1:7170",
        global = true
    )]
    endpoints: String,
    /// The namespace to open the session in; a session takes only its namespace's names.
    /// Empty: `acquire` and `run` use the namespace NAME falls into.
    #[arg(long, env = "LOCKD_NAMESPACE", default_value = "", global = true)]
    namespace: String,
    /// Bearer token for namespaces that require one. On the command line it shows in `ps` to
    /// every user of the machine: prefer LOCKD_AUTH_TOKEN or --auth-token-file.
    #[arg(long, env = "LOCKD_AUTH_TOKEN", global = true, hide_env_values = true)]
    auth_token: Option<String>,
    /// A file holding the bearer token (its first line), instead of --auth-token.
    #[arg(
        long,
        env = "LOCKD_AUTH_TOKEN_FILE",
        global = true,
        conflicts_with = "auth_token"
    )]
    auth_token_file: Option<std::path::PathBuf>,
    /// A file holding the admin token (for `sessions` and other holders' session ids; it also
    /// opens every namespace). `lockd dev` prints where its file is.
    #[arg(long, env = "LOCKD_ADMIN_TOKEN_FILE", global = true)]
    admin_token_file: Option<std::path::PathBuf>,
    /// The admin token read from `--admin-token-file`.
    #[arg(skip)]
    admin_token: Option<String>,
    /// Speak TLS to the nodes, trusting this CA (PEM); endpoints without a scheme are then
    /// `https://`. `lockd dev --tls` prints where its CA is.
    #[arg(long, env = "LOCKD_CA_FILE", global = true)]
    ca_file: Option<std::path::PathBuf>,
    /// A client certificate (PEM) for clusters that require one; with --key-file.
    #[arg(long, env = "LOCKD_CERT_FILE", global = true, requires = "key_file")]
    cert_file: Option<std::path::PathBuf>,
    /// The private key (PEM) of --cert-file.
    #[arg(long, env = "LOCKD_KEY_FILE", global = true, requires = "cert_file")]
    key_file: Option<std::path::PathBuf>,
    /// The TLS settings read from the files above.
    #[arg(skip)]
    tls: Option<lockd_client::TlsOptions>,
    /// Machine-readable output (one JSON object per line).
    #[arg(long, global = true)]
    json: bool,
    /// How long to try to reach a node before giving up (e.g. 5s).
    #[arg(long, global = true, default_value = "5s", value_parser = parse_duration)]
    connect_timeout: Duration,
    /// How long one request may take before its node counts as unreachable (e.g. 2s).
    #[arg(long, global = true, default_value = "2s", value_parser = parse_duration)]
    request_timeout: Duration,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Clone)]
enum MembersCmd {
    /// Every group's members: peer address, role, leader, lag (entries behind the leader).
    List,
    /// Add node ID (started with `lockd serve --initial-cluster-state existing`) to groups: a
    /// learner first, a voter once it has caught up. Idempotent.
    Add {
        node_id: u64,
        /// The new node's peer address (its `--peer`), IP:PORT.
        peer_addr: String,
        /// Only these groups (comma-separated ids); default every group.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<u32>,
        /// Add it even if a zone would then hold a majority of a group's voters.
        #[arg(long)]
        allow_zone_majority: bool,
    },
    /// Remove node ID from groups (a leader hands its groups over first). Idempotent.
    Remove {
        node_id: u64,
        #[arg(long, value_delimiter = ',')]
        groups: Vec<u32>,
        /// Remove it even if a zone would then hold a majority of a group's voters.
        #[arg(long)]
        allow_zone_majority: bool,
    },
    /// Mark node ID draining: leader balancing hands it no group and the groups it leads move
    /// to other voters (waits up to 20 s for that). It stays a voter and keeps serving; use it
    /// before maintenance or removal. Idempotent.
    Drain { node_id: u64 },
    /// Clear node ID's draining mark: leader balancing may hand it groups again.
    Undrain { node_id: u64 },
    /// Replace a node (e.g. one whose disk died) by a new node id: add NEW first, then remove
    /// OLD, group by group, so no group is ever short of a replica. Without --groups: every
    /// group OLD is a member of. Node ids are never reused.
    Replace {
        old_id: u64,
        new_id: u64,
        /// The new node's peer address, IP:PORT.
        peer_addr: String,
        #[arg(long, value_delimiter = ',')]
        groups: Vec<u32>,
        /// Replace even if a zone would hold a majority of a group's voters (a new node in
        /// another zone than the old one's).
        #[arg(long)]
        allow_zone_majority: bool,
    },
}

#[derive(Subcommand, Clone)]
enum BucketsCmd {
    /// The shard map: each lock group's buckets, and what it owns and has frozen for a move.
    Show,
    /// Move BUCKETS (e.g. 0-63,100) to a lock group while their locks are in use. Holders keep
    /// their tokens; waiters queue again at the new group. Finishes an interrupted move first;
    /// buckets already there are skipped, so running it again is safe.
    Move {
        buckets: String,
        /// The lock group to move them to.
        #[arg(long)]
        to: u32,
    },
}

#[derive(Subcommand, Clone)]
enum SnapshotCmd {
    /// Write a backup to FILE (mode 0600, replaced atomically): every lock group's revision,
    /// read linearizably from its leader, and the namespaces. `lockd restore FILE --data-dir D`
    /// seeds a new cluster from it with every revision raised above the backup's.
    Save { file: std::path::PathBuf },
}

#[derive(Subcommand, Clone)]
enum GroupsCmd {
    /// Every lock group: the nodes it was placed on, its birth epoch, whether it is ready.
    List,
    /// Create lock group ID on running nodes (each already in the meta group, group 0), and
    /// wait until it is ready. It owns no bucket until `lockctl buckets move` sends it some.
    /// Running it again is safe, and finishes a creation left half done.
    Create {
        id: u32,
        /// The node ids to place it on (3 or 5 survive a failure), e.g. 4,5,6.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<u64>,
        /// Create it even if a zone would hold a majority of its voters.
        #[arg(long)]
        allow_zone_majority: bool,
    },
    /// Remove lock group ID, which must own no bucket (`lockctl buckets move` its buckets to
    /// other groups first). Its nodes stop hosting it, and its id is never used again.
    /// Running it again is safe.
    Remove { id: u32 },
}

#[derive(Subcommand, Clone)]
enum NamespaceCmd {
    /// Every namespace with its limits, and the namespaces' version.
    List,
    /// One namespace's settings.
    Get { name: String },
    /// Create a namespace, or change one: settings not given keep their current value (a new
    /// namespace takes the built-in defaults). Applied only if nobody changed the namespaces
    /// since they were read (at --expected-version, else at the version read just before).
    Put {
        name: String,
        /// Names starting with this belong here; must end with '/' (required for a new one).
        #[arg(long)]
        prefix: Option<String>,
        #[arg(long, value_parser = parse_duration)]
        min_ttl: Option<Duration>,
        #[arg(long, value_parser = parse_duration)]
        max_ttl: Option<Duration>,
        #[arg(long, value_parser = parse_duration)]
        default_ttl: Option<Duration>,
        /// Waiters one name may queue.
        #[arg(long)]
        max_waiters: Option<u32>,
        /// Locks held plus waits queued by one session.
        #[arg(long)]
        max_locks: Option<u32>,
        /// How long a name stays ungranted after its holder failed (e.g. 10s; 0s for none).
        #[arg(long, value_parser = parse_duration)]
        lock_delay: Option<Duration>,
        /// Requests per second each node accepts for the namespace's names (0 = unlimited).
        #[arg(long)]
        ops_per_s: Option<u32>,
        /// Live sessions the namespace may hold at once, cluster-wide (0 = unlimited: only the
        /// cluster's 250,000). Lowering it ends no session; opens fail until below it.
        #[arg(long)]
        max_sessions: Option<u32>,
        /// `efficiency` or `correctness` (which needs --fenced-resource).
        #[arg(long, value_parser = ["efficiency", "correctness"])]
        safety: Option<String>,
        /// The resource that checks fencing tokens, and how.
        #[arg(long)]
        fenced_resource: Option<String>,
        /// A file holding the bearer token callers must present from now on (rotation: the
        /// old token stops working once the change is applied).
        #[arg(long, conflicts_with = "clear_token")]
        token_file: Option<std::path::PathBuf>,
        /// Open the namespace: no token from now on.
        #[arg(long)]
        clear_token: bool,
        /// Apply only if the namespaces are still at this version (from `namespace list`).
        #[arg(long)]
        expected_version: Option<u64>,
    },
    /// Delete a namespace (not `default`): its names fall into the longest other prefix that
    /// matches them.
    Delete {
        name: String,
        #[arg(long)]
        expected_version: Option<u64>,
    },
}

#[derive(Subcommand, Clone)]
enum Cmd {
    /// Every node's groups: leader, term, members, applied index, revision. With --cluster,
    /// one node gathers every member node's own report over the peer port (version, ready,
    /// uptime, each replica's role, term, commit and applied index, bytes on disk; an error for
    /// a node that does not answer): needs --admin-token-file. Exits 1 if a node did not
    /// answer or is not ready.
    Status {
        #[arg(long)]
        cluster: bool,
    },
    /// Holders, token and queue of a lock.
    Inspect { name: String },
    /// Print every change of a lock (with --prefix: of every name under TARGET) as it happens,
    /// one line each, until a signal or --count changes. Survives a node restart or failover:
    /// it resumes where it was, with no change missed or repeated.
    Watch {
        target: String,
        /// TARGET is a prefix: watch every name that starts with it.
        #[arg(long)]
        prefix: bool,
        /// Stop after this many changes.
        #[arg(long)]
        count: Option<u64>,
    },
    /// The hottest names: the top names by waiters, longest wait, hand-offs per second and
    /// longest hold, with each name's estimated wait. Every namespace the token may read, or
    /// --namespace. Prints once, or with --every until a signal (or --count reports).
    Top {
        /// Names per list (1..=100).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
        top: u32,
        /// Only this namespace's names.
        #[arg(long, default_value = "")]
        namespace: String,
        /// Refresh at this interval (e.g. 2s) until a signal.
        #[arg(long, value_parser = parse_duration)]
        every: Option<Duration>,
        /// With --every: stop after this many reports.
        #[arg(long, requires = "every")]
        count: Option<u64>,
    },
    /// Take a lock and hold it until a signal (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT), printing the
    /// token; the lock is released before lockctl exits.
    Acquire {
        name: String,
        #[command(flatten)]
        hold: HoldArgs,
    },
    /// Group members: list them, add, remove or replace a node (needs --admin-token-file).
    Members {
        #[command(subcommand)]
        cmd: MembersCmd,
    },
    /// Buckets: show the shard map, or move buckets between lock groups (needs
    /// --admin-token-file).
    Buckets {
        #[command(subcommand)]
        cmd: BucketsCmd,
    },
    /// Lock groups: list them, or create one on running nodes (needs --admin-token-file).
    Groups {
        #[command(subcommand)]
        cmd: GroupsCmd,
    },
    /// Backups that keep fencing safe: `snapshot save FILE` (needs --admin-token-file).
    Snapshot {
        #[command(subcommand)]
        cmd: SnapshotCmd,
    },
    /// Namespaces, the cluster's one copy: list, get, put (create or change), delete (needs
    /// --admin-token-file). A node's config file only seeds a brand-new cluster.
    Namespace {
        #[command(subcommand)]
        cmd: NamespaceCmd,
    },
    /// List live sessions (a page), or show one session's holds and waits.
    Sessions {
        /// Show this session in detail.
        #[arg(long)]
        session: Option<String>,
        /// List sessions with ids after this one.
        #[arg(long, default_value = "")]
        after: String,
        /// At most this many (1..=1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Release a hold given its session and token (e.g. one a crashed script left).
    Release {
        name: String,
        #[arg(long)]
        session: String,
        #[arg(long)]
        token: u64,
    },
    /// Run CMD while holding the lock; stop it if the lease is lost or lockctl is signalled.
    ///
    /// CMD runs in its own process group with LOCKD_TOKEN (the fencing token) and LOCKD_LOCK
    /// set, LOCKD_AUTH_TOKEN removed, and stdin from /dev/null (see --pass-stdin). If the lease's local deadline passes
    /// without a renewal, the group gets SIGTERM and, 0.5 s later, SIGKILL. If lockctl gets
    /// SIGTERM, SIGHUP, SIGQUIT or SIGINT, the group gets SIGTERM, then SIGKILL after
    /// --kill-grace; the lock is released and lockctl exits 128 + N. If lockctl is killed
    /// outright, a small supervisor in CMD's group stops the group within 0.5 s.
    Run {
        name: String,
        #[command(flatten)]
        hold: HoldArgs,
        /// How long CMD's group gets between SIGTERM and SIGKILL when lockctl is signalled.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        kill_grace: Duration,
        /// Give CMD lockctl's stdin and make it the terminal's foreground job (interactive
        /// commands); without it CMD reads /dev/null.
        #[arg(long)]
        pass_stdin: bool,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Leader election on NAME: campaign with VALUE (what observers see as the leader), then
    /// lead until a signal, or run CMD while leading (`run NAME --wait forever --owner VALUE
    /// -- CMD`, with its exit codes). With --listen: print the leader now and at every change.
    Elect {
        name: String,
        /// What this candidate announces as the leader, e.g. "node-7 10.0.0.7:9000".
        #[arg(required_unless_present = "listen")]
        value: Option<String>,
        /// Follow the election instead of standing in it.
        #[arg(long, conflicts_with = "value")]
        listen: bool,
        /// Session TTL (within the namespace's bounds).
        #[arg(long, value_parser = parse_duration, default_value = "15s")]
        ttl: Duration,
        /// How long CMD's group gets between SIGTERM and SIGKILL when lockctl is signalled.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        kill_grace: Duration,
        /// The command to run while leading, and its arguments.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Print lockctl's man page (roff) on stdout.
    Man,
}

#[derive(Args, Clone)]
struct HoldArgs {
    /// Wait this long for the lock (e.g. 500ms, 10s, 1m30s, 2h, or forever); default: try once.
    #[arg(long, value_parser = parse_wait)]
    wait: Option<Duration>,
    /// exclusive, shared, or semaphore:N.
    #[arg(long, default_value = "exclusive", value_parser = parse_mode)]
    mode: Mode,
    /// Session TTL (within the namespace's bounds).
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    ttl: Duration,
    /// Owner string shown to others (default: HOST/PID).
    #[arg(long)]
    owner: Option<String>,
    /// Exit code when the lock is not acquired (pick one CMD never uses).
    #[arg(long, default_value_t = EXIT_NOT_ACQUIRED)]
    conflict_exit_code: u8,
    /// Exit code when the lease is lost while holding.
    #[arg(long, default_value_t = EXIT_LOST)]
    lost_exit_code: u8,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "exclusive" => Ok(Mode::Exclusive),
        "shared" => Ok(Mode::Shared),
        _ => s
            .strip_prefix("semaphore:")
            .and_then(|n| n.parse().ok())
            .map(Mode::Semaphore)
            .ok_or_else(|| format!("'{s}': mode is exclusive, shared or semaphore:N")),
    }
}

/// What a command ends with: an exit code, or an error to print.
enum Fail {
    Error(Error),
    Code(u8),
    /// Something on this machine failed (a file could not be written): exit 1 with the message.
    Local(String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Error(e)
    }
}

/// A watch event as `--json` prints it: the fields that apply to its kind.
fn watch_json(e: &lockd_client::WatchEvent) -> Value {
    let mut v = json!({"group": e.group, "index": e.index, "time_ms": e.time_ms,
        "unix_ms": e.unix_ms, "kind": e.kind, "name": e.name});
    let o = v.as_object_mut().expect("an object");
    let nonzero = [
        ("fencing_token", e.fencing_token),
        ("waiter", e.waiter),
        ("position", u64::from(e.position)),
        ("deadline_ms", e.deadline_ms),
        ("waited_ms", e.waited_ms),
        ("held_ms", e.held_ms),
        ("lock_delay_until_ms", e.lock_delay_until_ms),
        ("lease_ttl_ms", e.lease_ttl_ms),
        ("limit", u64::from(e.limit)),
    ];
    for (k, x) in nonzero {
        if x != 0 {
            o.insert(k.into(), json!(x));
        }
    }
    for (k, x) in [
        ("session_id", &e.session_id),
        ("owner", &e.owner),
        ("cause", &e.cause),
    ] {
        if !x.is_empty() {
            o.insert(k.into(), json!(x));
        }
    }
    v
}

/// Unix milliseconds as UTC, `2026-12-07T06:55:01.123Z` (days to a civil date: Howard
/// Hinnant's algorithm).
fn utc(unix_ms: u64) -> String {
    let (days, ms) = (unix_ms / 86_400_000, unix_ms % 86_400_000);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, min, sec, milli) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{sec:02}.{milli:03}Z")
}

fn watch_human(e: &lockd_client::WatchEvent) -> String {
    // An older node sends no wall-clock time (0): then the line starts with the kind.
    let at = if e.unix_ms == 0 {
        String::new()
    } else {
        utc(e.unix_ms) + " "
    };
    let mut line = format!(
        "{at}{} {} (group {} index {})",
        e.kind, e.name, e.group, e.index
    );
    if e.fencing_token != 0 {
        line += &format!(" token {}", e.fencing_token);
    }
    if !e.owner.is_empty() {
        line += &format!(" owner {}", e.owner);
    }
    if !e.cause.is_empty() {
        line += &format!(" cause {}", e.cause);
    }
    if e.kind == "wait_started" {
        line += &format!(" position {}", e.position);
    }
    line
}

struct Out {
    json: bool,
}

impl Out {
    /// A result: JSON object or human lines, on stdout.
    ///
    /// A reader that went away (`lockctl status | head -3`) is not an error: what it did not
    /// read is dropped, and lockctl goes on (under `run` it still stops CMD and releases).
    fn print(&self, v: Value, human: impl FnOnce() -> String) {
        use std::io::Write as _;
        let line = if self.json { v.to_string() } else { human() };
        let _ = writeln!(std::io::stdout(), "{line}");
    }

    /// A notice on stderr (stdout belongs to CMD under `run`).
    fn note(&self, v: Value, human: impl FnOnce() -> String) {
        if self.json {
            eprintln!("{v}");
        } else {
            eprintln!("lockctl: {}", human());
        }
    }
}

/// A hint for a closed connection, from what this lockctl was told to speak: a node that
/// requires client certificates refuses one without after a TLS 1.3 handshake the client
/// already thinks complete, and a TLS port drops plain text, so in both cases all the client
/// sees is a connection that broke. Empty when the error already carries a hint, or does not
/// fit.
fn certificate_hint(cli: &Cli, why: &str) -> &'static str {
    let lower = why.to_lowercase();
    let closed = ["connection closed", "broken pipe", "connection reset"]
        .iter()
        .any(|s| lower.contains(s));
    if !closed || why.contains("--cert-file") || why.contains("https://") {
        return "";
    }
    let https = endpoints(cli).iter().any(|e| e.starts_with("https://"));
    match &cli.tls {
        Some(t) if t.identity.is_none() => {
            " (the nodes closed the TLS connection: if they require client certificates, give \
             one with --cert-file and --key-file)"
        }
        None if !https => {
            " (the nodes closed the connection: if they serve TLS, use an https:// endpoint \
             and their CA, --ca-file)"
        }
        _ => "",
    }
}

/// The first line of a token file (`what`: "token", "admin token"), or why it cannot be used.
fn read_token_file(path: &std::path::Path, what: &str) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_string()),
        Ok(_) => Err(format!("the {what} file {} is empty", path.display())),
        Err(e) => Err(format!("reading the {what} file {}: {e}", path.display())),
    }
}

// One thread: the parent-death signal of `run`'s supervisor is tied to the thread that spawned
// it, which must live as long as lockctl.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    if let Some(code) = child::supervisor_main().await {
        return code;
    }
    let mut cli = Cli::parse();
    let out = Out { json: cli.json };
    for (file, what) in [
        (&cli.auth_token_file, "token"),
        (&cli.admin_token_file, "admin token"),
    ] {
        let Some(path) = file else { continue };
        match read_token_file(path, what) {
            Ok(t) if what == "token" => cli.auth_token = Some(t),
            Ok(t) => cli.admin_token = Some(t),
            Err(e) => {
                eprintln!("lockctl: error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    match tls_options(&cli) {
        Ok(tls) => cli.tls = tls,
        Err(e) => {
            eprintln!("lockctl: error: {e}");
            return ExitCode::from(2);
        }
    }
    let conflict = match &cli.cmd {
        Cmd::Acquire { hold, .. } | Cmd::Run { hold, .. } => hold.conflict_exit_code,
        _ => EXIT_NOT_ACQUIRED,
    };
    match run(&cli, &out).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail::Code(c)) => ExitCode::from(c),
        Err(Fail::Local(m)) => {
            out.note(json!({"error": {"code": "local", "message": m}}), || {
                format!("error: {m}")
            });
            ExitCode::from(1)
        }
        Err(Fail::Error(e)) => {
            let (code, message) = match &e {
                Error::NotAcquired { .. } => (conflict, e.to_string()),
                Error::Unavailable(why) => (
                    EXIT_UNREACHABLE,
                    format!(
                        "no endpoint answered (tried {}): {why}{}",
                        endpoints(&cli).join(", "),
                        certificate_hint(&cli, why)
                    ),
                ),
                _ => (1, e.to_string()),
            };
            out.note(
                json!({"error": {"code": e.code(), "message": message}}),
                || format!("error: {message}"),
            );
            ExitCode::from(code)
        }
    }
}

/// The TLS options of `--ca-file`, `--cert-file` and `--key-file` (none of them: plain text,
/// unless an endpoint says `https://`).
fn tls_options(cli: &Cli) -> Result<Option<lockd_client::TlsOptions>, String> {
    let read = |p: &std::path::Path, what: &str| {
        std::fs::read(p).map_err(|e| format!("reading the {what} {}: {e}", p.display()))
    };
    if cli.ca_file.is_none() && cli.cert_file.is_none() {
        return Ok(None);
    }
    let identity = match (&cli.cert_file, &cli.key_file) {
        (Some(c), Some(k)) => Some((read(c, "certificate")?, read(k, "key")?)),
        _ => None,
    };
    Ok(Some(lockd_client::TlsOptions {
        ca_pem: cli.ca_file.as_deref().map(|p| read(p, "CA")).transpose()?,
        identity,
        domain: None,
    }))
}

fn endpoints(cli: &Cli) -> Vec<String> {
    cli.endpoints
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn options(cli: &Cli, ttl: Duration) -> ClientOptions {
    ClientOptions {
        client_name: host_pid(),
        ttl,
        namespace: cli.namespace.clone(),
        // The admin token opens every namespace too.
        auth_token: cli.admin_token.clone().or_else(|| cli.auth_token.clone()),
        request_timeout: cli.request_timeout,
        tls: cli.tls.clone(),
        ..Default::default()
    }
}

async fn run(cli: &Cli, out: &Out) -> Result<(), Fail> {
    match &cli.cmd {
        Cmd::Status { cluster: false } => status(cli, out).await,
        Cmd::Status { cluster: true } => cluster_status(cli, out).await,
        Cmd::Top {
            top,
            namespace,
            every,
            count,
        } => {
            let mut signals = Signals::new().map_err(no_signals)?;
            let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
            let mut shown = 0u64;
            loop {
                let t = c.contention(*top, namespace).await?;
                shown += 1;
                out.print(top_json(&t), || top_human(&t));
                let Some(every) = every else { return Ok(()) };
                if count.is_some_and(|n| shown >= n) {
                    return Ok(());
                }
                tokio::select! {
                    _ = tokio::time::sleep(*every) => {}
                    n = signals.recv() => return Err(Fail::Code(128 + n as u8)),
                }
            }
        }
        Cmd::Inspect { name } => {
            let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
            let s = c.inspect(name).await?;
            out.print(lock_json(&s), || lock_human(&s));
            Ok(())
        }
        Cmd::Watch {
            target,
            prefix,
            count,
        } => {
            let mut signals = Signals::new().map_err(no_signals)?;
            let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
            let mut w = if *prefix {
                c.watch_prefix(target)
            } else {
                c.watch(target)
            };
            let mut seen = 0u64;
            while count.is_none_or(|n| seen < n) {
                let e = tokio::select! {
                    e = w.next() => e?,
                    n = signals.recv() => return Err(Fail::Code(128 + n as u8)),
                };
                seen += 1;
                out.print(watch_json(&e), || watch_human(&e));
            }
            Ok(())
        }
        Cmd::Elect {
            name, listen: true, ..
        } => {
            let mut signals = Signals::new().map_err(no_signals)?;
            let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
            let mut leaders = c.election(name.as_str()).leaders();
            loop {
                let l = tokio::select! {
                    l = leaders.next() => l?,
                    n = signals.recv() => return Err(Fail::Code(128 + n as u8)),
                };
                let v = match &l {
                    Some(l) => json!({"name": name, "leader": l.value, "token": l.token}),
                    None => json!({"name": name, "leader": null}),
                };
                out.print(v, || match &l {
                    Some(l) => format!("{name}: {} leads (token {})", l.value, l.token),
                    None => format!("{name}: nobody leads"),
                });
            }
        }
        Cmd::Elect {
            name,
            value,
            ttl,
            kill_grace,
            command,
            ..
        } => {
            // Standing: the same as holding NAME with VALUE as owner, waiting without end.
            let hold = HoldArgs {
                wait: Some(Duration::MAX),
                mode: Mode::Exclusive,
                ttl: *ttl,
                owner: value.clone(),
                conflict_exit_code: EXIT_NOT_ACQUIRED,
                lost_exit_code: EXIT_LOST,
            };
            let mut as_hold = cli.clone();
            as_hold.cmd = if command.is_empty() {
                Cmd::Acquire {
                    name: name.clone(),
                    hold,
                }
            } else {
                Cmd::Run {
                    name: name.clone(),
                    hold,
                    kill_grace: *kill_grace,
                    pass_stdin: false,
                    command: command.clone(),
                }
            };
            Box::pin(run(&as_hold, out)).await
        }
        Cmd::Members { cmd } => members(cli, out, cmd).await,
        Cmd::Buckets { cmd } => buckets(cli, out, cmd).await,
        Cmd::Groups { cmd } => groups(cli, out, cmd).await,
        Cmd::Snapshot {
            cmd: SnapshotCmd::Save { file },
        } => snapshot_save(cli, out, file).await,
        Cmd::Namespace { cmd } => namespace(cli, out, cmd).await,
        Cmd::Sessions {
            session,
            after,
            limit,
        } => {
            let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
            match session {
                Some(id) => {
                    let d = c.get_session(id).await?;
                    let held: Vec<Value> = d
                        .held
                        .iter()
                        .map(
                            |h| json!({"name": h.name, "token": h.fencing_token, "group": h.group}),
                        )
                        .collect();
                    let waits: Vec<Value> = d.waits.iter().map(|w| json!({"name": w.name, "queue_position": w.queue_position, "group": w.group})).collect();
                    out.print(
                        json!({"session_id": d.session_id, "client": d.client, "ttl_ms": d.ttl_ms, "held": held, "waits": waits, "unavailable_groups": d.unavailable_groups}),
                        || {
                            let mut t = format!("session {} ({}), ttl {} ms", d.session_id, d.client, d.ttl_ms);
                            for h in &d.held {
                                t.push_str(&format!("\n  holds {} token {} (group {})", h.name, h.fencing_token, h.group));
                            }
                            for w in &d.waits {
                                t.push_str(&format!("\n  waits {} at position {} (group {})", w.name, w.queue_position, w.group));
                            }
                            for g in &d.unavailable_groups {
                                t.push_str(&format!("\n  group {g} did not answer: its holds and waits are not shown"));
                            }
                            t
                        },
                    );
                }
                None => {
                    let page = c.list_sessions(after, *limit).await?;
                    let rows: Vec<Value> = page.iter().map(|s| json!({"session_id": s.session_id, "client": s.client, "ttl_ms": s.ttl_ms, "held": s.held, "waits": s.waits})).collect();
                    out.print(json!({"sessions": rows}), || {
                        let mut t =
                            String::from("session              ttl_ms  held  waits  client");
                        for s in &page {
                            t.push_str(&format!(
                                "\n{:<20} {:>6} {:>5} {:>6}  {}",
                                s.session_id, s.ttl_ms, s.held, s.waits, s.client
                            ));
                        }
                        t
                    });
                }
            }
            Ok(())
        }
        Cmd::Release {
            name,
            session,
            token,
        } => {
            let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
            let remaining = c.release_token(session, name, *token).await?;
            out.print(
                json!({"released": remaining == 0, "remaining": remaining}),
                || {
                    if remaining == 0 {
                        format!("released {name}")
                    } else {
                        format!("released one hold of {name}; {remaining} re-entries remain")
                    }
                },
            );
            Ok(())
        }
        Cmd::Acquire { name, hold } => {
            let mut signals = Signals::new().map_err(no_signals)?;
            let (client, guard) = take(cli, out, name, hold, &mut signals).await?;
            out.print(
                json!({"acquired": true, "name": name, "token": guard.token(), "session": guard.session_id()}),
                || {
                    format!(
                        "acquired {name}\ntoken   {}\nsession {}\nholding until Ctrl-C",
                        guard.token(),
                        guard.session_id()
                    )
                },
            );
            let signal = tokio::select! {
                _ = guard.lost() => {
                    out.note(json!({"event": "lost", "name": name, "token": guard.token()}),
                        || format!("the lease on {name} was lost (token {})", guard.token()));
                    return Err(Fail::Code(hold.lost_exit_code));
                }
                n = signals.recv() => n,
            };
            guard.release().await?;
            client.close().await?;
            out.note(
                json!({"event": "released", "name": name, "signal": signal}),
                || format!("released {name}"),
            );
            Err(Fail::Code(128 + signal as u8))
        }
        Cmd::Run {
            name,
            hold,
            kill_grace,
            pass_stdin,
            command,
        } => {
            let how = RunHow {
                kill_grace: *kill_grace,
                pass_stdin: *pass_stdin,
            };
            run_command(cli, out, name, hold, &how, command).await
        }
        Cmd::Completions { shell } => {
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "lockctl",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Cmd::Man => {
            clap_mangen::Man::new(Cli::command())
                .render(&mut std::io::stdout())
                .map_err(|e| {
                    eprintln!("lockctl: error: writing the man page: {e}");
                    Fail::Code(1)
                })?;
            Ok(())
        }
    }
}

fn no_signals(e: std::io::Error) -> Fail {
    eprintln!("lockctl: error: cannot watch signals: {e}");
    Fail::Code(1)
}

/// Connect and take the lock. A signal meanwhile closes the session (which also leaves the
/// lock's queue) and ends lockctl with 128 + N.
async fn take(
    cli: &Cli,
    out: &Out,
    name: &str,
    hold: &HoldArgs,
    signals: &mut Signals,
) -> Result<(Client, LockGuard), Fail> {
    let connect = async {
        let mut opts = options(cli, hold.ttl);
        if opts.namespace.is_empty() {
            // A session takes only its own namespace's names: open it in NAME's.
            let probe = Client::lazy(endpoints(cli), options(cli, hold.ttl))?;
            opts.namespace = probe.inspect(name).await?.namespace;
        }
        Client::connect_with(endpoints(cli), opts).await
    };
    let client = tokio::select! {
        r = tokio::time::timeout(cli.connect_timeout, connect) => r.map_err(|_| {
            Error::Unavailable(format!(
                "no node answered within --connect-timeout {:?}",
                cli.connect_timeout
            ))
        })??,
        n = signals.recv() => return Err(Fail::Code(128 + n as u8)),
    };
    let mut b = client.acquire(name).mode(hold.mode);
    if let Some(o) = &hold.owner {
        b = b.owner(o);
    }
    if let Some(w) = hold.wait {
        b = b.wait(w);
    }
    let owner = hold
        .owner
        .clone()
        .unwrap_or_else(|| client.options().client_name.clone());
    let progress = async {
        match hold.wait {
            Some(_) => report_waiting(&client, name, &owner, out).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        never = progress => match never {},
        r = b => match r {
            Ok(guard) => Ok((client, guard)),
            Err(e) => {
                let _ = client.close().await;
                Err(e.into())
            }
        },
        n = signals.recv() => {
            let _ = client.close().await;
            Err(Fail::Code(128 + n as u8))
        }
    }
}

/// While an acquire waits: after a second, and again whenever it changes, who holds NAME and
/// where this acquire stands in its queue, on stderr (`{"event": "waiting", ...}` with `--json`).
/// It reads the lock every 2 s for the operator's eyes; the grant itself is pushed, not polled.
async fn report_waiting(
    client: &Client,
    name: &str,
    owner: &str,
    out: &Out,
) -> std::convert::Infallible {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut last = None;
    loop {
        if let Ok(s) = client.inspect(name).await {
            let holders: Vec<(String, u64)> = s
                .holders
                .iter()
                .map(|h| (h.owner.clone(), h.fencing_token))
                .collect();
            let position = s
                .waiters
                .iter()
                .find(|w| w.owner == owner)
                .map(|w| w.position);
            let seen = (holders.clone(), position, s.waiters.len());
            if last.as_ref() != Some(&seen) {
                let held: Vec<Value> = holders
                    .iter()
                    .map(|(o, t)| json!({"owner": o, "token": t}))
                    .collect();
                out.note(
                    json!({"event": "waiting", "name": name, "position": position,
                           "queue_length": s.waiters.len(), "holders": held}),
                    || {
                        let by = if holders.is_empty() {
                            "free (a lock-delay or the queue's head goes first)".to_string()
                        } else {
                            let names: Vec<String> = holders
                                .iter()
                                .map(|(o, t)| format!("{o} (token {t})"))
                                .collect();
                            format!("held by {}", names.join(", "))
                        };
                        let at = position.map_or("not in the queue yet".to_string(), |p| {
                            format!("queued at position {p} of {}", s.waiters.len())
                        });
                        format!("waiting for {name}: {by}; {at}")
                    },
                );
                last = Some(seen);
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn members(cli: &Cli, out: &Out, cmd: &MembersCmd) -> Result<(), Fail> {
    let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
    let r = match cmd {
        MembersCmd::List => c.list_members().await?,
        MembersCmd::Add {
            node_id,
            peer_addr,
            groups,
            allow_zone_majority,
        } => {
            c.add_member(*node_id, peer_addr, groups, *allow_zone_majority)
                .await?
        }
        MembersCmd::Remove {
            node_id,
            groups,
            allow_zone_majority,
        } => {
            c.remove_member(*node_id, groups, *allow_zone_majority)
                .await?
        }
        MembersCmd::Drain { node_id } => c.set_draining(*node_id, true).await?,
        MembersCmd::Undrain { node_id } => c.set_draining(*node_id, false).await?,
        MembersCmd::Replace {
            old_id,
            new_id,
            peer_addr,
            groups,
            allow_zone_majority,
        } => {
            if old_id == new_id {
                eprintln!(
                    "lockctl: error: a replacement needs a new node id (ids are never reused)"
                );
                return Err(Fail::Code(2));
            }
            // By default the new node takes the old one's place: the groups it is a member of
            // (with groups placed on some nodes only, not every group).
            let groups: Vec<u32> = if groups.is_empty() {
                let all = c.list_members().await?;
                let of_old: Vec<u32> = all
                    .groups
                    .iter()
                    .filter(|g| g.members.iter().any(|m| m.node_id == *old_id))
                    .map(|g| g.group)
                    .collect();
                if of_old.is_empty() {
                    eprintln!("lockctl: error: node {old_id} is a member of no group");
                    return Err(Fail::Code(2));
                }
                of_old
            } else {
                groups.clone()
            };
            c.add_member(*new_id, peer_addr, &groups, *allow_zone_majority)
                .await?;
            c.remove_member(*old_id, &groups, *allow_zone_majority)
                .await?
        }
    };
    let groups: Vec<Value> = r
        .groups
        .iter()
        .map(|g| {
            let members: Vec<Value> = g
                .members
                .iter()
                .map(|m| json!({"node_id": m.node_id, "peer_addr": m.peer_addr, "role": m.role, "leader": m.leader, "lag": m.lag, "draining": m.draining, "zone": m.zone, "last_contact_ms": m.last_contact_ms, "reachable": m.reachable}))
                .collect();
            json!({"group": g.group, "leader": g.leader, "joint": g.joint, "members": members})
        })
        .collect();
    out.print(json!({ "groups": groups }), || {
        let width = r
            .groups
            .iter()
            .flat_map(|g| &g.members)
            .map(|m| m.zone.len())
            .max()
            .unwrap_or(0)
            .max(4);
        let mut t = format!(
            "group  node  role     leader  reachable  contact  lag     draining  {:<width$}  peer",
            "zone"
        );
        for g in &r.groups {
            for m in &g.members {
                let lag = m.lag.map_or("-".to_string(), |l| l.to_string());
                let zone = if m.zone.is_empty() { "-" } else { &m.zone };
                t.push_str(&format!(
                    "\n{:>5}  {:>4}  {:<7}  {:<6}  {:<9}  {:<7}  {:<6}  {:<8}  {zone:<width$}  {}",
                    g.group,
                    m.node_id,
                    m.role,
                    if m.leader { "yes" } else { "" },
                    match m.reachable {
                        Some(true) => "yes",
                        Some(false) => "NO",
                        None => "-",
                    },
                    m.last_contact_ms.map_or("-".to_string(), contact),
                    lag,
                    if m.draining { "yes" } else { "" },
                    m.peer_addr
                ));
            }
            if g.joint {
                t.push_str(&format!(
                    "\n{:>5}  (a membership change is half done; repeat it to finish)",
                    g.group
                ));
            }
        }
        t
    });
    Ok(())
}

async fn buckets(cli: &Cli, out: &Out, cmd: &BucketsCmd) -> Result<(), Fail> {
    match cmd {
        BucketsCmd::Show => {
            let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
            let r = c.shard_map().await?;
            let groups: Vec<Value> = r
                .groups
                .iter()
                .map(|g| {
                    json!({"group": g.group, "buckets": g.buckets, "bucket_count": g.bucket_count,
                           "owned": g.owned, "frozen": g.frozen})
                })
                .collect();
            out.print(
                json!({"map_version": r.map_version, "groups": groups}),
                || {
                    let mut t = format!(
                        "shard map version {}\ngroup  buckets  frozen    ranges",
                        r.map_version
                    );
                    for g in &r.groups {
                        t.push_str(&format!(
                            "\n{:>5}  {:>7}  {:<8}  {}",
                            g.group,
                            g.bucket_count,
                            g.frozen,
                            abridged(&g.buckets)
                        ));
                    }
                    t
                },
            );
        }
        BucketsCmd::Move { buckets, to } => {
            // A move of many buckets holding many locks takes a while: one long request
            // (repeating it after a timeout is safe: it finishes what is half done).
            let mut opts = options(cli, Duration::from_secs(15));
            opts.request_timeout = opts.request_timeout.max(Duration::from_secs(600));
            let c = Client::lazy(endpoints(cli), opts)?;
            let m = c.move_buckets(buckets, *to).await?;
            out.print(
                json!({"chunks": m.chunks, "buckets_moved": m.buckets_moved, "locks": m.locks,
                       "holders": m.holders, "waits_requeued": m.waits_requeued,
                       "resumed": m.resumed, "map_version": m.map_version,
                       "elapsed_ms": m.elapsed_ms}),
                || {
                    format!(
                        "moved {} buckets to group {to} in {} chunks ({} ms): {} locks, {} \
                         holders kept their tokens, {} waits queued again; {} interrupted \
                         moves finished; shard map version {}",
                        m.buckets_moved,
                        m.chunks,
                        m.elapsed_ms,
                        m.locks,
                        m.holders,
                        m.waits_requeued,
                        m.resumed,
                        m.map_version
                    )
                },
            );
        }
    }
    Ok(())
}

async fn snapshot_save(cli: &Cli, out: &Out, file: &std::path::Path) -> Result<(), Fail> {
    let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
    let doc = c.backup().await?;
    let v: Value = serde_json::from_slice(&doc)
        .map_err(|e| Fail::Local(format!("the server sent a backup that is not JSON: {e}")))?;
    write_private(file, &doc)
        .map_err(|e| Fail::Local(format!("cannot write {}: {e}", file.display())))?;
    let groups = v["groups"].as_array().map_or(0, Vec::len);
    let namespaces = v["namespaces"].as_array().map_or(0, Vec::len);
    let max = v["max_revision"].as_u64().unwrap_or(0);
    out.print(
        json!({"file": file.display().to_string(), "groups": groups, "namespaces": namespaces, "max_revision": max, "bytes": doc.len()}),
        || {
            format!(
                "saved {}: {groups} lock groups (largest revision {max}), {namespaces} \
                 namespaces, {} bytes\nkeep it private: it holds the namespaces' token digests",
                file.display(),
                doc.len()
            )
        },
    );
    Ok(())
}

/// Writes `bytes` to `path` as 0600, through a temporary file that is fsync'd and renamed. The
/// temporary file is new (`O_CREAT|O_EXCL`, which also refuses a symlink) and named for this
/// process and moment, so nobody else's file, made ahead with wider modes, receives the bytes,
/// and two saves at once do not write into one file.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(format!(".tmp.{}.{nanos}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

async fn groups(cli: &Cli, out: &Out, cmd: &GroupsCmd) -> Result<(), Fail> {
    let group_json = |g: &admin::LockGroup| {
        json!({"group": g.group, "nodes": g.nodes, "born_epoch": g.born_epoch, "ready": g.ready,
               "placed_at": {"term": g.placed_at.0, "index": g.placed_at.1}})
    };
    let row = |g: &admin::LockGroup| {
        let nodes: Vec<String> = g.nodes.iter().map(u64::to_string).collect();
        let state = if g.ready { "ready" } else { "being created" };
        format!(
            "{:>5}  {:>5}  {:<13}  {}",
            g.group,
            g.born_epoch,
            state,
            nodes.join(",")
        )
    };
    const HEAD: &str = "group  epoch  state          nodes";
    match cmd {
        GroupsCmd::List => {
            let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
            let r = c.list_groups().await?;
            let groups: Vec<Value> = r.iter().map(group_json).collect();
            out.print(json!({ "groups": groups }), || {
                let mut t = HEAD.to_string();
                for g in &r {
                    t.push('\n');
                    t.push_str(&row(g));
                }
                t
            });
        }
        GroupsCmd::Create {
            id,
            nodes,
            allow_zone_majority,
        } => {
            // The call waits for the new group to elect a leader (up to a minute).
            let mut opts = options(cli, Duration::from_secs(15));
            opts.request_timeout = opts.request_timeout.max(Duration::from_secs(90));
            let c = Client::lazy(endpoints(cli), opts)?;
            let g = c.create_group(*id, nodes, *allow_zone_majority).await?;
            out.print(group_json(&g), || format!("{HEAD}\n{}", row(&g)));
        }
        GroupsCmd::Remove { id } => {
            let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
            c.remove_group(*id).await?;
            out.print(json!({"group": id, "removed": true}), || {
                format!("group {id} removed")
            });
        }
    }
    Ok(())
}

fn namespace_json(n: &admin::NamespaceSpec) -> Value {
    json!({
        "name": n.name, "prefix": n.prefix, "min_ttl_ms": n.min_ttl_ms, "max_ttl_ms": n.max_ttl_ms,
        "default_ttl_ms": n.default_ttl_ms, "max_waiters_per_name": n.max_waiters_per_name,
        "max_locks_per_session": n.max_locks_per_session, "lock_delay_ms": n.lock_delay_ms,
        "ops_per_s": n.ops_per_s, "max_sessions": n.max_sessions, "safety": n.safety,
        "fenced_resource": (!n.fenced_resource.is_empty()).then_some(&n.fenced_resource),
        "token_required": n.token_required,
    })
}

fn namespace_row(n: &admin::NamespaceSpec) -> String {
    let prefix = if n.prefix.is_empty() {
        "\"\""
    } else {
        &n.prefix
    };
    format!(
        "{:<12}  {:<12}  {:>6}/{:>6}/{:>6}  {:>7}  {:>5}  {:>8}  {:>6}  {:>8}  {:<11}  {}",
        n.name,
        prefix,
        n.min_ttl_ms,
        n.default_ttl_ms,
        n.max_ttl_ms,
        n.max_waiters_per_name,
        n.max_locks_per_session,
        n.lock_delay_ms,
        n.ops_per_s,
        n.max_sessions,
        n.safety,
        if n.token_required { "yes" } else { "no" }
    )
}

const NAMESPACE_HEAD: &str = "name          prefix        ttl ms min/default/max  waiters  locks  delay ms   ops/s  sessions  safety       token";

async fn namespace(cli: &Cli, out: &Out, cmd: &NamespaceCmd) -> Result<(), Fail> {
    let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
    let ms = |d: &Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    match cmd {
        NamespaceCmd::List => {
            let r = c.list_namespaces().await?;
            let all: Vec<Value> = r.namespaces.iter().map(namespace_json).collect();
            out.print(json!({"version": r.version, "namespaces": all}), || {
                let mut t = format!("version {}\n{NAMESPACE_HEAD}", r.version);
                for n in &r.namespaces {
                    t.push('\n');
                    t.push_str(&namespace_row(n));
                }
                t
            });
        }
        NamespaceCmd::Get { name } => {
            let r = c.list_namespaces().await?;
            let Some(n) = r.namespaces.iter().find(|n| &n.name == name) else {
                return Err(Error::Api {
                    status: 404,
                    code: "namespace_not_found".into(),
                    message: format!("namespace '{name}' does not exist"),
                    retry_after: None,
                }
                .into());
            };
            let mut j = namespace_json(n);
            j["version"] = json!(r.version);
            out.print(j, || format!("{NAMESPACE_HEAD}\n{}", namespace_row(n)));
        }
        NamespaceCmd::Put {
            name,
            prefix,
            min_ttl,
            max_ttl,
            default_ttl,
            max_waiters,
            max_locks,
            lock_delay,
            ops_per_s,
            max_sessions,
            safety,
            fenced_resource,
            token_file,
            clear_token,
            expected_version,
        } => {
            let r = c.list_namespaces().await?;
            let mut spec = match r.namespaces.iter().find(|n| &n.name == name) {
                Some(n) => n.clone(),
                None => admin::NamespaceSpec {
                    name: name.clone(),
                    ..Default::default()
                },
            };
            if let Some(p) = prefix {
                spec.prefix = p.clone();
            }
            let set = |v: &Option<Duration>, into: &mut u64| {
                if let Some(d) = v {
                    *into = ms(d);
                }
            };
            set(min_ttl, &mut spec.min_ttl_ms);
            set(max_ttl, &mut spec.max_ttl_ms);
            set(default_ttl, &mut spec.default_ttl_ms);
            set(lock_delay, &mut spec.lock_delay_ms);
            if let Some(v) = max_waiters {
                spec.max_waiters_per_name = *v;
            }
            if let Some(v) = max_locks {
                spec.max_locks_per_session = *v;
            }
            if let Some(v) = ops_per_s {
                spec.ops_per_s = *v;
            }
            if let Some(v) = max_sessions {
                spec.max_sessions = *v;
            }
            if let Some(v) = safety {
                spec.safety = v.clone();
                if v == "efficiency" && fenced_resource.is_none() {
                    spec.fenced_resource.clear();
                }
            }
            if let Some(v) = fenced_resource {
                spec.fenced_resource = v.clone();
            }
            let bearer_token = match token_file {
                Some(p) => Some(
                    std::fs::read_to_string(p)
                        .map_err(|e| {
                            Error::InvalidArgument(format!("--token-file {}: {e}", p.display()))
                        })?
                        .trim()
                        .to_string(),
                ),
                None => None,
            };
            let version = c
                .put_namespace(admin::PutNamespace {
                    expected_version: expected_version.unwrap_or(r.version),
                    namespace: spec,
                    bearer_token,
                    clear_token: *clear_token,
                })
                .await?;
            out.print(json!({"version": version}), || {
                format!("namespace {name} put; namespaces now at version {version}")
            });
        }
        NamespaceCmd::Delete {
            name,
            expected_version,
        } => {
            let expected = match expected_version {
                Some(v) => *v,
                None => c.list_namespaces().await?.version,
            };
            let version = c.delete_namespace(expected, name).await?;
            out.print(json!({"version": version}), || {
                format!("namespace {name} deleted; namespaces now at version {version}")
            });
        }
    }
    Ok(())
}

/// A bucket list for a table row: the first ranges and how many there are (`--json` has all).
fn abridged(ranges: &str) -> String {
    const SHOWN: usize = 8;
    let parts: Vec<&str> = ranges.split(',').collect();
    if parts.len() <= SHOWN {
        return ranges.to_string();
    }
    format!(
        "{},... ({} ranges; --json lists all)",
        parts[..SHOWN].join(","),
        parts.len()
    )
}

/// How long ago a member was last heard from, for a table: `40ms`, `6.2s`, `3m10s`.
fn contact(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => format!("{}m{}s", ms / 60_000, ms % 60_000 / 1000),
    }
}

/// Exits 1 when some endpoint failed, 69 when none answered.
async fn status(cli: &Cli, out: &Out) -> Result<(), Fail> {
    let (mut failed, mut answered) = (None, false);
    for ep in endpoints(cli) {
        let mut opts = options(cli, Duration::from_secs(15));
        opts.retry.max_attempts = 2;
        let r = match Client::lazy([&ep], opts) {
            Ok(c) => c.status().await,
            Err(e) => Err(e),
        };
        match r {
            Ok(s) => {
                answered = true;
                out.print(status_json(&ep, &s), || status_human(&ep, &s))
            }
            Err(e) => {
                let hint = match &e {
                    Error::Unavailable(why) => certificate_hint(cli, why),
                    _ => "",
                };
                out.print(
                    json!({"endpoint": ep, "error": {"code": e.code(), "message": format!("{e}{hint}")}}),
                    || format!("{ep}: unreachable: {e}{hint}"),
                );
                failed = Some(e);
            }
        }
    }
    match failed {
        Some(Error::Unavailable(_)) if !answered => Err(Fail::Code(EXIT_UNREACHABLE)),
        Some(_) => Err(Fail::Code(1)),
        None => Ok(()),
    }
}

/// `status --cluster`: exits 1 when a member node did not answer or is not ready.
async fn cluster_status(cli: &Cli, out: &Out) -> Result<(), Fail> {
    let c = Client::lazy(endpoints(cli), options(cli, Duration::from_secs(15)))?;
    let nodes = c.cluster_status().await?;
    let json_of = |n: &admin::NodeReport| {
        let replicas: Vec<Value> = (n.replicas.iter())
            .map(|r| json!({"group": r.group, "role": r.role, "leader": r.leader, "term": r.term,
                "committed_index": r.committed_index, "applied_index": r.applied_index,
                "revision": r.revision, "log_bytes": r.log_bytes, "snapshot_bytes": r.snapshot_bytes}))
            .collect();
        match &n.error {
            Some(e) => json!({"node_id": n.node_id, "peer_addr": n.peer_addr, "error": e}),
            None => json!({"node_id": n.node_id, "peer_addr": n.peer_addr, "zone": n.zone,
                "version": n.version, "pid": n.pid, "uptime_s": n.uptime_s, "ready": n.ready,
                "not_ready": n.not_ready, "replicas": replicas}),
        }
    };
    out.print(
        json!({"nodes": nodes.iter().map(json_of).collect::<Vec<_>>()}),
        || cluster_table(&nodes),
    );
    if nodes.iter().any(|n| n.error.is_some() || !n.ready) {
        return Err(Fail::Code(1));
    }
    Ok(())
}

/// One row per replica (a node's own columns on its first row), then why a node is not ready.
fn cluster_table(nodes: &[admin::NodeReport]) -> String {
    let mut t = String::from(
        "node  version  ready  uptime    group  role      leader  term  commit    applied   disk",
    );
    let mut notes = Vec::new();
    for n in nodes {
        if let Some(e) = &n.error {
            t.push_str(&format!(
                "
{:>4}  {}: {e}",
                n.node_id, n.peer_addr
            ));
            continue;
        }
        for (i, r) in n.replicas.iter().enumerate() {
            let node_cols = if i == 0 {
                format!(
                    "{:>4}  {:<7}  {:<5}  {:<8}",
                    n.node_id,
                    n.version,
                    if n.ready { "yes" } else { "NO" },
                    human_secs(n.uptime_s),
                )
            } else {
                format!("{:30}", "")
            };
            let group = if r.group == 0 {
                "meta".to_string()
            } else {
                r.group.to_string()
            };
            let leader = if r.leader == 0 {
                "-".to_string()
            } else {
                r.leader.to_string()
            };
            let commit = r.committed_index.map_or("-".to_string(), |c| c.to_string());
            let disk = match (r.log_bytes, r.snapshot_bytes) {
                (Some(l), Some(s)) => human_bytes(l + s),
                _ => "-".to_string(),
            };
            t.push_str(&format!(
                "\n{node_cols}  {group:>5}  {:<8}  {leader:<6}  {:<4}  {commit:<8}  {:<8}  {disk}",
                r.role, r.term, r.applied_index
            ));
        }
        notes.extend(
            n.not_ready
                .iter()
                .map(|w| format!("node {}: {w}", n.node_id)),
        );
    }
    for w in notes {
        t.push_str(&format!("\nnot ready: {w}"));
    }
    t
}

/// An uptime as `42s`, `5m12s`, `2h13m` or `3d4h`.
fn human_secs(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m{}s", s / 60, s % 60),
        3_600..86_400 => format!("{}h{}m", s / 3_600, s % 3_600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3_600),
    }
}

/// `n` bytes as B, KiB, MiB or GiB.
fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut u) = (n as f64, 0);
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

fn status_json(ep: &str, s: &admin::NodeStatus) -> Value {
    json!({
        "endpoint": ep,
        "node_id": s.node_id,
        "pid": s.pid,
        "serving_names": s.serving_names,
        "groups": s.groups.iter().map(|g| json!({
            "id": g.id, "leader": g.leader, "term": g.term, "members": g.members,
            "applied_index": g.applied_index, "revision": g.revision,
        })).collect::<Vec<_>>(),
    })
}

fn status_human(ep: &str, s: &admin::NodeStatus) -> String {
    let catching_up = if s.serving_names {
        ""
    } else {
        " CATCHING UP: serves no names yet"
    };
    let mut t = format!(
        "node {} (pid {}) at {ep}{catching_up}\n  group  leader  term  members   applied  revision",
        s.node_id, s.pid
    );
    for g in &s.groups {
        let leader = if g.leader == 0 {
            "-".to_string()
        } else {
            g.leader.to_string()
        };
        let members: Vec<String> = g.members.iter().map(u64::to_string).collect();
        t.push_str(&format!(
            "\n  {:<5}  {:<6}  {:<4}  {:<8}  {:<7}  {}",
            if g.id == 0 {
                "meta".to_string()
            } else {
                g.id.to_string()
            },
            leader,
            g.term,
            members.join(","),
            g.applied_index,
            g.revision
        ));
    }
    t
}

fn hot_json(h: &admin::HotName) -> Value {
    json!({
        "name": h.name, "namespace": h.namespace, "group": h.group, "holders": h.holders,
        "waiters": h.waiters, "held_for_ms": h.held_for_ms, "longest_wait_ms": h.longest_wait_ms,
        "handoffs_per_s": h.handoffs_per_s, "wait_estimate_ms": h.wait_estimate_ms,
    })
}

fn top_json(t: &admin::Contention) -> Value {
    let list = |v: &[admin::HotName]| v.iter().map(hot_json).collect::<Vec<_>>();
    json!({
        "top": t.top, "namespaces": t.namespaces, "scanned": t.scanned,
        "most_waiters": list(&t.most_waiters), "longest_waits": list(&t.longest_waits),
        "most_handoffs": list(&t.most_handoffs), "longest_held": list(&t.longest_held),
    })
}

/// Milliseconds as a person reads them: 850ms, 12.3s, 4m05s, 2h10m.
fn short_ms(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

fn top_human(t: &admin::Contention) -> String {
    let mut out = format!(
        "top {} of namespaces {} ({} record{} scanned)",
        t.top,
        t.namespaces.join(", "),
        t.scanned,
        if t.scanned == 1 { "" } else { "s" }
    );
    for (title, list) in [
        ("most waiters", &t.most_waiters),
        ("longest waits", &t.longest_waits),
        ("most hand-offs", &t.most_handoffs),
        ("longest held", &t.longest_held),
    ] {
        out.push_str(&format!("\n\n{title}:"));
        if list.is_empty() {
            out.push_str(" none");
            continue;
        }
        out.push_str(&format!(
            "\n  {:<40} {:>5} {:>7} {:>7} {:>9} {:>9} {:>8} {:>9}",
            "NAME", "GROUP", "HOLDERS", "WAITERS", "HELD", "WAITED", "HANDOFF/S", "EST-WAIT"
        ));
        for h in list {
            out.push_str(&format!(
                "\n  {:<40} {:>5} {:>7} {:>7} {:>9} {:>9} {:>8.2} {:>9}",
                h.name,
                h.group,
                h.holders,
                h.waiters,
                short_ms(h.held_for_ms),
                short_ms(h.longest_wait_ms),
                h.handoffs_per_s,
                h.wait_estimate_ms.map_or("-".to_string(), short_ms),
            ));
        }
    }
    out
}

fn lock_json(s: &lockd_client::LockInfo) -> Value {
    json!({
        "name": s.name,
        "namespace": s.namespace,
        "holders": s.holders.iter().map(|h| json!({
            "session": h.session_id, "owner": h.owner, "token": h.fencing_token,
            "mode": h.mode.as_str(), "held_for_ms": h.held_for_ms, "reentry": h.reentry,
        })).collect::<Vec<_>>(),
        "waiters": s.waiters.iter().map(|w| json!({
            "session": w.session_id, "owner": w.owner, "mode": w.mode.as_str(),
            "position": w.position, "waited_ms": w.waited_ms,
        })).collect::<Vec<_>>(),
        "lock_delay_until_ms": s.lock_delay_until_ms,
    })
}

fn lock_human(s: &lockd_client::LockInfo) -> String {
    if s.holders.is_empty() && s.waiters.is_empty() {
        return format!("{} is free", s.name);
    }
    let mut t = format!("{} (namespace {})", s.name, s.namespace);
    for h in &s.holders {
        t.push_str(&format!(
            "\n  held by {} ({}) token {} {} for {} ms{}",
            h.owner,
            h.session_id,
            h.fencing_token,
            h.mode.as_str(),
            h.held_for_ms,
            if h.reentry > 1 {
                format!(", re-entered {}×", h.reentry)
            } else {
                String::new()
            }
        ));
    }
    for w in &s.waiters {
        t.push_str(&format!(
            "\n  #{} waiting: {} ({}) {} for {} ms",
            w.position,
            w.owner,
            w.session_id,
            w.mode.as_str(),
            w.waited_ms
        ));
    }
    t
}

/// How `run` treats CMD.
struct RunHow {
    kill_grace: Duration,
    pass_stdin: bool,
}

async fn run_command(
    cli: &Cli,
    out: &Out,
    name: &str,
    hold: &HoldArgs,
    how: &RunHow,
    command: &[String],
) -> Result<(), Fail> {
    // Watch the signals before anything can be held, so none of them can orphan a hold.
    let mut signals = Signals::new().map_err(no_signals)?;
    let (client, guard) = take(cli, out, name, hold, &mut signals).await?;
    let spawned = child::spawn(
        command,
        &[
            ("LOCKD_TOKEN", guard.token().to_string()),
            ("LOCKD_LOCK", name.to_string()),
        ],
        how.pass_stdin,
    );
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            let _ = client.close().await;
            out.note(
                json!({"error": {"code": "spawn_failed", "message": format!("{}: {e}", command[0])}}),
                || format!("error: cannot run {}: {e}", command[0]),
            );
            return Err(Fail::Code(127));
        }
    };
    let pgid = child.pgid();
    out.note(
        json!({"event": "acquired", "name": name, "token": guard.token(), "session": guard.session_id(), "pid": pgid.as_raw()}),
        || format!("holding {name} (token {}); running {}", guard.token(), command.join(" ")),
    );
    let stop = |sig| {
        let _ = killpg(pgid, sig);
    };
    let mut signalled = None;
    let status = tokio::select! {
        st = child.wait() => st,
        _ = guard.lost() => {
            let deadline = guard.deadline();
            stop(Signal::SIGTERM);
            let st = match tokio::time::timeout(LOST_GRACE, child.wait()).await {
                Ok(st) => st,
                Err(_) => {
                    stop(Signal::SIGKILL);
                    child.wait().await
                }
            };
            let after = Instant::now().saturating_duration_since(deadline);
            stop(Signal::SIGKILL); // whatever CMD left behind in its group
            child.restore_terminal();
            out.note(
                json!({"event": "lost", "name": name, "token": guard.token(),
                       "child_stopped_after_deadline_ms": after.as_secs_f64() * 1000.0,
                       "child_status": st.as_ref().map(|s| s.to_string()).unwrap_or_default()}),
                || format!("the lease on {name} was lost; stopped the command {:.0} ms after the local deadline", after.as_secs_f64() * 1000.0),
            );
            let _ = client.close().await;
            return Err(Fail::Code(hold.lost_exit_code));
        }
        n = signals.recv() => {
            signalled = Some(n);
            let t0 = Instant::now();
            stop(Signal::SIGTERM);
            // The grace ends early if the lease is lost meanwhile: nobody may keep working then.
            let st = tokio::select! {
                st = child.wait() => st,
                _ = tokio::time::sleep(how.kill_grace) => { stop(Signal::SIGKILL); child.wait().await }
                _ = guard.lost() => { stop(Signal::SIGKILL); child.wait().await }
            };
            stop(Signal::SIGKILL);
            out.note(
                json!({"event": "signalled", "name": name, "signal": n,
                       "child_stopped_ms": t0.elapsed().as_secs_f64() * 1000.0}),
                || format!("got signal {n}; stopped the command in {:.0} ms", t0.elapsed().as_secs_f64() * 1000.0),
            );
            st
        }
    };
    child.restore_terminal();
    let code = match status {
        Ok(st) => child::code_of(st),
        Err(e) => {
            out.note(
                json!({"error": {"code": "wait_failed", "message": e.to_string()}}),
                || format!("error: waiting for the command: {e}"),
            );
            1
        }
    };
    let lost = guard.is_lost();
    let released = guard.release().await;
    let _ = client.close().await;
    if let Some(n) = signalled {
        if let Err(e) = &released {
            out.note(
                json!({"warning": {"code": e.code(), "message": e.to_string()}}),
                || format!("warning: release failed: {e}"),
            );
        } else {
            out.note(json!({"event": "released", "name": name}), || {
                format!("released {name}")
            });
        }
        return Err(Fail::Code(128 + n as u8));
    }
    if lost {
        // It finished, but not provably inside the lease.
        out.note(json!({"event": "lost", "name": name}), || {
            format!("the lease on {name} ran out as the command finished")
        });
        return Err(Fail::Code(hold.lost_exit_code));
    }
    if let Err(e) = released {
        out.note(
            json!({"warning": {"code": e.code(), "message": e.to_string()}}),
            || format!("warning: release failed: {e}"),
        );
    }
    Err(Fail::Code(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_times_print_as_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc(1_796_626_501_123), "2026-12-07T06:55:01.123Z");
    }

    #[test]
    fn modes_parse() {
        assert_eq!(parse_mode("semaphore:4"), Ok(Mode::Semaphore(4)));
        assert_eq!(parse_mode("shared"), Ok(Mode::Shared));
        assert!(parse_mode("semaphore:x").is_err());
    }

    #[test]
    fn cluster_table_shows_each_replica_and_names_a_silent_or_unready_node() {
        let replica = |group, role: &str| admin::ReplicaReport {
            group,
            role: role.into(),
            leader: 1,
            term: 3,
            committed_index: Some(120),
            applied_index: 118,
            revision: 7,
            log_bytes: Some(3 * 1024 * 1024),
            snapshot_bytes: Some(512 * 1024),
        };
        let nodes = [
            admin::NodeReport {
                node_id: 1,
                peer_addr: "10.0.0.1:7001".into(),
                error: None,
                zone: "a".into(),
                version: "0.1.0".into(),
                pid: 42,
                uptime_s: 3_725,
                ready: false,
                not_ready: vec!["its replica of group 1 is catching up".into()],
                replicas: vec![replica(0, "leader"), replica(1, "follower")],
            },
            admin::NodeReport {
                node_id: 2,
                peer_addr: "10.0.0.2:7001".into(),
                error: Some("no answer within 3 s".into()),
                zone: String::new(),
                version: String::new(),
                pid: 0,
                uptime_s: 0,
                ready: false,
                not_ready: vec![],
                replicas: vec![],
            },
        ];
        let t = cluster_table(&nodes);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert!(lines[1].starts_with("   1  0.1.0    NO     1h2m"), "{t}");
        assert!(lines[1].contains(" meta  leader"), "{t}");
        assert!(lines[1].contains("120       118       3.5 MiB"), "{t}");
        assert!(lines[2].trim_start().starts_with("1  follower"), "{t}");
        assert_eq!(lines[3], "   2  10.0.0.2:7001: no answer within 3 s");
        assert_eq!(
            lines[4],
            "not ready: node 1: its replica of group 1 is catching up"
        );
        assert_eq!(human_secs(59), "59s");
        assert_eq!(human_secs(90_061), "1d1h");
        assert_eq!(human_bytes(1023), "1023 B");
    }
}
