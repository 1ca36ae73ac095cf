//! How a node process ended, in words, and waiting for it to end.

use std::process::Child;
use std::time::{Duration, Instant};

/// The `Instant` of a moment given as nanoseconds since the Unix epoch on this host's
/// clock (what a node process said); `None` if it is not in the recent past (a clock
/// step, or a bad value: the caller keeps its own observation).
pub(super) fn instant_of_unix_ns(ns: u64) -> Option<Instant> {
    let now_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos() as u64;
    let ago = Duration::from_nanos(now_unix.checked_sub(ns)?);
    (ago < Duration::from_secs(10)).then(|| Instant::now().checked_sub(ago))?
}

/// Waits up to `grace` for `child` to exit; its status, if it did.
pub(super) fn reap(child: &mut Child, grace: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            _ => return None,
        }
    }
}

/// "exited with status 3", "was killed by signal 9 (SIGKILL)".
pub(crate) fn describe_exit(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = st.code() {
        return format!("exited with status {code}");
    }
    match st.signal() {
        Some(sig) => {
            let name = match sig {
                libc::SIGHUP => "SIGHUP",
                libc::SIGINT => "SIGINT",
                libc::SIGQUIT => "SIGQUIT",
                libc::SIGILL => "SIGILL",
                libc::SIGABRT => "SIGABRT",
                libc::SIGBUS => "SIGBUS",
                libc::SIGFPE => "SIGFPE",
                libc::SIGKILL => "SIGKILL",
                libc::SIGSEGV => "SIGSEGV",
                libc::SIGPIPE => "SIGPIPE",
                libc::SIGTERM => "SIGTERM",
                _ => "",
            };
            if name.is_empty() {
                format!("was killed by signal {sig}")
            } else {
                format!("was killed by signal {sig} ({name})")
            }
        }
        None => format!("ended ({st})"),
    }
}
