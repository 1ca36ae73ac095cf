//! `ambidex node --config FILE --node I`: runs node I of the cluster the file describes
//! (docs/cluster.md), driven by a line-based JSON control protocol: commands on stdin,
//! events on stdout (nothing else is ever written to stdout; the progress bar and
//! diagnostics go to stderr). `ambidex bench --transport shm|udp` starts one of these per
//! node; on separate hosts an operator, or ssh, can speak the same protocol.
//!
//! ```text
//! node → {"event":"ready","node":I,"pid":P,"load_seconds":S,"config":{...},
//!          "policy":{...},"tables":[...]}
//!                                 transport open, tables registered in it and loaded;
//!                                 `config` echoes the one it runs, `policy` the
//!                                 transaction policy its threads will run (the launcher
//!                                 refuses one that differs from the cluster's), `tables`
//!                                 its table descriptors (region id, access key, layout)
//!      ← {"cmd":"catalog","catalog":{...}}   every node's descriptors (the launcher
//!                                 files the nodes' `tables`); required before start
//!      ← {"cmd":"start"}        workers start (warmup: nothing is counted); thread 0
//!                                 reads every other node's table superblocks one-sided
//!                                 and checks them against the catalog (a failure is an
//!                                 error event)
//!      ← {"cmd":"measure"}      the measured window starts
//!      ← {"cmd":"stop"}         the window ends; workers finish their transaction
//! node → {"event":"workers_done","node":I}   this node's workers returned; it still serves
//!      ← {"cmd":"finish"}       every node's workers are done: stop serving, check, report
//!                                 (with a manager, `"state":{ClusterState}` is its final
//!                                 state: every node checks under that configuration)
//! node → {"event":"report","node":I,"report":{...}}   then the process exits 0
//!      ← {"cmd":"replace_node","node":J,"tables":[...],"log_region":{...}}
//!                                 node J restarted with new regions: its descriptors
//!                                 in this node's catalog are replaced (while running)
//! node → {"event":"catalog_replaced","node":I,"replaced":J}
//!      ← {"cmd":"die_in_commit"}  (while running) SIGKILL this process at the next
//!                                 moment one of its coordinators is in the commit phase
//!                                 (`ambidex::bench::lost::arm_commit_kill`)
//! node → {"event":"dying","node":I,"in_commit":C,"waited_ms":W,"at_unix_ns":T}
//!                                 just before it
//!      ← {"cmd":"abort"}        exit now (status 2), no report
//! node → {"event":"error","node":I,"message":"..."}   then the process exits 1
//! ```
//!
//! With a configuration manager (`cluster.manager = "embedded"`), the node's agent
//! (`ambidex_cluster::Agent`, started at `start`, stopped at `finish`) calls the manager
//! through the same channel (`ambidex_cluster::manager::channel`):
//!
//! ```text
//! node → {"event":"manager","node":I,"manager":{"id":N,"call":"renew"}}   a call
//!      ← {"manager":{"id":N,"answer":"granted","grant":{...}}}           its answer
//!      ← {"manager":{"push":{ClusterState}}}     every new state, pushed by the launcher
//! ```
//!
//! With `cluster.manager = "etcd"` the agent calls etcd itself (no `manager` lines);
//! its client's events come back in the report (`manager_events`).
//!
//! A node started with `--rejoin` (a restarted node, `bench --restart`) opens its
//! transport, loads nothing, and first waits for
//!
//! ```text
//!      ← {"cmd":"rejoin","config":{Configuration},"incarnation":K,"run_ms":T}
//! ```
//!
//! (the cluster's current configuration, which no longer has it, its new incarnation
//! and how long the run has been going); it then makes an empty database in new
//! regions, says `ready` as above and goes on as any node, except that at `start` its
//! agent joins the cluster as incarnation K (`Agent::join`; with etcd its own client
//! connects as incarnation K) and is re-replicated into.
//!
//! End of input before the report (the launcher died, ssh dropped) stops the node with
//! status 3. Commands may also be written as bare words (`start`), for people; other
//! fields of a command object are ignored.

use crate::bench::etcd_membership::{self, MembershipError};
use crate::bench::lost::{arm_commit_kill, begins_since_armed, CommitMoment};
use crate::bench::node::{load_node, rejoin_node, LoadedNode, RunningNode};
use crate::bench::NodeError;
use crate::config::{ConfigError, ManagerKind, Transport};
use crate::transports::OpenError;
use crate::workload::Registry;
use crate::{transports, Config};
use ambidex_cluster::manager::channel::ChannelInbox;
use ambidex_cluster::{Agent, ClusterState, Event, ManagerClient};
use ambidex_store::{Catalog, LogRegionDesc, TableDesc};
use serde::Deserialize;
use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest command line read from stdin (a catalog has every node's descriptors).
const MAX_COMMAND: u64 = 16 * 1024 * 1024;

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
enum Cmd {
    Catalog {
        catalog: Catalog,
    },
    Start,
    Measure,
    Stop,
    Finish {
        /// The manager's final state, if the run had one.
        #[serde(default)]
        state: Option<Box<ClusterState>>,
    },
    Abort,
    /// The first command of a node started with `--rejoin`.
    Rejoin {
        config: Box<ambidex_cluster::Configuration>,
        incarnation: u64,
        #[serde(default)]
        run_ms: u64,
    },
    ReplaceNode {
        node: u16,
        tables: Vec<TableDesc>,
        log_region: LogRegionDesc,
    },
    DieInCommit,
}

enum Input {
    Cmd(Cmd),
    Bad(CommandError),
    Eof,
}

/// A command line from the launcher that cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Longer than a node reads.
    #[error("a command line over {0} bytes")]
    TooLong(u64),
    /// Not UTF-8.
    #[error("a command line that is not UTF-8")]
    NotUtf8,
    /// Not JSON, or no command.
    #[error(
        "bad command {line:?}: {source} (commands: catalog, start, measure, stop, finish, \
         abort, rejoin, replace_node, die_in_commit)"
    )]
    Bad {
        /// The line.
        line: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The input could not be read.
    #[error("reading commands: {0}")]
    Read(#[source] std::io::Error),
}

fn parse_command(line: &str) -> Result<Cmd, CommandError> {
    let line = line.trim();
    let bad = |source| CommandError::Bad {
        line: line.into(),
        source,
    };
    let v: serde_json::Value = if line.starts_with('{') {
        serde_json::from_str(line).map_err(bad)?
    } else {
        serde_json::json!({ "cmd": line })
    };
    serde_json::from_value(v).map_err(bad)
}

/// The manager message of a `{"manager": {...}}` line, if it is one.
fn manager_line(line: &str) -> Option<serde_json::Value> {
    let line = line.trim();
    if !line.starts_with("{\"manager\"") {
        return None;
    }
    let mut v: serde_json::Value = serde_json::from_str(line).ok()?;
    v.get_mut("manager").map(serde_json::Value::take)
}

/// Reads stdin: commands go to `tx`, manager lines straight to `inbox` (the agent
/// waits on them while the main loop may be busy, e.g. finishing).
fn read_commands(tx: std::sync::mpsc::Sender<Input>, inbox: ChannelInbox, node: u16) {
    // The manager's answers to the agent's renewals arrive here: this thread is on the
    // lease's path as much as the agent is, so it runs at the agent's priority.
    ambidex_cluster::priority::raise_lease_thread();
    let mut r = std::io::BufReader::new(std::io::stdin());
    // However the input ends, the agent's calls fail at once from then on.
    struct CloseOnDrop(ChannelInbox);
    impl Drop for CloseOnDrop {
        fn drop(&mut self) {
            self.0.close();
        }
    }
    let _close = CloseOnDrop(inbox.clone());
    loop {
        let mut buf = Vec::new();
        let msg = match (&mut r).take(MAX_COMMAND).read_until(b'\n', &mut buf) {
            Ok(0) => Input::Eof,
            Ok(_) if buf.last() != Some(&b'\n') && buf.len() as u64 >= MAX_COMMAND => {
                Input::Bad(CommandError::TooLong(MAX_COMMAND))
            }
            Ok(_) => match std::str::from_utf8(&buf) {
                Ok(s) if s.trim().is_empty() => continue,
                Ok(s) => {
                    if let Some(msg) = manager_line(s) {
                        if msg.get("push").is_some() {
                            ambidex_cluster::rectrace!("node {node} reader got push");
                        }
                        // Counted by the inbox; a bad manager line is no reason to stop.
                        if let Err(e) = inbox.deliver(&msg) {
                            eprintln!("ambidex node {node}: {e}");
                        }
                        continue;
                    }
                    match parse_command(s) {
                        Ok(c) => Input::Cmd(c),
                        Err(e) => Input::Bad(e),
                    }
                }
                Err(_) => Input::Bad(CommandError::NotUtf8),
            },
            Err(e) => Input::Bad(CommandError::Read(e)),
        };
        let end = !matches!(msg, Input::Cmd(_));
        if tx.send(msg).is_err() || end {
            return;
        }
    }
}

/// Events to the launcher, one JSON object per line on stdout. Every writer (the main
/// loop, the agent's manager calls) goes through [`Events::write`]: one line under
/// stdout's lock, so lines never interleave.
#[derive(Clone, Copy)]
struct Events {
    node: u16,
}

impl Events {
    fn write(&self, event: &str, mut body: serde_json::Value) -> std::io::Result<()> {
        if let Some(m) = body.as_object_mut() {
            m.insert("event".into(), event.into());
            m.insert("node".into(), self.node.into());
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "{body}").and_then(|_| out.flush())
    }

    fn send(&self, event: &str, body: serde_json::Value) {
        if self.write(event, body).is_err() {
            // Nobody listens any more: the launcher is gone.
            eprintln!("ambidex node {}: control output closed; exiting", self.node);
            std::process::exit(3);
        }
    }
}

enum State {
    Loaded(Box<LoadedNode>),
    Running(RunningNode, bool),
    Stopped(RunningNode, bool),
}

/// Why a node process stopped before its report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeProcessError {
    /// Its configuration file.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A configuration whose nodes all live in one process.
    #[error(
        "{0}: transport \"local\" keeps every node in one process; a node process needs \
         \"shm\" or \"udp\""
    )]
    LocalTransport(String),
    /// A node the cluster does not have.
    #[error("node {node} is not in this {nodes}-node cluster")]
    NotInCluster {
        /// The node.
        node: u16,
        /// The cluster's nodes.
        nodes: u16,
    },
    /// Its transport could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// `--rejoin` in a cluster with no manager.
    #[error(
        "a restarted node rejoins through a configuration manager (embedded or etcd), and \
         this cluster has none"
    )]
    RejoinWithoutManager,
    /// `--rejoin`, and another command came before `rejoin`.
    #[error("a node started with --rejoin needs the rejoin command first, not {0}")]
    RejoinFirst(String),
    /// A command that cannot be taken.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// A command that is not valid in the node's phase.
    #[error("command {cmd} is not valid while {phase}")]
    NotNow {
        /// The command.
        cmd: String,
        /// The phase.
        phase: &'static str,
    },
    /// Loading, starting, running or finishing the node.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// Its client of the run's membership in etcd.
    #[error(transparent)]
    Membership(#[from] MembershipError),
    /// Its cluster agent's thread.
    #[error("cannot start the cluster agent: {0}")]
    Agent(#[source] std::io::Error),
    /// `finish`, and its workers did not return.
    #[error("workers still running 60 s after finish")]
    WorkersStillRunning,
    /// Its report could not be serialized.
    #[error("its report: {0}")]
    Report(#[source] serde_json::Error),
}

/// A node process that failed, by node ([`run`]).
#[derive(Debug, thiserror::Error)]
#[error("node {node}: {error}")]
pub struct NodeProcessFailed {
    /// The node.
    pub node: u16,
    /// Why.
    #[source]
    pub error: NodeProcessError,
}

/// Runs this process as node `node` of the cluster the configuration file `config`
/// describes (its workload from `reg`), driven by the control protocol on stdin and
/// stdout until its report (see the module's documentation). This is the process's
/// main loop: the end of its input, `abort`, or a commit-phase kill end the process
/// itself (status 3, 2, SIGKILL). A failure is also sent as an `error` event.
pub fn run(
    reg: &Registry,
    config: &Path,
    node: u16,
    no_progress: bool,
    rejoin: bool,
) -> Result<(), NodeProcessFailed> {
    let ev = Events { node };
    match run_inner(reg, config, node, no_progress, rejoin, &ev) {
        Ok(()) => Ok(()),
        Err(error) => {
            ev.send("error", serde_json::json!({ "message": error.to_string() }));
            Err(NodeProcessFailed { node, error })
        }
    }
}

fn run_inner(
    reg: &Registry,
    config: &Path,
    node: u16,
    no_progress: bool,
    rejoin: bool,
    ev: &Events,
) -> Result<(), NodeProcessError> {
    let mut cfg = Config::read(config, &Config::default())?;
    cfg.validate()?;
    if cfg.cluster.transport == Transport::Local {
        return Err(NodeProcessError::LocalTransport(
            config.display().to_string(),
        ));
    }
    if node >= cfg.cluster.nodes {
        return Err(NodeProcessError::NotInCluster {
            node,
            nodes: cfg.cluster.nodes,
        });
    }
    cfg.run.progress = !no_progress;
    let (tx, rx) = std::sync::mpsc::channel();
    let inbox = ChannelInbox::new();
    let reader_inbox = inbox.clone();
    std::thread::spawn(move || read_commands(tx, reader_inbox, node));
    let manager = cfg.cluster.manager_spec();
    // Held from `start` to `finish`: dropping it stops the agent's thread.
    let mut agent: Option<Agent> = None;
    // With etcd: what this node's client published, once the agent is dropped.
    let etcd_events: Arc<Mutex<Vec<Event>>> = Arc::default();

    // The transport first: the tables live in regions registered on it.
    let udp = cfg.rpc.udp_options()?;
    let transport = transports::open_node_with(&cfg.cluster, node, udp)?;
    let loaded = if rejoin {
        if manager.is_none() {
            return Err(NodeProcessError::RejoinWithoutManager);
        }
        // What to rejoin comes first; nothing else is valid before it.
        match rx.recv() {
            Ok(Input::Cmd(Cmd::Rejoin {
                config,
                incarnation,
                run_ms,
            })) => rejoin_node(reg, &cfg, transport, *config, incarnation, run_ms as f64)?,
            Ok(Input::Cmd(c)) => return Err(NodeProcessError::RejoinFirst(cmd_name(&c))),
            Ok(Input::Bad(e)) => return Err(e.into()),
            Ok(Input::Eof) | Err(_) => {
                eprintln!("ambidex node {node}: control input closed before rejoin; stopping");
                std::process::exit(3);
            }
        }
    } else {
        load_node(reg, &cfg, transport)?
    };
    ev.send(
        "ready",
        serde_json::json!({
            "pid": std::process::id(),
            "load_seconds": loaded.load_seconds,
            "config": cfg,
            "policy": loaded.policy(),
            "tables": loaded.table_descs(),
            "log_region": loaded.log_region_desc(),
        }),
    );
    let mut state = Some(State::Loaded(Box::new(loaded)));
    loop {
        let input = next_input(&rx, &mut state)?;
        let Some(input) = input else {
            // Polling: report when this node's workers are done.
            if let Some(State::Stopped(r, sent)) = &mut state {
                if !*sent && r.workers_done()? {
                    *sent = true;
                    ev.send("workers_done", serde_json::json!({}));
                }
            }
            continue;
        };
        let cmd = match input {
            Input::Cmd(c) => c,
            Input::Bad(e) => return Err(e.into()),
            Input::Eof => {
                eprintln!(
                    "ambidex node {node}: control input closed before the run finished; stopping"
                );
                std::process::exit(3);
            }
        };
        state = Some(match (state.take().expect("state"), cmd) {
            (_, Cmd::Abort) => {
                eprintln!("ambidex node {node}: aborted by the launcher");
                std::process::exit(2);
            }
            (State::Loaded(l), Cmd::Catalog { catalog }) => {
                l.set_catalog(catalog)?;
                State::Loaded(l)
            }
            (State::Loaded(l), Cmd::Start) => {
                // The lease starts with the run, not at load (loading takes seconds and
                // differs per node): the launcher starts its manager just before `start`.
                if let Some(m) = &manager {
                    let client: Box<dyn ManagerClient> = if cfg.cluster.manager == ManagerKind::Etcd
                    {
                        // The node's agent calls etcd itself.
                        etcd_membership::node_client(
                            &cfg.cluster,
                            node,
                            l.incarnation(),
                            etcd_events.clone(),
                        )?
                    } else {
                        let events = *ev;
                        let send = Box::new(move |msg: serde_json::Value| {
                            events
                                .write("manager", serde_json::json!({ "manager": msg }))
                                .map_err(ambidex_cluster::manager::channel::SendLineError::Io)
                        });
                        // A call waits up to a lease: a grant that arrives late still
                        // counts (the lease runs from when the renewal was sent), and an
                        // answer later than that is worth nothing. Waiting only half of it
                        // turned a few tens of ms of scheduling delay on a loaded machine
                        // into a missed first grant, a fenced agent and a needless
                        // reconfiguration. The threads stop serving at the lease's end
                        // whatever the agent is waiting for (`NodeState::serving`).
                        Box::new(inbox.client(node, send, m.lease))
                    };
                    let clock = ambidex_transport::clock::SystemClock::shared();
                    let (name, state) = (format!("agent{node}"), l.cluster_state());
                    let a = match l.incarnation() {
                        1 => Agent::start(name, client, state, m.lease, clock),
                        // A restarted node is no member: it asks to join, and its
                        // threads wait without a lease until it is admitted.
                        k => Agent::join(name, client, state, m.lease, clock, node, k),
                    }
                    .map_err(NodeProcessError::Agent)?;
                    agent = Some(a);
                }
                State::Running(l.start()?, false)
            }
            (State::Running(mut r, false), Cmd::Measure) => {
                r.measure();
                State::Running(r, true)
            }
            (State::Running(mut r, _), Cmd::Stop) => {
                r.stop();
                State::Stopped(r, false)
            }
            (
                State::Running(r, m),
                Cmd::ReplaceNode {
                    node: n,
                    tables,
                    log_region,
                },
            ) => {
                r.replace_in_catalog(n, tables, log_region)?;
                ev.send("catalog_replaced", serde_json::json!({ "replaced": n }));
                State::Running(r, m)
            }
            (State::Running(r, m), Cmd::DieInCommit) => {
                let events = *ev;
                arm_commit_kill(std::sync::Arc::new(move |at: CommitMoment| {
                    // Said first (the launcher reports the moment), then a death with
                    // no goodbye, as the launcher's own SIGKILL.
                    // `at_unix_ns`: when, on the host's clock (the launcher's reader
                    // may see the death much later on a loaded host).
                    let now_ns = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64);
                    let _ = events.write(
                        "dying",
                        serde_json::json!({
                            "in_commit": at.in_commit,
                            "waited_ms": at.waited_ms,
                            "at_unix_ns": now_ns,
                        }),
                    );
                    eprintln!(
                        "ambidex node {node}: SIGKILL in the commit phase ({} coordinators of \
                         the thread between commit-backup and commit-primary, {} ms after \
                         arming, {} transactions began meanwhile)",
                        at.in_commit,
                        at.waited_ms,
                        begins_since_armed()
                    );
                    // SAFETY: kill(2) on this process's own pid; SIGKILL cannot be caught.
                    unsafe {
                        libc::kill(libc::getpid(), libc::SIGKILL);
                    }
                    // SIGKILL to oneself is delivered before kill returns; never here.
                    std::process::abort();
                }));
                State::Running(r, m)
            }
            (State::Stopped(r, _), Cmd::Finish { state }) => {
                // No transaction runs any more: the run's membership is over (the
                // launcher takes the manager's events before it sends finish).
                drop(agent.take());
                // The launcher sends this once every node's workers are done; a person
                // may send it early, so wait for this node's own workers first.
                let until = Instant::now() + Duration::from_secs(60);
                while !r.workers_done()? {
                    if Instant::now() >= until {
                        return Err(NodeProcessError::WorkersStillRunning);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                let mut report = r.finish(state.as_deref())?;
                report.manager_events =
                    std::mem::take(&mut *etcd_events.lock().unwrap_or_else(|e| e.into_inner()));
                let body = serde_json::json!({
                    "report": serde_json::to_value(&report).map_err(NodeProcessError::Report)?
                });
                ev.send("report", body);
                return Ok(());
            }
            (s, c) => {
                let phase = match &s {
                    State::Loaded(_) => "loaded (waiting for start)",
                    State::Running(_, false) => "warming up",
                    State::Running(_, true) => "measuring",
                    State::Stopped(..) => "stopped (waiting for finish)",
                };
                return Err(NodeProcessError::NotNow {
                    cmd: cmd_name(&c),
                    phase,
                });
            }
        });
    }
}

/// A command's name for messages (descriptors and states are no error message).
fn cmd_name(c: &Cmd) -> String {
    match c {
        Cmd::Catalog { .. } => "Catalog".into(),
        Cmd::Finish { .. } => "Finish".into(),
        Cmd::Rejoin { .. } => "Rejoin".into(),
        Cmd::ReplaceNode { .. } => "ReplaceNode".into(),
        other => format!("{other:?}"),
    }
}

/// The next command, or `None` after a short wait (so the caller can poll). A thread
/// failure while running is an error.
fn next_input(
    rx: &Receiver<Input>,
    state: &mut Option<State>,
) -> Result<Option<Input>, NodeProcessError> {
    match rx.recv_timeout(Duration::from_millis(5)) {
        Ok(i) => Ok(Some(i)),
        Err(RecvTimeoutError::Timeout) => {
            if let Some(State::Running(r, _)) = state {
                r.workers_done()?;
            }
            Ok(None)
        }
        Err(RecvTimeoutError::Disconnected) => Ok(Some(Input::Eof)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_as_json_or_words_and_bad_ones_are_errors() {
        assert_eq!(parse_command("{\"cmd\":\"start\"}\n").unwrap(), Cmd::Start);
        assert_eq!(
            parse_command("  finish ").unwrap(),
            Cmd::Finish { state: None }
        );
        assert!(parse_command("{\"cmd\":\"launch\"}").is_err());
        // Other fields are ignored (room for parameters later).
        assert_eq!(
            parse_command("{\"cmd\":\"stop\",\"x\":1}").unwrap(),
            Cmd::Stop
        );
        assert!(parse_command("{\"cmd\":").is_err());
        assert!(parse_command("[1,2]").is_err());
        assert!(parse_command("\u{0}").is_err());
    }

    #[test]
    fn manager_lines_are_told_from_commands() {
        assert_eq!(
            manager_line("{\"manager\":{\"id\":1,\"answer\":\"done\"}}\n"),
            Some(serde_json::json!({"id": 1, "answer": "done"}))
        );
        assert_eq!(manager_line("{\"cmd\":\"start\"}"), None);
        // Not JSON: not a manager line, so a bad command (an error event), never a panic.
        assert_eq!(manager_line("{\"manager\": {"), None);
        assert!(parse_command("{\"manager\": {").is_err());
    }
}
