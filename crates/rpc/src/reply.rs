//! The buffer a request handler writes its response into.

use crate::wire;
use std::ops::{Deref, DerefMut};

/// A handler's response. It may sit behind other bytes the runtime keeps in the same
/// buffer (the responses of earlier requests of a group, which the handler must not
/// see or change), so the handler gets this instead of the `Vec`: it derefs to the
/// handler's own bytes only, and grows like a `Vec`. Writing in place spares a copy
/// of every response of a group.
pub struct Reply<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Reply<'a> {
    /// An empty response appended to `buf`.
    #[inline(always)]
    pub(crate) fn new(buf: &'a mut Vec<u8>) -> Reply<'a> {
        let start = buf.len();
        Reply { buf, start }
    }

    #[inline(always)]
    pub fn push(&mut self, b: u8) {
        self.buf.push(b);
    }

    #[inline(always)]
    pub fn extend_from_slice(&mut self, s: &[u8]) {
        wire::extend_bytes(self.buf, s);
    }

    /// Resizes the response (not the buffer) to `len` bytes.
    pub fn resize(&mut self, len: usize, value: u8) {
        self.buf.resize(self.start + len, value);
    }

    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(self.start + len);
    }

    pub fn clear(&mut self) {
        self.buf.truncate(self.start);
    }

    pub fn reserve(&mut self, additional: usize) {
        self.buf.reserve(additional);
    }
}

impl Deref for Reply<'_> {
    type Target = [u8];
    #[inline(always)]
    fn deref(&self) -> &[u8] {
        // SAFETY: `start <= buf.len()` always: `start` was the length when the reply
        // was made, and every method keeps at least `start` bytes.
        unsafe { self.buf.get_unchecked(self.start..) }
    }
}

impl DerefMut for Reply<'_> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`.
        unsafe { self.buf.get_unchecked_mut(self.start..) }
    }
}

impl Extend<u8> for Reply<'_> {
    fn extend<I: IntoIterator<Item = u8>>(&mut self, iter: I) {
        self.buf.extend(iter);
    }
}

impl<'b> Extend<&'b u8> for Reply<'_> {
    fn extend<I: IntoIterator<Item = &'b u8>>(&mut self, iter: I) {
        self.buf.extend(iter);
    }
}

impl std::io::Write for Reply<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_sees_and_changes_only_its_own_bytes() {
        let mut buf = b"earlier".to_vec();
        let mut r = Reply::new(&mut buf);
        assert!(r.is_empty());
        r.extend_from_slice(b"abc");
        r.push(b'd');
        r[0] = b'A';
        r.reverse();
        assert_eq!(&*r, b"dcbA");
        r.resize(6, b'-');
        assert_eq!(&*r, b"dcbA--");
        r.truncate(2);
        assert_eq!(&*r, b"dc");
        r.extend(b"xy");
        r.extend([b'z']);
        std::io::Write::write_all(&mut r, b"!").unwrap();
        assert_eq!(&*r, b"dcxyz!");
        r.clear();
        assert!(r.is_empty());
        r.truncate(5); // longer than the reply: nothing changes
        r.extend_from_slice(b"end");
        assert_eq!(buf, b"earlierend");
    }
}
