//! [`NodeProcesses`]: the node processes of one run, started (optionally through a
//! wrapper such as `ip netns exec ns{node}` or `ssh host{node}`), driven through the
//! control protocol on their stdin and stdout (docs/cluster.md) and watched
//! continuously: a node that dies is reported by name, pid and exit status. The
//! command-line transport benchmark starts its `ambidex peer` processes through it too,
//! and only waits for them to exit.

use super::catalog::catalog_from_ready;
use super::error::{Ending, LaunchError, NodeTrouble, OutputTrouble};
use super::exit::{describe_exit, instant_of_unix_ns, reap};
use super::manager_host::{answer_line, write_line, Stdin};
use ambidex_cluster::EmbeddedManager;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ----- the launcher's side of the control protocol (docs/cluster.md) -----

/// Longest control line accepted from a node (reports are a few KiB).
const MAX_LINE: u64 = 16 << 20;

enum FromNode {
    Line(String),
    /// The node closed its stdout (it exited, or is about to), at this instant.
    Eof(Instant),
    /// A line that cannot be read (too long, not UTF-8, read error, a bad manager call).
    Bad(OutputTrouble),
}

struct NodeProc {
    child: Child,
    /// The same handle for every process of the node (a restarted one's too): the
    /// manager's pusher keeps writing to it.
    stdin: Stdin,
    /// How it was started (a restart starts the same with `--rejoin`).
    argv: Vec<String>,
    /// 1, then one more per restart.
    incarnation: u64,
    eof: bool,
    /// Died during a run that survives deaths ([`NodeProcesses::survive_deaths`]):
    /// reaped and recorded; every wait skips it.
    dead: bool,
}

/// A node process that died while deaths were survivable.
#[derive(Clone, Debug)]
pub struct Death {
    /// The node.
    pub node: u16,
    /// Its process.
    pub pid: u32,
    /// "was killed by signal 9 (SIGKILL)", "exited with status 1", ...
    pub how: String,
    /// When its control output closed.
    pub at: Instant,
}

/// A node process the launcher killed (`--kill`), or that killed itself in its commit
/// phase when told to (`in_commit`: how many coordinators were in it).
#[derive(Clone, Debug)]
pub struct Killed {
    /// The node.
    pub node: u16,
    /// Its process.
    pub pid: u32,
    /// When it died.
    pub at: Instant,
    /// The coordinators of its thread in the commit phase, for a commit-phase kill
    /// that said so.
    pub in_commit: Option<u32>,
}

/// A node process started again during the run ([`NodeProcesses::restart_at`]).
#[derive(Clone, Debug)]
pub struct Restarted {
    /// The node.
    pub node: u16,
    /// Its new process.
    pub pid: u32,
    /// Its new incarnation.
    pub incarnation: u64,
    /// When it was started.
    pub at: Instant,
}

/// A restart that did not happen because its node was alive at its time (a restart
/// with no `--kill` of its node before it waits for a death from outside).
#[derive(Clone, Debug)]
pub struct NotRestarted {
    /// The node.
    pub node: u16,
    /// The restart's time.
    pub at: Instant,
    /// Why it was not done.
    pub why: String,
}

/// A restart to do ([`NodeProcesses::restart_at`]).
#[derive(Clone, Copy, Debug)]
struct DueRestart {
    /// The node's index.
    i: usize,
    /// Not before this.
    at: Instant,
    /// The launcher kills the node before `at` (`--kill`): the restart waits for its
    /// death. Otherwise it is done only if the node is dead at `at` (killed from
    /// outside, or it died), and dropped with a note if it is alive then.
    after_kill: bool,
}

/// The cluster's membership as the launcher reads it to time a restart: the run's
/// state now (from the embedded manager, or read from etcd).
pub type StateView = Box<dyn FnMut() -> Result<ambidex_cluster::ClusterState, LaunchError>>;

/// How often a restart that waits for its node's removal reads a [`StateView`] that
/// is not free (an etcd read is a round trip to etcd).
const VIEW_POLL: Duration = Duration::from_millis(20);

/// The manager the nodes' reader threads answer calls on (set once the run starts).
type ManagerSlot = Arc<Mutex<Option<Arc<EmbeddedManager>>>>;

/// The node processes of one run, driven through their stdin/stdout. Dropping it kills
/// every node that is still running.
pub struct NodeProcesses {
    /// The node id of `procs[0]` (the others follow).
    first: u16,
    procs: Vec<NodeProc>,
    rx: std::sync::mpsc::Receiver<(u16, FromNode)>,
    /// Events that arrived while waiting for another kind (kept in order per node).
    pending: Vec<std::collections::VecDeque<serde_json::Value>>,
    manager: ManagerSlot,
    /// A node that dies is recorded in `deaths`, not a failure of the run.
    survive: bool,
    deaths: Vec<Death>,
    /// (node index, when) of the kills still to do, and those done.
    kills_due: Vec<(usize, Instant)>,
    killed: Vec<Killed>,
    /// (node index, when) of the commit-phase kills still to ask for; the nodes asked
    /// (their death is recorded as a kill); what each said as it died.
    commit_kills_due: Vec<(usize, Instant)>,
    commit_armed: Vec<usize>,
    /// Per node told to die in its commit phase: what its `dying` event said (the
    /// coordinators in the commit phase, and when it died if its clock said).
    dying: std::collections::HashMap<usize, (u32, Option<Instant>)>,
    /// The restarts still to do, those done, and those dropped (node alive).
    restarts_due: Vec<DueRestart>,
    restarted: Vec<Restarted>,
    not_restarted: Vec<NotRestarted>,
    /// Where a restart learns whether its node was removed (the embedded manager's
    /// state if unset), when it may read it next, and why its last read failed.
    view: Option<StateView>,
    view_next: Option<Instant>,
    view_error: Option<String>,
    /// Where the nodes' reader threads send (a restarted node's new one too).
    tx: std::sync::mpsc::Sender<(u16, FromNode)>,
    /// Every node's last `ready` event (a restart replaces its node's).
    readies: Vec<serde_json::Value>,
    /// When `start` was sent, and whether `measure` was (a restarted node is brought
    /// to the same phase).
    started: Option<Instant>,
    measuring: bool,
}

/// How each node process is started: `wrapper` (with `{node}` replaced by the node id)
/// is put in front of this binary and `args(node)`, e.g. `ip netns exec ns{node}` or
/// `ssh host{node}`.
pub struct Launch<'a> {
    /// The arguments of node n's process (`node --config FILE --node N`, or `peer ...`).
    pub args: &'a dyn Fn(u16) -> Vec<String>,
    /// The nodes to start.
    pub nodes: std::ops::Range<u16>,
    /// A command to start each process through, `{node}` replaced by the node id.
    pub wrapper: Option<&'a str>,
}

impl NodeProcesses {
    /// Starts the node processes `l` describes; each reads commands on its stdin and
    /// writes events on its stdout.
    pub fn spawn(l: &Launch<'_>) -> Result<NodeProcesses, LaunchError> {
        let exe = std::env::current_exe().map_err(LaunchError::OwnBinary)?;
        let (tx, rx) = std::sync::mpsc::channel();
        let mut np = NodeProcesses {
            first: l.nodes.start,
            procs: Vec::new(),
            rx,
            pending: vec![Default::default(); l.nodes.len()],
            manager: Arc::new(Mutex::new(None)),
            survive: false,
            deaths: Vec::new(),
            kills_due: Vec::new(),
            killed: Vec::new(),
            commit_kills_due: Vec::new(),
            commit_armed: Vec::new(),
            dying: Default::default(),
            restarts_due: Vec::new(),
            restarted: Vec::new(),
            not_restarted: Vec::new(),
            view: None,
            view_next: None,
            view_error: None,
            tx,
            readies: Vec::new(),
            started: None,
            measuring: false,
        };
        for (i, n) in l.nodes.clone().enumerate() {
            let mut argv: Vec<String> = match l.wrapper {
                Some(w) => w
                    .split_whitespace()
                    .map(|a| a.replace("{node}", &n.to_string()))
                    .collect(),
                None => Vec::new(),
            };
            argv.push(exe.display().to_string());
            argv.extend((l.args)(n));
            let stdin: Stdin = Arc::new(Mutex::new(None));
            let child = np.start_process(i, &argv, &stdin, 1)?;
            np.procs.push(NodeProc {
                child,
                stdin,
                argv,
                incarnation: 1,
                eof: false,
                dead: false,
            });
        }
        Ok(np)
    }

    /// Starts the process `argv` of node index `i` as incarnation `incarnation`, its
    /// stdin into `stdin` and a reader thread on its stdout.
    fn start_process(
        &self,
        i: usize,
        argv: &[String],
        stdin: &Stdin,
        incarnation: u64,
    ) -> Result<Child, LaunchError> {
        let n = self.first + i as u16;
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| LaunchError::Spawn {
                node: n,
                argv: argv.join(" "),
                source,
            })?;
        let stdout = child.stdout.take().expect("piped stdout");
        *stdin.lock().unwrap_or_else(|e| e.into_inner()) = child.stdin.take();
        let reader = Reader {
            index: i as u16,
            node: n,
            incarnation,
            stdin: stdin.clone(),
            manager: self.manager.clone(),
        };
        let tx = self.tx.clone();
        std::thread::spawn(move || read_lines(reader, stdout, tx));
        Ok(child)
    }

    /// The node processes' pids, in node order.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|p| p.child.id()).collect()
    }

    /// Every node's stdin (for the manager's pusher).
    pub fn stdins(&self) -> Vec<Stdin> {
        self.procs.iter().map(|p| p.stdin.clone()).collect()
    }

    /// From now on the nodes' manager calls are answered on `m`.
    pub fn answer_manager_calls(&self, m: Arc<EmbeddedManager>) {
        *self.manager.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
    }

    /// From now on (`true`) a node that dies is recorded ([`NodeProcesses::deaths`])
    /// and skipped by every wait, not a failure of the run; `false` restores the
    /// default (any death fails the run).
    pub fn survive_deaths(&mut self, on: bool) {
        self.survive = on;
    }

    /// The nodes that died while deaths were survivable.
    pub fn deaths(&self) -> &[Death] {
        &self.deaths
    }

    /// The nodes whose current process is dead (a restarted node's new one alive is
    /// not), as a bit set over node ids.
    pub fn dead_nodes(&self) -> u64 {
        self.procs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.dead)
            .fold(0, |m, (i, _)| m | 1 << (self.first as usize + i))
    }

    /// The nodes killed so far by [`NodeProcesses::kill_at`].
    pub fn killed(&self) -> &[Killed] {
        &self.killed
    }

    /// Kills node `node` (SIGKILL to the process the launcher started) at `at`, while
    /// the launcher watches the run ([`NodeProcesses::watch`]).
    pub fn kill_at(&mut self, node: u16, at: Instant) -> Result<(), LaunchError> {
        let i = self.index_of(node)?;
        self.kills_due.push((i, at));
        Ok(())
    }

    /// Asks node `node`, at `at`, to SIGKILL itself the next time one of its
    /// coordinators is in the commit phase (`die_in_commit`, docs/cluster.md); its
    /// death is then recorded as a kill, like [`NodeProcesses::kill_at`]'s.
    pub fn kill_in_commit_at(&mut self, node: u16, at: Instant) -> Result<(), LaunchError> {
        let i = self.index_of(node)?;
        self.commit_kills_due.push((i, at));
        Ok(())
    }

    /// Starts node `node` again, not before `at`, once it is dead and the manager
    /// removed it (stage Run of a configuration without it): a new process of the same
    /// id with an empty database, which joins as the next incarnation. `after_kill`:
    /// the launcher kills it before `at` ([`NodeProcesses::kill_at`]), and the restart
    /// waits for that death; otherwise the node must be dead at `at` (killed from
    /// outside, by its pid, or dead of anything), and if it is alive then the restart
    /// is not done ([`NodeProcesses::not_restarted`]). Done while the launcher watches
    /// the run.
    pub fn restart_at(
        &mut self,
        node: u16,
        at: Instant,
        after_kill: bool,
    ) -> Result<(), LaunchError> {
        let i = self.index_of(node)?;
        self.restarts_due.push(DueRestart { i, at, after_kill });
        Ok(())
    }

    /// Restarts learn the membership from `view` (read at most every 20 ms), not from
    /// the embedded manager: with etcd, the state etcd holds.
    pub fn restart_view(&mut self, view: StateView) {
        self.view = Some(view);
    }

    /// The nodes restarted so far.
    pub fn restarted(&self) -> &[Restarted] {
        &self.restarted
    }

    /// The restarts dropped because their node was alive at their time.
    pub fn not_restarted(&self) -> &[NotRestarted] {
        &self.not_restarted
    }

    /// Restarts still to do (a run that ends with some did not do them).
    pub fn restarts_pending(&self) -> usize {
        self.restarts_due.len()
    }

    /// Why the last read of the membership for a restart failed, if it did.
    pub fn restart_view_error(&self) -> Option<&str> {
        self.view_error.as_deref()
    }

    fn index_of(&self, node: u16) -> Result<usize, LaunchError> {
        node.checked_sub(self.first)
            .map(|i| i as usize)
            .filter(|&i| i < self.procs.len())
            .ok_or(LaunchError::NotANode { node })
    }

    /// Sends `die_in_commit` to the nodes whose commit-phase kill is due.
    fn do_commit_kills(&mut self) {
        let now = Instant::now();
        let due: Vec<usize> = self
            .commit_kills_due
            .iter()
            .filter(|k| k.1 <= now)
            .map(|k| k.0)
            .collect();
        self.commit_kills_due.retain(|k| k.1 > now);
        for i in due {
            if self.procs[i].dead {
                continue;
            }
            if write_line(&self.procs[i].stdin, r#"{"cmd":"die_in_commit"}"#) {
                self.commit_armed.push(i);
                eprintln!(
                    "ambidex: node {} told to die in its commit phase",
                    self.first as usize + i
                );
            }
        }
    }

    /// Drops the restarts due whose node is alive at their time and that wait for no
    /// kill of the launcher's: a note on stderr and in [`NodeProcesses::not_restarted`].
    fn drop_restarts_of_live_nodes(&mut self, now: Instant) {
        let mut k = 0;
        while k < self.restarts_due.len() {
            let r = self.restarts_due[k];
            let p = &mut self.procs[r.i];
            // Exited but not seen yet (its closed output is on its way): dead.
            let alive = !p.dead && matches!(p.child.try_wait(), Ok(None));
            if r.at > now || r.after_kill || !alive {
                k += 1;
                continue;
            }
            self.restarts_due.remove(k);
            let node = self.first + r.i as u16;
            let why = format!(
                "node {node} (pid {}) was alive at its restart time: not restarted (a \
                 restart without a --kill of the node before it restarts a node that died \
                 or was killed from outside)",
                p.child.id()
            );
            eprintln!("ambidex: note: {why}");
            self.not_restarted.push(NotRestarted {
                node,
                at: r.at,
                why,
            });
        }
    }

    /// The membership now, for a restart: from the view if there is one (`None` if
    /// it is not time to read it again, or the read failed: the restart waits), else
    /// from the embedded manager.
    fn membership_now(
        &mut self,
        now: Instant,
    ) -> Result<Option<ambidex_cluster::ClusterState>, LaunchError> {
        if let Some(view) = &mut self.view {
            if self.view_next.is_some_and(|t| now < t) {
                return Ok(None);
            }
            self.view_next = Some(now + VIEW_POLL);
            return Ok(match view() {
                Ok(s) => {
                    self.view_error = None;
                    Some(s)
                }
                // Unreachable for a moment: the restart waits; if it never comes, the
                // run's end says why.
                Err(e) => {
                    self.view_error = Some(e.to_string());
                    None
                }
            });
        }
        let m = self
            .manager
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(LaunchError::NoManager)?;
        Ok(Some(m.state()))
    }

    /// Does the restart that is due, if its node is dead and removed (at most one per
    /// call: each waits for its node's `ready` and the others' catalog updates).
    fn do_restarts(&mut self) -> Result<(), LaunchError> {
        let now = Instant::now();
        self.drop_restarts_of_live_nodes(now);
        let Some(pos) = self
            .restarts_due
            .iter()
            .position(|r| r.at <= now && self.procs[r.i].dead)
        else {
            return Ok(());
        };
        let i = self.restarts_due[pos].i;
        let node = self.first + i as u16;
        let Some(state) = self.membership_now(now)? else {
            return Ok(());
        };
        // Its descriptors change in the others' catalogs: not while the dead
        // incarnation is a member (a thread filling its caches would reach the new,
        // empty regions in an epoch that still counts the old copies), and only once
        // every member entered the configuration without it (stage Run).
        if state.stage != ambidex_cluster::Stage::Run || state.config.placement.is_member(node) {
            return Ok(());
        }
        self.restarts_due.remove(pos);
        self.restart(i, state.config)
    }

    /// Starts node index `i` again (its process is dead and reaped) in the cluster's
    /// configuration `config`: a new process with `--rejoin`, then its `ready`, the new
    /// descriptors in every survivor's catalog (acknowledged), the whole catalog to it,
    /// and the run's phase (`start`, `measure`).
    fn restart(
        &mut self,
        i: usize,
        config: ambidex_cluster::Configuration,
    ) -> Result<(), LaunchError> {
        let node = self.first + i as u16;
        let incarnation = config
            .incarnations
            .get(node as usize)
            .map(|k| k + 1)
            .ok_or(LaunchError::NotInConfiguration { node })?;
        let mut argv = self.procs[i].argv.clone();
        argv.push("--rejoin".into());
        if !argv.iter().any(|a| a == "--no-progress") {
            argv.push("--no-progress".into());
        }
        let at = Instant::now();
        let stdin = self.procs[i].stdin.clone();
        let child = self.start_process(i, &argv, &stdin, incarnation)?;
        let p = &mut self.procs[i];
        p.child = child;
        p.incarnation = incarnation;
        p.eof = false;
        p.dead = false;
        self.pending[i].clear();
        let pid = self.procs[i].child.id();
        eprintln!("ambidex: restarting node {node} (pid {pid}) as incarnation {incarnation}");
        let run_ms = self
            .started
            .map_or(0, |t| at.saturating_duration_since(t).as_millis() as u64);
        let msg = serde_json::json!({
            "cmd": "rejoin", "config": config, "incarnation": incarnation, "run_ms": run_ms,
        });
        if !write_line(&stdin, &msg.to_string()) {
            return Err(self.failure(i as u16, NodeTrouble::NotSent("\"rejoin\"".into())));
        }
        let ready = self
            .wait_some(&[i], "ready", Duration::from_secs(120))?
            .pop()
            .map(|(_, v)| v)
            .ok_or(LaunchError::DiedAgain { node })?;
        // The cluster's policy, as every node's at the start.
        if let Some(other) = self.readies.iter().enumerate().find(|(j, _)| *j != i) {
            if ready.get("policy") != other.1.get("policy") {
                return Err(self.failure(i as u16, NodeTrouble::OtherPolicy));
            }
        }
        if self.readies.len() != self.procs.len() {
            return Err(LaunchError::NoReadies);
        }
        self.readies[i] = ready.clone();
        let nodes = self.first + self.procs.len() as u16;
        let catalog =
            catalog_from_ready(&self.readies[..], self.first, nodes).map_err(|source| {
                self.fail_all(LaunchError::Catalog {
                    restarting: Some(node),
                    source,
                })
            })?;
        // The survivors first: the new descriptors are in every catalog before the new
        // incarnation can join (it asks at `start`).
        let replace = serde_json::json!({
            "cmd": "replace_node", "node": node,
            "tables": ready.get("tables"), "log_region": ready.get("log_region"),
        })
        .to_string();
        let survivors: Vec<usize> = (0..self.procs.len())
            .filter(|&j| j != i && !self.procs[j].dead)
            .collect();
        for &j in &survivors {
            // A survivor dying now is recorded by its closed output.
            write_line(&self.procs[j].stdin, &replace);
        }
        self.wait_some(&survivors, "catalog_replaced", Duration::from_secs(30))?;
        let mut cmds = vec![
            serde_json::json!({ "cmd": "catalog", "catalog": catalog }).to_string(),
            r#"{"cmd":"start"}"#.to_string(),
        ];
        if self.measuring {
            cmds.push(r#"{"cmd":"measure"}"#.to_string());
        }
        for c in cmds {
            if !write_line(&stdin, &c) && !self.survive {
                return Err(self.failure(
                    i as u16,
                    NodeTrouble::NotSent("its catalog and start".into()),
                ));
            }
        }
        self.restarted.push(Restarted {
            node,
            pid,
            incarnation,
            at,
        });
        Ok(())
    }

    /// Does the kills that are due.
    fn do_kills(&mut self) {
        let now = Instant::now();
        let due: Vec<usize> = self
            .kills_due
            .iter()
            .filter(|k| k.1 <= now)
            .map(|k| k.0)
            .collect();
        self.kills_due.retain(|k| k.1 > now);
        for i in due {
            let p = &mut self.procs[i];
            if p.dead || !matches!(p.child.try_wait(), Ok(None)) {
                continue;
            }
            let pid = p.child.id();
            // Child::kill is SIGKILL: the node gets no chance to say goodbye, as in a
            // machine failure. Its death is then seen like any other (its output closes).
            if p.child.kill().is_ok() {
                ambidex_cluster::rectrace!("kill node {}", self.first as usize + i);
                eprintln!(
                    "ambidex: killed node {} (pid {pid})",
                    self.first as usize + i
                );
                self.killed.push(Killed {
                    node: self.first + i as u16,
                    pid,
                    at: Instant::now(),
                    in_commit: None,
                });
            }
        }
    }

    /// When the next kill (or commit-phase kill, or restart) is due; soon, while a
    /// restart due waits for its node's death and removal.
    fn next_kill(&self) -> Option<Instant> {
        let now = Instant::now();
        let restart = self
            .restarts_due
            .iter()
            .map(|r| r.at.max(now + Duration::from_millis(2)))
            .min();
        self.kills_due
            .iter()
            .chain(&self.commit_kills_due)
            .map(|k| k.1)
            .chain(restart)
            .min()
    }

    /// CPU seconds the node processes have used so far.
    pub fn cpu_seconds(&self) -> f64 {
        self.procs
            .iter()
            .map(|p| ambidex_transport::cputime::pid_cpu_seconds(p.child.id()))
            .sum()
    }

    /// Sends `{"cmd": CMD}` to every node.
    pub fn send_all(&mut self, cmd: &str) -> Result<(), LaunchError> {
        self.send_all_json(&serde_json::json!({ "cmd": cmd }))
    }

    /// Sends the command object `msg` (one line) to every node (every live one, while
    /// deaths are survivable).
    pub fn send_all_json(&mut self, msg: &serde_json::Value) -> Result<(), LaunchError> {
        let cmd = msg["cmd"].as_str().unwrap_or("?").to_string();
        match cmd.as_str() {
            "start" => self.started = Some(Instant::now()),
            "measure" => self.measuring = true,
            "stop" => self.measuring = false,
            _ => {}
        }
        let line = msg.to_string();
        for n in 0..self.procs.len() {
            if self.procs[n].dead {
                continue;
            }
            // A node dying now fails the write; while deaths are survivable its closed
            // output, which follows, records it (and the waits skip it).
            if !write_line(&self.procs[n].stdin, &line) && !self.survive {
                return Err(self.failure(n as u16, NodeTrouble::NotSent(format!("{cmd:?}"))));
            }
        }
        Ok(())
    }

    /// Waits until every node has sent event `event`; returns them in node order. A
    /// node that dies, reports an error or stays silent past `timeout` fails the wait.
    pub fn wait_all(
        &mut self,
        event: &str,
        timeout: Duration,
    ) -> Result<Vec<serde_json::Value>, LaunchError> {
        let got = self.wait_live(event, timeout)?;
        if event == "ready" {
            self.readies = got.iter().map(|(_, v)| v.clone()).collect();
        }
        if got.len() != self.procs.len() {
            return Err(LaunchError::Partial {
                event: event.into(),
                got: got.len(),
                of: self.procs.len(),
            });
        }
        Ok(got.into_iter().map(|(_, v)| v).collect())
    }

    /// As [`NodeProcesses::wait_all`], from the live nodes only while deaths are
    /// survivable (a node that dies meanwhile is recorded and no longer waited for):
    /// (node, event) in node order.
    pub fn wait_live(
        &mut self,
        event: &str,
        timeout: Duration,
    ) -> Result<Vec<(u16, serde_json::Value)>, LaunchError> {
        let all: Vec<usize> = (0..self.procs.len()).collect();
        self.wait_some(&all, event, timeout)
    }

    /// As [`NodeProcesses::wait_live`], from the node indices `which` (in order) only.
    fn wait_some(
        &mut self,
        which: &[usize],
        event: &str,
        timeout: Duration,
    ) -> Result<Vec<(u16, serde_json::Value)>, LaunchError> {
        let deadline = Instant::now() + timeout;
        let mut got: Vec<(usize, Option<serde_json::Value>)> =
            which.iter().map(|&i| (i, None)).collect();
        loop {
            for (i, slot) in got.iter_mut() {
                if slot.is_none() && !self.procs[*i].dead {
                    if let Some(v) = self.take_pending(*i, event)? {
                        *slot = Some(v);
                    }
                }
            }
            if got.iter().all(|(i, v)| v.is_some() || self.procs[*i].dead) {
                return Ok(got
                    .into_iter()
                    .filter_map(|(i, v)| v.map(|v| (self.first + i as u16, v)))
                    .collect());
            }
            if let Some(&(i, _)) = got
                .iter()
                .find(|(i, v)| v.is_none() && self.procs[*i].eof && !self.procs[*i].dead)
            {
                return Err(self.failure(
                    i as u16,
                    NodeTrouble::DiedBefore {
                        event: event.into(),
                    },
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                let silent: Vec<usize> = got
                    .iter()
                    .filter(|(i, v)| v.is_none() && !self.procs[*i].dead)
                    .map(|g| g.0)
                    .collect();
                let trouble = NodeTrouble::Silent {
                    event: event.into(),
                    seconds: timeout.as_secs_f64(),
                    silent: silent.iter().map(|&i| self.first + i as u16).collect(),
                };
                return Err(self.failure(silent.first().copied().unwrap_or(0) as u16, trouble));
            }
            self.pump(deadline - now)?;
        }
    }

    /// Lets `d` pass while watching the nodes (and doing the kills due): any error, or
    /// a death unless deaths are survivable, ends it early.
    pub fn watch(&mut self, d: Duration) -> Result<(), LaunchError> {
        let deadline = Instant::now() + d;
        loop {
            self.do_kills();
            self.do_commit_kills();
            self.do_restarts()?;
            for i in 0..self.procs.len() {
                // Nothing is expected now: an event here is an error report, or early.
                if let Some(msg) = self.pending[i].front().and_then(error_report) {
                    return Err(self.failure(i as u16, NodeTrouble::Reported(msg)));
                }
            }
            if let Some(i) =
                (0..self.procs.len()).find(|&i| self.procs[i].eof && !self.procs[i].dead)
            {
                return Err(self.failure(i as u16, NodeTrouble::DiedDuringRun));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            let until = self.next_kill().map_or(deadline, |k| k.min(deadline));
            self.pump(until.saturating_duration_since(now))?;
        }
    }

    /// Receives what the nodes sent within `d` into the pending queues.
    fn pump(&mut self, d: Duration) -> Result<(), LaunchError> {
        let first = match self.rx.recv_timeout(d.min(Duration::from_millis(100))) {
            Ok(m) => m,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Ok(()),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(LaunchError::AllOutputsClosed)
            }
        };
        let mut msgs = vec![first];
        while let Ok(m) = self.rx.try_recv() {
            msgs.push(m);
        }
        for (n, m) in msgs {
            match m {
                FromNode::Line(line) => {
                    let v: serde_json::Value = match serde_json::from_str(&line) {
                        Ok(v @ serde_json::Value::Object(_)) => v,
                        _ => {
                            let shown: String = line.chars().take(200).collect();
                            return Err(self.failure(n, NodeTrouble::Malformed(shown)));
                        }
                    };
                    if v.get("event").and_then(|e| e.as_str()).is_none() {
                        return Err(self.failure(n, NodeTrouble::NoEvent));
                    }
                    if v["event"] == "dying" {
                        // Its last words before a commit-phase SIGKILL: kept for the
                        // kill's record, not an event anything waits for.
                        let c = v["in_commit"].as_u64().unwrap_or(0);
                        let at = v["at_unix_ns"].as_u64().and_then(instant_of_unix_ns);
                        self.dying
                            .insert(n as usize, (u32::try_from(c).unwrap_or(u32::MAX), at));
                        continue;
                    }
                    if let Some(q) = self.pending.get_mut(n as usize) {
                        q.push_back(v);
                    }
                }
                FromNode::Bad(why) => return Err(self.failure(n, why.into())),
                FromNode::Eof(at) => {
                    // Events it sent before closing are still honoured by the waits;
                    // a node that closes while something is expected of it has failed
                    // (unless deaths are survivable: then it is recorded).
                    if let Some(p) = self.procs.get_mut(n as usize) {
                        p.eof = true;
                    }
                    if self.survive {
                        self.record_death(n as usize, at);
                    }
                }
            }
        }
        Ok(())
    }

    /// Node `i`'s output closed at `at` while deaths are survivable: reap it and record
    /// how it ended.
    fn record_death(&mut self, i: usize, at: Instant) {
        let Some(p) = self.procs.get_mut(i) else {
            return;
        };
        if p.dead {
            return;
        }
        p.dead = true;
        *p.stdin.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let how = match reap(&mut p.child, Duration::from_secs(2)) {
            Some(st) => describe_exit(st),
            // Its output closed but it runs on: it cannot be driven any more.
            None => {
                let _ = p.child.kill();
                let _ = p.child.wait();
                "closed its control output and was killed".to_string()
            }
        };
        // A commit-phase kill said when it happened: its closed output may be seen
        // much later (tens of ms on a loaded host), which would skew the recovery times.
        let said = self.dying.get(&i).and_then(|d| d.1);
        let at = said.map_or(at, |t| t.min(at));
        let death = Death {
            node: self.first + i as u16,
            pid: p.child.id(),
            how,
            at,
        };
        eprintln!(
            "ambidex: node {} (pid {}) {}; the run goes on without it",
            death.node, death.pid, death.how
        );
        // A node told to die in its commit phase: its death is that kill (whatever
        // ended it; `in_commit` says what it reported, if it did).
        if let Some(k) = self.commit_armed.iter().position(|&j| j == i) {
            self.commit_armed.remove(k);
            self.killed.push(Killed {
                node: death.node,
                pid: death.pid,
                at,
                in_commit: self.dying.remove(&i).map(|d| d.0),
            });
        }
        self.deaths.push(death);
    }

    /// Takes node `i`'s next event if it is `event`; an `error` event fails.
    fn take_pending(
        &mut self,
        i: usize,
        event: &str,
    ) -> Result<Option<serde_json::Value>, LaunchError> {
        let Some(front) = self.pending[i].front() else {
            return Ok(None);
        };
        if let Some(msg) = error_report(front) {
            return Err(self.failure(i as u16, NodeTrouble::Reported(msg)));
        }
        let kind = front.get("event").and_then(|e| e.as_str()).unwrap_or("");
        if kind == event {
            return Ok(self.pending[i].pop_front());
        }
        let trouble = NodeTrouble::Unexpected {
            got: kind.into(),
            want: event.into(),
        };
        Err(self.failure(i as u16, trouble))
    }

    /// Waits for every node to exit by itself within `grace`; a node that does not,
    /// or exits with a failure, is an error.
    /// `when` ends the message ("after its report").
    pub fn wait_exits(&mut self, grace: Duration, when: &str) -> Result<(), LaunchError> {
        for p in &mut self.procs {
            *p.stdin.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        let deadline = Instant::now() + grace;
        for n in 0..self.procs.len() {
            if self.procs[n].dead {
                continue;
            }
            loop {
                match self.procs[n].child.try_wait() {
                    Ok(Some(st)) if st.success() => break,
                    Ok(Some(st)) => {
                        return Err(self.fail_all(LaunchError::Exit {
                            node: self.first + n as u16,
                            pid: self.procs[n].child.id(),
                            ending: Ending::Exited(st),
                            when: when.into(),
                        }));
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => {
                        return Err(self.fail_all(LaunchError::Exit {
                            node: self.first + n as u16,
                            pid: self.procs[n].child.id(),
                            ending: Ending::Running,
                            when: when.into(),
                        }))
                    }
                }
            }
        }
        Ok(())
    }

    /// The failure of node `n` as a message naming it and how it ended, after killing
    /// every node.
    fn failure(&mut self, n: u16, trouble: NodeTrouble) -> LaunchError {
        let pid = self
            .procs
            .get(n as usize)
            .map(|p| p.child.id())
            .unwrap_or(0);
        // Give a node that is exiting a moment to be reaped, so its status is known.
        let status = self
            .procs
            .get_mut(n as usize)
            .and_then(|p| reap(&mut p.child, Duration::from_secs(2)));
        let ending = status.map_or(Ending::KilledRunning, Ending::Exited);
        let node = self.first + n;
        self.fail_all(LaunchError::Node {
            node,
            pid,
            trouble,
            ending,
        })
    }

    /// `e`, after killing every node.
    fn fail_all(&mut self, e: LaunchError) -> LaunchError {
        self.kill_all();
        e
    }

    /// Kills every node still running and reaps them.
    pub fn kill_all(&mut self) {
        for p in &mut self.procs {
            *p.stdin.lock().unwrap_or_else(|e| e.into_inner()) = None;
            if let Ok(None) = p.child.try_wait() {
                let _ = p.child.kill();
            }
            let _ = p.child.wait();
        }
    }
}

impl Drop for NodeProcesses {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// What a node's reader thread needs: which node it reads, and how to answer its
/// manager calls (on its own thread: the main thread may be busy for a while, and a
/// renewal cannot wait).
struct Reader {
    /// The node's index in `procs`.
    index: u16,
    node: u16,
    /// Which incarnation of the node this process is (its manager calls are that
    /// incarnation's).
    incarnation: u64,
    stdin: Stdin,
    manager: ManagerSlot,
}

impl Reader {
    /// Answers `line` if it is a manager call (`Ok(true)`); an unreadable call, or a
    /// call with no manager, is an error.
    fn manager_call(&self, line: &str) -> Result<bool, OutputTrouble> {
        let Ok(mut v) = serde_json::from_str::<serde_json::Value>(line) else {
            return Ok(false);
        };
        if v.get("event").and_then(|e| e.as_str()) != Some("manager") {
            return Ok(false);
        }
        let m = self
            .manager
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(OutputTrouble::NoManager)?;
        ambidex_cluster::rectrace!("launcher call node {} {}", self.node, v["manager"]["call"]);
        let answer = answer_line(&m, self.node, self.incarnation, &v["manager"].take())
            .map_err(OutputTrouble::BadManagerCall)?;
        // A closed stdin is a dying node: its closed output follows.
        write_line(&self.stdin, &answer);
        Ok(true)
    }
}

fn read_lines(
    reader: Reader,
    out: std::process::ChildStdout,
    tx: std::sync::mpsc::Sender<(u16, FromNode)>,
) {
    use std::io::{BufRead, Read};
    // This thread answers the node's lease renewals (with the manager on): it runs at
    // the priority of the lease threads (the agent, the manager's ticker).
    ambidex_cluster::priority::raise_lease_thread();
    let n = reader.index;
    let mut r = std::io::BufReader::new(out);
    loop {
        let mut buf = Vec::new();
        match (&mut r).take(MAX_LINE).read_until(b'\n', &mut buf) {
            Ok(0) => {
                let _ = tx.send((n, FromNode::Eof(Instant::now())));
                return;
            }
            Ok(_) if buf.last() != Some(&b'\n') && buf.len() as u64 >= MAX_LINE => {
                let _ = tx.send((n, FromNode::Bad(OutputTrouble::TooLong(MAX_LINE))));
                return;
            }
            Ok(_) => {
                let msg = match String::from_utf8(buf) {
                    Ok(s) => match reader.manager_call(s.trim_end()) {
                        Ok(true) => continue,
                        Ok(false) => FromNode::Line(s.trim_end().to_string()),
                        Err(e) => FromNode::Bad(e),
                    },
                    Err(_) => FromNode::Bad(OutputTrouble::NotUtf8),
                };
                let stop = matches!(msg, FromNode::Bad(_));
                if tx.send((n, msg)).is_err() || stop {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send((n, FromNode::Bad(OutputTrouble::Unreadable(e))));
                return;
            }
        }
    }
}

/// The message of a node's `error` event (None for any other event).
fn error_report(ev: &serde_json::Value) -> Option<String> {
    if ev.get("event").and_then(|e| e.as_str()) != Some("error") {
        return None;
    }
    let msg = ev.get("message").and_then(|m| m.as_str());
    Some(msg.unwrap_or("(no message)").to_string())
}
