//! The conformance suite against the shm backend: node 0 is the driver in this process,
//! nodes 1 and 2 are `shm-peer` processes.

mod common;

use common::ShmFixture;

ambidex_transport::conformance_tests!(ShmFixture::new());
