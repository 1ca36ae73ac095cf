//! Recovery timings on stderr, for finding where a reconfiguration's time goes: with
//! `AMBIDEX_RECTRACE=1` in the environment, each [`rectrace!`](crate::rectrace!) prints
//! `rectrace <unix ns> <pid> <what>` (the system clock, comparable across the processes
//! of one host). Off, a trace point is one relaxed load.

use std::sync::atomic::{AtomicU8, Ordering};

static ON: AtomicU8 = AtomicU8::new(2);

/// Whether tracing is on (`AMBIDEX_RECTRACE` set and not `0`), read once.
#[inline]
pub fn on() -> bool {
    match ON.load(Ordering::Relaxed) {
        0 => false,
        1 => true,
        _ => {
            let on = std::env::var_os("AMBIDEX_RECTRACE").is_some_and(|v| v != "0");
            ON.store(on as u8, Ordering::Relaxed);
            on
        }
    }
}

/// Prints one trace line (callers check [`on`] first: [`rectrace!`](crate::rectrace!)).
pub fn emit(what: std::fmt::Arguments<'_>) {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // The calling thread's CPU time too: on a loaded host, wall time is mostly waiting.
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    let cpu_us = t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1000;
    // One write per line, so that the lines of several processes do not mix.
    let line = format!(
        "rectrace {ns} {} {what} [cpu {cpu_us} us]\n",
        std::process::id()
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
}

/// `rectrace!("node {n} adopted {e}")`: a trace line when `AMBIDEX_RECTRACE` is on.
#[macro_export]
macro_rules! rectrace {
    ($($t:tt)*) => {
        if $crate::rectrace::on() {
            $crate::rectrace::emit(format_args!($($t)*));
        }
    };
}
