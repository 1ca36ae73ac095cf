//! Byte-level mutations of valid datagrams, shared by the fuzz tests.

use proptest::prelude::*;

#[derive(Debug, Clone)]
pub enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, u8),
    Remove(usize),
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
    ]
}

/// Applies `ms` to `b` in order (positions wrap around its length).
pub fn mutate(b: &mut Vec<u8>, ms: &[Mutation]) {
    for m in ms {
        let n = b.len().max(1);
        match *m {
            Mutation::Flip(i, x) => {
                if !b.is_empty() {
                    b[i % n] ^= x | 1;
                }
            }
            Mutation::Truncate(i) => b.truncate(i % n),
            Mutation::Insert(i, x) => b.insert(i % (b.len() + 1), x),
            Mutation::Remove(i) => {
                if !b.is_empty() {
                    b.remove(i % n);
                }
            }
        }
    }
}
