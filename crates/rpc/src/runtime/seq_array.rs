//! A fixed power-of-two array indexed by sequence number (seq mod length): the client's
//! window of requests in flight and the server's window of cached responses.

pub(crate) struct SeqArray<T> {
    pub items: Box<[T]>,
    mask: usize,
}

impl<T> SeqArray<T> {
    pub fn new(n: usize, f: impl FnMut(usize) -> T) -> SeqArray<T> {
        assert!(n.is_power_of_two());
        SeqArray {
            items: (0..n).map(f).collect(),
            mask: n - 1,
        }
    }

    /// Indexing needs no bounds check: the mask keeps it in range.
    #[inline(always)]
    pub fn at(&self, seq: u64) -> &T {
        // SAFETY: `items` has mask + 1 entries (a power of two), so the index is in range.
        unsafe { self.items.get_unchecked(seq as usize & self.mask) }
    }

    #[inline(always)]
    pub fn at_mut(&mut self, seq: u64) -> &mut T {
        // SAFETY: as in `at`.
        unsafe { self.items.get_unchecked_mut(seq as usize & self.mask) }
    }
}
