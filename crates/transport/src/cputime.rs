//! CPU time accounting for reports: benchmarks divide work by the CPU-seconds all node
//! threads and processes used, so runs on an oversubscribed machine stay comparable.

fn rusage(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the zeroed struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU seconds of every thread of this process so far.
pub fn process_cpu_seconds() -> f64 {
    rusage(libc::RUSAGE_SELF)
}

/// User + system CPU seconds of this process's children that have exited and been waited for.
pub fn children_cpu_seconds() -> f64 {
    rusage(libc::RUSAGE_CHILDREN)
}

/// User + system CPU seconds of the calling thread so far.
pub fn thread_cpu_seconds() -> f64 {
    rusage(libc::RUSAGE_THREAD)
}

/// User + system CPU seconds of a live process, read from /proc (0.0 if it is gone).
pub fn pid_cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are 14th and 15th.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// Peak resident set size of this process in bytes.
pub fn max_rss_bytes() -> u64 {
    // SAFETY: as above.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_maxrss as u64 * 1024
}
