//! The configuration manager as a node sees it: one trait ([`ManagerClient`]), two
//! managers behind it. The embedded one ([`EmbeddedManager`]) runs the [`Membership`]
//! state machine in one place (the launcher of a local, shm or udp cluster) and answers
//! nodes directly (in process) or over their control channel ([`Request`] and
//! [`Response`] are what crosses it). The etcd one (`etcd`, cargo feature `etcd`)
//! keeps the state and the leases in etcd, and every node takes the manager's
//! decisions itself.
//!
//! [`Membership`]: crate::Membership
//! [`EmbeddedManager`]: crate::EmbeddedManager

pub mod channel;
pub(crate) mod embedded;
#[cfg(feature = "etcd")]
pub mod etcd;
pub(crate) mod stepped;

use crate::membership::{ClusterState, Grant, Refusal, Stage};
use ambidex_transport::NodeId;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Why a manager call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManagerError {
    /// The manager answered no (this node is not a member, is revoked, ...).
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// The manager could not be reached or did not answer in time.
    #[error("the configuration manager is unreachable: {0}")]
    Unreachable(String),
    /// The manager's answer made no sense (a bug or a foreign peer).
    #[error("bad answer from the configuration manager: {0}")]
    Protocol(String),
}

/// What one node asks of the manager. Every call names this node's incarnation.
pub trait ManagerClient: Send {
    /// Renews this node's lease.
    fn renew(&mut self) -> Result<Grant, ManagerError>;
    /// The state, once its revision is above `revision` (waiting up to `wait`);
    /// `None` if it did not change in that time.
    fn state_after(
        &mut self,
        revision: u64,
        wait: Duration,
    ) -> Result<Option<ClusterState>, ManagerError>;
    /// This node has moved to `stage` of `epoch`.
    fn ack(&mut self, epoch: u32, stage: Stage) -> Result<(), ManagerError>;
    /// This node's requests to `node` went unanswered.
    fn suspect(&mut self, node: NodeId) -> Result<(), ManagerError>;
    /// This node's copies of `partitions` are up to date.
    fn synced(&mut self, partitions: &[u32]) -> Result<(), ManagerError>;
    /// This node (restarted, a new incarnation) asks to be a member again.
    fn join(&mut self) -> Result<(), ManagerError>;
}

/// A manager call carried over a control channel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "kebab-case")]
pub enum Request {
    Renew,
    StateAfter { revision: u64, wait_ms: u64 },
    Ack { epoch: u32, stage: Stage },
    Suspect { node: NodeId },
    Synced { partitions: Vec<u32> },
    Join,
}

/// The manager's answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "kebab-case")]
pub enum Response {
    Granted { grant: Grant },
    State { state: Option<Box<ClusterState>> },
    Done,
    Refused { refusal: Refusal },
}

impl Request {
    /// Runs the call against `client` (how the manager's side of a channel answers).
    pub fn answer(self, client: &mut dyn ManagerClient) -> Response {
        let r = match self {
            Request::Renew => client.renew().map(|grant| Response::Granted { grant }),
            Request::StateAfter { revision, wait_ms } => client
                .state_after(revision, Duration::from_millis(wait_ms.min(1_000)))
                .map(|s| Response::State {
                    state: s.map(Box::new),
                }),
            Request::Ack { epoch, stage } => client.ack(epoch, stage).map(|()| Response::Done),
            Request::Suspect { node } => client.suspect(node).map(|()| Response::Done),
            Request::Synced { partitions } => client.synced(&partitions).map(|()| Response::Done),
            Request::Join => client.join().map(|()| Response::Done),
        };
        match r {
            Ok(resp) => resp,
            Err(ManagerError::Refused(refusal)) => Response::Refused { refusal },
            Err(e) => Response::Refused {
                refusal: Refusal::Failed(e.to_string()),
            },
        }
    }
}
