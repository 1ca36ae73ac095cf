//! Thin wrappers over the socket calls std does not offer: socket options, batched
//! send/receive and waiting on a descriptor.

use ambidex_transport::clock::{duration_ns, Clock};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

// Generic Linux values (x86, arm, riscv); defined here because libc exposes them only for
// some targets.
const SO_RCVBUFFORCE: libc::c_int = 33;
pub const SO_RXQ_OVFL: libc::c_int = 40;
const SO_MEMINFO: libc::c_int = 55;
const SK_MEMINFO_DROPS: usize = 8;

/// A socket address in the kernel's representation, precomputed once per endpoint.
#[derive(Clone, Copy)]
pub struct RawAddr {
    pub storage: libc::sockaddr_storage,
    pub len: libc::socklen_t,
}

// SAFETY: plain bytes.
unsafe impl Send for RawAddr {}
unsafe impl Sync for RawAddr {}

impl RawAddr {
    pub fn new(a: SocketAddr) -> RawAddr {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let len = match a {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
                unsafe { (&mut storage as *mut _ as *mut libc::sockaddr_in).write(sin) };
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: as above.
                unsafe { (&mut storage as *mut _ as *mut libc::sockaddr_in6).write(sin6) };
                size_of::<libc::sockaddr_in6>()
            }
        };
        RawAddr {
            storage,
            len: len as libc::socklen_t,
        }
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: a valid pointer to an int of the given size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid pointer to an int and its length.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    if r == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Binds a non-blocking UDP socket at `addr` whose receive buffer holds about
/// `rcvbuf` bytes, with drop counting (SO_RXQ_OVFL) enabled.
pub fn bind(addr: SocketAddr, rcvbuf: usize) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    let fd = s.as_raw_fd();
    // The kernel doubles the value it is given (to account for its own overhead).
    let want = (rcvbuf / 2).clamp(4096, i32::MAX as usize) as libc::c_int;
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, want)?;
    if getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)? < want * 2 {
        // Capped by net.core.rmem_max; privileged processes may exceed it.
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, SO_RCVBUFFORCE, want);
    }
    setsockopt_int(fd, libc::SOL_SOCKET, SO_RXQ_OVFL, 1)?;
    Ok(s)
}

/// The socket's cumulative count of datagrams the kernel dropped (SO_MEMINFO), read now.
pub fn kernel_drops(fd: RawFd) -> Option<u32> {
    let mut v = [0u32; 16];
    let mut len = size_of::<[u32; 16]>() as libc::socklen_t;
    // SAFETY: a valid buffer and its length; the kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MEMINFO,
            v.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0 && len as usize > SK_MEMINFO_DROPS * 4).then(|| v[SK_MEMINFO_DROPS])
}

/// Waits until `fd` has one of `events` or `timeout` passes. Returns true if ready.
pub fn wait_fd(fd: RawFd, events: libc::c_short, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd; a null sigmask keeps the current mask.
    let r = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
    r > 0
}

/// A non-blocking eventfd (an endpoint's doorbell).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the descriptor is owned from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to an eventfd's counter (a failure means the counter is already non-zero
/// at its maximum: the reader is woken anyway).
pub fn eventfd_ring(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64.
    unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
}

/// Resets an eventfd's counter to zero (non-blocking: harmless if it is zero).
pub fn eventfd_clear(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a valid u64.
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
}

/// Waits until `fd` is readable, `bell` (an eventfd) is readable or `timeout` passes.
/// Returns whether `bell` is readable.
pub fn wait_fd_or_bell(fd: RawFd, bell: RawFd, timeout: Duration) -> bool {
    let mut p = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: bell,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: two valid pollfds; a null sigmask keeps the current mask.
    let r = unsafe { libc::ppoll(p.as_mut_ptr(), 2, &ts, std::ptr::null()) };
    r > 0 && p[1].revents & libc::POLLIN != 0
}

/// Most messages one sendmmsg/recvmmsg call takes (UIO_MAXIOV).
pub const MAX_BATCH: usize = 1024;

/// Sends every message of `msgs` with as few sendmmsg calls as the kernel allows (one,
/// normally). A full send buffer is waited out for at most `patience`; a message the
/// kernel refuses (or that is still unsent then) is skipped and reported to `failed`
/// with its index. The patience is timed by `clock`.
pub fn send_all(
    fd: RawFd,
    msgs: &mut [libc::mmsghdr],
    patience: Duration,
    clock: &dyn Clock,
    failed: &mut dyn FnMut(usize),
) {
    let mut i = 0;
    let mut deadline: Option<u64> = None;
    while i < msgs.len() {
        let n = (msgs.len() - i).min(MAX_BATCH);
        // SAFETY: the headers point at iovecs and addresses that outlive the call.
        let r = unsafe { libc::sendmmsg(fd, msgs[i..].as_mut_ptr(), n as libc::c_uint, 0) };
        if r > 0 {
            i += r as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                let now = clock.now_ns();
                let d = *deadline.get_or_insert_with(|| now.saturating_add(duration_ns(patience)));
                if now >= d {
                    (i..msgs.len()).for_each(&mut *failed);
                    break;
                }
                let left = Duration::from_nanos(d - now);
                wait_fd(fd, libc::POLLOUT, left.min(Duration::from_millis(1)));
            }
            _ => {
                // This message is refused (for example no route): skip it, send the rest.
                failed(i);
                i += 1;
            }
        }
    }
}

/// Level and option of UDP generic segmentation offload (linux/udp.h).
pub const SOL_UDP: libc::c_int = 17;
pub const UDP_SEGMENT: libc::c_int = 103;
/// Most segments the kernel accepts in one GSO send (UDP_MAX_SEGMENTS).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes of one GSO send (the IP datagram limit, with room for headers).
pub const GSO_MAX_BYTES: usize = 65_000;

/// Fills `buf` with one control message asking the kernel to cut the message into
/// segments of `seg` bytes; returns the control length.
pub fn gso_cmsg(buf: &mut [u64; 4], seg: u16) -> usize {
    // SAFETY: buf is 32 bytes, aligned for cmsghdr, more than CMSG_SPACE(2).
    unsafe {
        let space = libc::CMSG_SPACE(2) as usize;
        let c = buf.as_mut_ptr() as *mut libc::cmsghdr;
        (*c).cmsg_len = libc::CMSG_LEN(2) as _;
        (*c).cmsg_level = SOL_UDP;
        (*c).cmsg_type = UDP_SEGMENT;
        (libc::CMSG_DATA(c) as *mut u16).write_unaligned(seg);
        space
    }
}
