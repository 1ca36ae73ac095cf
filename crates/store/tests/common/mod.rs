//! Shared by the tests that read tables one-sided: a runtime for the reading thread and
//! a way to run one coroutine on it to the end.
#![allow(dead_code)]

use ambidex_rpc::{Ctx, Runtime, RuntimeConfig};
use ambidex_store::remote::attach_scratch;
use ambidex_transport::{NodeTransport, ThreadId};
use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;

/// A runtime on `node`'s endpoint `thread` whose first `workers` coroutines may READ
/// items of up to `max_item` bytes.
pub fn reader_runtime(
    node: &dyn NodeTransport,
    thread: ThreadId,
    workers: usize,
    max_item: usize,
) -> Runtime {
    let mut rt = Runtime::new(node.endpoint(thread).unwrap(), RuntimeConfig::default()).unwrap();
    attach_scratch(&mut rt, node, workers, max_item).unwrap();
    rt
}

/// Spawns `f` as a coroutine of `rt` and steps `rt` until it is done; its output.
pub fn run_to_end<T: 'static, Fut: Future<Output = T> + 'static>(
    rt: &mut Runtime,
    f: impl FnOnce(Ctx) -> Fut + 'static,
) -> T {
    let out = Rc::new(RefCell::new(None));
    let o = out.clone();
    let fut = f;
    rt.spawn(move |ctx| async move {
        let r = fut(ctx).await;
        *o.borrow_mut() = Some(r);
    });
    rt.run_until(|_| out.borrow().is_some());
    let r = out.borrow_mut().take();
    r.unwrap()
}
