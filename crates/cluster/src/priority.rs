//! The lease threads (a node's agent, the embedded manager's ticker) run at real-time
//! priority where the system allows it, as FaRM runs its lease manager: on a machine
//! whose cores are all busy with polling node threads, a lease thread at normal priority
//! can wait a whole scheduler period or more, longer than a short lease, and the node
//! is then removed although it is alive.

/// Raises the calling thread to a low real-time priority (`SCHED_RR`, priority 1), or,
/// failing that, to the highest nice level allowed. Returns whether real-time was
/// granted (it needs `CAP_SYS_NICE`, root has it).
pub fn raise_lease_thread() -> bool {
    // SAFETY: plain system calls on the calling thread with a valid parameter struct.
    unsafe {
        let p = libc::sched_param { sched_priority: 1 };
        if libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_RR, &p) == 0 {
            return true;
        }
        // Not permitted: at least ahead of the pollers (nice applies per thread on Linux).
        let _ = libc::setpriority(libc::PRIO_PROCESS, 0, -10);
    }
    false
}
