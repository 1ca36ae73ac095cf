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
    if remote.key != target.desc.key {
        return Err(AccessError::BadKey);
    }
    let (need, len) = match kind {
        OneSidedKind::Read { len, .. } => (Perms::READ, *len as usize),
        OneSidedKind::Write { data } => (Perms::WRITE, data.len()),
        OneSidedKind::Cas { .. } | OneSidedKind::Faa { .. } => (Perms::ATOMIC, 8),
    };
    if !target.desc.perms.contains(need) {
        return Err(AccessError::NoPermission);
    }
    if len > max_onesided {
        return Err(AccessError::TooLarge);
    }
    if !target.mem.range_ok(remote.offset, len) {
        return Err(AccessError::OutOfBounds);
    }
    if matches!(kind, OneSidedKind::Cas { .. } | OneSidedKind::Faa { .. })
        && !remote.offset.is_multiple_of(8)
    {
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
    check(target, remote, kind, max_onesided)?;
    let mem = &target.mem;
    match *kind {
        OneSidedKind::Read { len, dest } => {
            let dst = local(dest.region).ok_or(AccessError::BadLocalBuffer)?;
            if !dst.range_ok(dest.offset, len as usize) {
                return Err(AccessError::BadLocalBuffer);
            }
            dst.copy_from(dest.offset, mem, remote.offset, len as usize);
            Ok(0)
        }
        OneSidedKind::Write { data } => {
            mem.write(remote.offset, data);
            Ok(0)
        }
        OneSidedKind::Cas { expected, new } => {
            let w = mem.word(remote.offset).ok_or(AccessError::Misaligned)?;
            Ok(
                match w.compare_exchange(expected, new, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                },
            )
        }
        OneSidedKind::Faa { add } => {
            let w = mem.word(remote.offset).ok_or(AccessError::Misaligned)?;
            Ok(w.fetch_add(add, Ordering::SeqCst))
        }
    }
}
