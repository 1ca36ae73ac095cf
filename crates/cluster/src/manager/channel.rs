//! A [`ManagerClient`] over a node's control channel (a line-based channel to whoever
//! hosts the manager: the launcher of a multi-process run, over the node's
//! stdin/stdout). Transport-agnostic: the client sends a line through a function it is
//! given, and whoever reads the channel hands it the manager's lines
//! ([`ChannelInbox::deliver`]).
//!
//! What crosses the channel (each the JSON object under the line's `"manager"` key):
//!
//! ```text
//! node → manager   {"id":N,"call":"renew"}            a Request, numbered
//! manager → node   {"id":N,"answer":"granted",...}    the Response to call N
//! manager → node   {"push":{ClusterState}}            every new state, unasked
//! ```
//!
//! Calls are request/response with a bound: no answer within `timeout` is
//! [`ManagerError::Unreachable`] (a late answer is then a stray one, dropped). The
//! state is not asked for: the manager pushes each new one, and
//! [`ManagerClient::state_after`] waits here for a pushed state past the revision (a
//! node that polled the manager across a pipe would add a round trip to every stage).

use super::{ManagerClient, ManagerError, Request, Response};
use crate::membership::{ClusterState, Grant, Stage};
use ambidex_transport::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A numbered call or answer (the `id` beside the call's or answer's own fields).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Numbered<T> {
    pub id: u64,
    #[serde(flatten)]
    pub body: T,
}

/// What the manager's side sends a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToNode {
    Answer(Numbered<Response>),
    Push(Box<ClusterState>),
}

impl ToNode {
    /// The JSON object that goes under the line's `"manager"` key.
    pub fn to_value(&self) -> serde_json::Value {
        match self {
            ToNode::Answer(a) => serde_json::to_value(a).unwrap_or_default(),
            ToNode::Push(s) => serde_json::json!({ "push": s }),
        }
    }

    /// Reads what [`ToNode::to_value`] wrote.
    pub fn from_value(v: &serde_json::Value) -> Result<ToNode, ChannelError> {
        let bad = |e: serde_json::Error| ChannelError::Garbled(e.to_string());
        match v.get("push") {
            Some(s) => Ok(ToNode::Push(Box::new(
                ClusterState::deserialize(s).map_err(bad)?,
            ))),
            None => Ok(ToNode::Answer(
                Numbered::<Response>::deserialize(v).map_err(bad)?,
            )),
        }
    }
}

/// A manager line this node could not use. Counted ([`ChannelInbox::bad_lines`]) and
/// returned to the reader, never a panic: the line came from another process.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    #[error("a manager line that makes no sense: {0}")]
    Garbled(String),
    #[error("an answer to call {0}, which is not waiting (late, or never made)")]
    Stray(u64),
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// Calls sent and not yet answered or given up.
    waiting: HashSet<u64>,
    answers: HashMap<u64, Response>,
    latest: Option<ClusterState>,
    bad_lines: u64,
    closed: bool,
}

struct Shared {
    inner: Mutex<Inner>,
    /// Signalled at every answer, push and close.
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The receiving end: the channel's reader hands it every manager line.
#[derive(Clone)]
pub struct ChannelInbox {
    shared: Arc<Shared>,
}

impl ChannelInbox {
    /// A fresh channel's inbox; [`ChannelInbox::client`] makes its client.
    pub fn new() -> ChannelInbox {
        ChannelInbox {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    next_id: 1,
                    ..Default::default()
                }),
                changed: Condvar::new(),
            }),
        }
    }

    /// The client of node `node` (for messages), sending its lines through `send` and
    /// giving up on a call unanswered for `timeout`.
    pub fn client(&self, node: NodeId, send: SendLine, timeout: Duration) -> ChannelClient {
        ChannelClient {
            shared: self.shared.clone(),
            node,
            send,
            timeout,
        }
    }

    /// Takes one manager message (the object under the line's `"manager"` key).
    pub fn deliver(&self, v: &serde_json::Value) -> Result<(), ChannelError> {
        let msg = ToNode::from_value(v);
        let mut g = self.shared.lock();
        let r = match msg {
            Ok(ToNode::Push(s)) => {
                // States only move forward; a reordered older one is ignored.
                if g.latest.as_ref().is_none_or(|l| s.revision > l.revision) {
                    g.latest = Some(*s);
                }
                Ok(())
            }
            Ok(ToNode::Answer(a)) => {
                if g.waiting.remove(&a.id) {
                    g.answers.insert(a.id, a.body);
                    Ok(())
                } else {
                    Err(ChannelError::Stray(a.id))
                }
            }
            Err(e) => Err(e),
        };
        if r.is_err() {
            g.bad_lines += 1;
        }
        drop(g);
        self.shared.changed.notify_all();
        r
    }

    /// The channel is gone (end of input): every call fails at once from now on.
    pub fn close(&self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
    }

    /// Manager lines refused so far (garbled or stray).
    pub fn bad_lines(&self) -> u64 {
        self.shared.lock().bad_lines
    }
}

impl Default for ChannelInbox {
    fn default() -> Self {
        ChannelInbox::new()
    }
}

/// Sends one manager message (the object to put under the line's `"manager"` key); an
/// error means the channel is closed.
pub type SendLine = Box<dyn FnMut(serde_json::Value) -> Result<(), SendLineError> + Send>;

/// Why a [`SendLine`] could not send a manager message (the call then fails as
/// [`ManagerError::Unreachable`]).
#[derive(Debug, thiserror::Error)]
pub enum SendLineError {
    /// Writing the line failed (the pipe or file under the channel is closed or broken).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The channel's other end is gone (an in-memory channel whose receiver was dropped).
    #[error("the control channel is closed")]
    Closed,
}

/// A node's [`ManagerClient`] over its control channel.
pub struct ChannelClient {
    shared: Arc<Shared>,
    node: NodeId,
    send: SendLine,
    timeout: Duration,
}

impl ChannelClient {
    fn unreachable(&self, why: impl std::fmt::Display) -> ManagerError {
        ManagerError::Unreachable(format!("node {}: {why}", self.node))
    }

    /// Sends `req` and waits for its answer (up to the timeout).
    fn call(&mut self, req: Request) -> Result<Response, ManagerError> {
        let id = {
            let mut g = self.shared.lock();
            if g.closed {
                return Err(self.unreachable("the control channel is closed"));
            }
            let id = g.next_id;
            g.next_id += 1;
            g.waiting.insert(id);
            id
        };
        let msg = serde_json::to_value(Numbered { id, body: req }).unwrap_or_default();
        if let Err(e) = (self.send)(msg) {
            self.shared.lock().waiting.remove(&id);
            return Err(self.unreachable(format!("sending a call: {e}")));
        }
        let deadline = Instant::now() + self.timeout;
        let mut g = self.shared.lock();
        loop {
            if let Some(a) = g.answers.remove(&id) {
                return match a {
                    Response::Refused { refusal } => Err(ManagerError::Refused(refusal)),
                    other => Ok(other),
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if g.closed || left.is_zero() {
                g.waiting.remove(&id);
                drop(g);
                let why = format!("no answer to call {id} within {:?}", self.timeout);
                return Err(self.unreachable(why));
            }
            g = self
                .shared
                .changed
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn done(&mut self, req: Request) -> Result<(), ManagerError> {
        match self.call(req)? {
            Response::Done => Ok(()),
            other => Err(ManagerError::Protocol(format!(
                "expected done, got {other:?}"
            ))),
        }
    }
}

impl ManagerClient for ChannelClient {
    fn renew(&mut self) -> Result<Grant, ManagerError> {
        match self.call(Request::Renew)? {
            Response::Granted { grant } => Ok(grant),
            other => Err(ManagerError::Protocol(format!(
                "expected a grant, got {other:?}"
            ))),
        }
    }

    fn state_after(
        &mut self,
        revision: u64,
        wait: Duration,
    ) -> Result<Option<ClusterState>, ManagerError> {
        let deadline = Instant::now() + wait;
        let mut g = self.shared.lock();
        loop {
            if let Some(s) = g.latest.as_ref().filter(|s| s.revision > revision) {
                crate::rectrace!(
                    "node {} agent state rev {} epoch {} stage {:?}",
                    self.node,
                    s.revision,
                    s.config.epoch,
                    s.stage
                );
                return Ok(Some(s.clone()));
            }
            if g.closed {
                drop(g);
                return Err(self.unreachable("the control channel is closed"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            g = self
                .shared
                .changed
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn ack(&mut self, epoch: u32, stage: Stage) -> Result<(), ManagerError> {
        crate::rectrace!("node {} agent ack {epoch} {stage:?}", self.node);
        let r = self.done(Request::Ack { epoch, stage });
        crate::rectrace!("node {} agent acked {epoch} {stage:?}", self.node);
        r
    }

    fn suspect(&mut self, node: NodeId) -> Result<(), ManagerError> {
        self.done(Request::Suspect { node })
    }

    fn synced(&mut self, partitions: &[u32]) -> Result<(), ManagerError> {
        self.done(Request::Synced {
            partitions: partitions.to_vec(),
        })
    }

    fn join(&mut self) -> Result<(), ManagerError> {
        self.done(Request::Join)
    }
}

/// The manager's side of one node's channel: answers the node's call `msg` (the object
/// under its line's `"manager"` key) on `client`, the node's handle on the manager.
/// `Err` for a call that cannot be read. A `state-after` call is answered at once,
/// without waiting: states are pushed, and whoever answers a node's calls (the reader
/// of its channel) must not block its other calls.
pub fn answer_call(
    msg: &serde_json::Value,
    client: &mut dyn ManagerClient,
) -> Result<ToNode, ChannelError> {
    let call = Numbered::<Request>::deserialize(msg)
        .map_err(|e| ChannelError::Garbled(format!("a manager call: {e}")))?;
    let body = match call.body {
        Request::StateAfter { revision, .. } => Request::StateAfter {
            revision,
            wait_ms: 0,
        },
        other => other,
    };
    Ok(ToNode::Answer(Numbered {
        id: call.id,
        body: body.answer(client),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Configuration;
    use crate::manager::embedded::EmbeddedManager;
    use crate::membership::Refusal;
    use ambidex_transport::clock::SystemClock;
    use std::sync::mpsc;

    /// A node's client and the manager's side joined in memory: a thread answers every
    /// call on `m`'s client of node `node`, as the launcher does.
    fn pair(m: &EmbeddedManager, node: NodeId, timeout: Duration) -> (ChannelClient, ChannelInbox) {
        let inbox = ChannelInbox::new();
        let (tx, rx) = mpsc::channel::<serde_json::Value>();
        let mut mc = m.client(node, 1);
        let back = inbox.clone();
        std::thread::spawn(move || {
            for msg in rx {
                let a = answer_call(&msg, &mut mc).unwrap();
                let _ = back.deliver(&a.to_value());
            }
        });
        let client = inbox.client(
            node,
            Box::new(move |v| tx.send(v).map_err(|_| SendLineError::Closed)),
            timeout,
        );
        (client, inbox)
    }

    fn manager() -> EmbeddedManager {
        EmbeddedManager::start(
            Configuration::initial(3, 3).unwrap(),
            Duration::from_millis(200),
            SystemClock::shared(),
        )
    }

    #[test]
    fn calls_are_answered_and_pushed_states_are_waited_for() {
        let m = manager();
        let (mut c, inbox) = pair(&m, 0, Duration::from_secs(2));
        let g = c.renew().unwrap();
        assert_eq!(g.epoch, 1);
        c.ack(1, Stage::Run).unwrap();
        c.suspect(1).unwrap();
        c.synced(&[0, 1]).unwrap();
        // Nothing pushed yet: a bounded wait, then none.
        let t = Instant::now();
        assert_eq!(c.state_after(0, Duration::from_millis(20)).unwrap(), None);
        assert!(t.elapsed() >= Duration::from_millis(20));
        // A push wakes a waiter; an older one after it is ignored.
        let mut s = m.state();
        let waiter = std::thread::spawn(move || c.state_after(1, Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(10));
        s.revision = 7;
        inbox
            .deliver(&ToNode::Push(Box::new(s.clone())).to_value())
            .unwrap();
        let got = waiter.join().unwrap().unwrap().unwrap();
        assert_eq!(got.revision, 7);
        let mut old = s;
        old.revision = 3;
        inbox
            .deliver(&ToNode::Push(Box::new(old)).to_value())
            .unwrap();
        assert_eq!(inbox.bad_lines(), 0);
    }

    #[test]
    fn a_refusal_is_refused_and_silence_is_unreachable() {
        let m = manager();
        // Incarnation 1 of node 5: not a node of this 3-node cluster.
        let (mut c, _inbox) = pair(&m, 5, Duration::from_secs(2));
        assert!(matches!(
            c.renew(),
            Err(ManagerError::Refused(Refusal::UnknownNode(5)))
        ));
        // Nobody answers: Unreachable within the bound, not a hang.
        let inbox = ChannelInbox::new();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let s2 = sent.clone();
        let mut c = inbox.client(
            0,
            Box::new(move |v| {
                s2.lock().unwrap().push(v);
                Ok(())
            }),
            Duration::from_millis(30),
        );
        let t = Instant::now();
        assert!(matches!(c.renew(), Err(ManagerError::Unreachable(_))));
        assert!(t.elapsed() >= Duration::from_millis(30));
        // The call went out as a numbered request.
        assert_eq!(
            sent.lock().unwrap()[0],
            serde_json::json!({"id": 1, "call": "renew"})
        );
        // Its late answer is a stray one: counted, and the next call is unaffected.
        let late = serde_json::json!({"id": 1, "answer": "done"});
        assert_eq!(inbox.deliver(&late), Err(ChannelError::Stray(1)));
        assert_eq!(inbox.bad_lines(), 1);
        // A closed channel fails at once.
        inbox.close();
        let t = Instant::now();
        assert!(matches!(
            c.ack(1, Stage::Run),
            Err(ManagerError::Unreachable(_))
        ));
        assert!(matches!(
            c.state_after(0, Duration::from_secs(5)),
            Err(ManagerError::Unreachable(_))
        ));
        assert!(t.elapsed() < Duration::from_secs(1));
        // A sender that fails is Unreachable too.
        let mut c = ChannelInbox::new().client(
            0,
            Box::new(|_| Err(SendLineError::Closed)),
            Duration::from_secs(5),
        );
        assert!(matches!(c.renew(), Err(ManagerError::Unreachable(_))));
    }

    #[test]
    fn garbled_unknown_and_wrongly_numbered_answers_are_counted_errors() {
        let inbox = ChannelInbox::new();
        let (tx, rx) = mpsc::channel();
        let mut c = inbox.client(
            0,
            Box::new(move |v| tx.send(v).map_err(|_| SendLineError::Closed)),
            Duration::from_secs(2),
        );
        let waiter = std::thread::spawn(move || c.renew());
        let call: serde_json::Value = rx.recv().unwrap();
        let id = call["id"].as_u64().unwrap();
        for bad in [
            serde_json::json!("renew"),
            serde_json::json!({"id": id, "answer": "launched"}),
            serde_json::json!({"id": "x", "answer": "done"}),
            serde_json::json!({"push": {"revision": 1}}),
            serde_json::json!({}),
        ] {
            assert!(
                matches!(inbox.deliver(&bad), Err(ChannelError::Garbled(_))),
                "{bad}"
            );
        }
        // An answer under another id is not this call's.
        let wrong = serde_json::json!({"id": id + 100, "answer": "done"});
        assert_eq!(inbox.deliver(&wrong), Err(ChannelError::Stray(id + 100)));
        assert_eq!(inbox.bad_lines(), 6);
        // The right answer, of the wrong kind for a renewal: a protocol error.
        inbox
            .deliver(&serde_json::json!({"id": id, "answer": "done"}))
            .unwrap();
        assert!(matches!(
            waiter.join().unwrap(),
            Err(ManagerError::Protocol(_))
        ));
        // The manager's side refuses a garbled call the same way.
        let m = manager();
        let mut mc = m.client(0, 1);
        // A state-after call does not block the answering side.
        let t = Instant::now();
        let call =
            serde_json::json!({"id": 3, "call": "state-after", "revision": 1, "wait_ms": 900});
        assert_eq!(
            answer_call(&call, &mut mc).unwrap(),
            ToNode::Answer(Numbered {
                id: 3,
                body: Response::State { state: None }
            })
        );
        assert!(t.elapsed() < Duration::from_millis(500));
        assert!(answer_call(&serde_json::json!({"id": 1, "call": "launch"}), &mut mc).is_err());
        assert!(answer_call(&serde_json::json!([1]), &mut mc).is_err());
    }
}
