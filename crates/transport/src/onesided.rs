//! Execution of one-sided operations against a target region: the checks an RDMA NIC
//! makes (key, permission, bounds, alignment) and then the memory operation itself.
//! Shared by every backend so that all of them fail the same way on bad access.

use crate::region::{Region, RegionMemory};
use crate::types::{AccessError, OneSidedKind, Perms, RemoteAddr};
use std::sync::atomic::Ordering;

/// Checks an access to `target` without touching memory.
#[inline]
pub fn check(
    target: &Region,
    remote: &RemoteAddr,
    kind: &OneSidedKind<'_>,
    max_onesided: usize,
) -> Result<(), AccessError> {
    match kind {
        OneSidedKind::Read { len, .. } => {
            check_access(target, remote, Perms::READ, *len as usize, max_onesided)
        }
        OneSidedKind::Write { data } => {
            check_access(target, remote, Perms::WRITE, data.len(), max_onesided)
        }
        OneSidedKind::Cas { .. } | OneSidedKind::Faa { .. } => {
            check_atomic(target, remote, max_onesided)
        }
    }
}

/// The checks of every verb, in the order that decides which error a bad access gets:
/// key, permission, size, bounds.
#[inline(always)]
fn check_access(
    target: &Region,
    remote: &RemoteAddr,
    need: Perms,
    len: usize,
    max_onesided: usize,
) -> Result<(), AccessError> {
    if remote.key != target.desc.key {
        return Err(AccessError::BadKey);
    }
    if !target.desc.perms.contains(need) {
        return Err(AccessError::NoPermission);
    }
    if len > max_onesided {
        return Err(AccessError::TooLarge);
    }
    if !target.mem.range_ok(remote.offset, len) {
        return Err(AccessError::OutOfBounds);
    }
    Ok(())
}

/// `check_access` for an 8-byte atomic, then its alignment.
#[inline(always)]
fn check_atomic(
    target: &Region,
    remote: &RemoteAddr,
    max_onesided: usize,
) -> Result<(), AccessError> {
    check_access(target, remote, Perms::ATOMIC, 8, max_onesided)?;
    if !remote.offset.is_multiple_of(8) {
        return Err(AccessError::Misaligned);
    }
    Ok(())
}

/// Checks and performs `kind` on `target`. For READ, `local` resolves the destination
/// buffer on the initiator's node. Returns the old word for CAS/FAA, 0 otherwise.
///
/// Generic over `local` (a `&dyn Fn` still fits) so that a backend's lookup is inlined:
/// this runs once per operation.
#[inline]
pub fn execute<'l, L>(
    target: &Region,
    remote: &RemoteAddr,
    kind: &OneSidedKind<'_>,
    max_onesided: usize,
    local: &L,
) -> Result<u64, AccessError>
where
    L: Fn(crate::types::RegionId) -> Option<&'l RegionMemory> + ?Sized,
{
    // One dispatch on the verb for both the checks and the operation.
    let mem = &target.mem;
    match *kind {
        OneSidedKind::Read { len, dest } => {
            check_access(target, remote, Perms::READ, len as usize, max_onesided)?;
            let dst = local(dest.region).ok_or(AccessError::BadLocalBuffer)?;
            // `copy_from` checks both ranges and copies nothing if one is out; the
            // source range was checked above, so a refusal is the destination's.
            if !dst.copy_from(dest.offset, mem, remote.offset, len as usize) {
                return Err(AccessError::BadLocalBuffer);
            }
            Ok(0)
        }
        OneSidedKind::Write { data } => {
            check_access(target, remote, Perms::WRITE, data.len(), max_onesided)?;
            mem.write(remote.offset, data);
            Ok(0)
        }
        OneSidedKind::Cas { expected, new } => {
            check_atomic(target, remote, max_onesided)?;
            let w = mem.word(remote.offset).ok_or(AccessError::Misaligned)?;
            Ok(
                match w.compare_exchange(expected, new, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                },
            )
        }
        OneSidedKind::Faa { add } => {
            check_atomic(target, remote, max_onesided)?;
            let w = mem.word(remote.offset).ok_or(AccessError::Misaligned)?;
            Ok(w.fetch_add(add, Ordering::SeqCst))
        }
    }
}
