//! Typed keys and values: how an application's types become the store's 8-byte keys and
//! byte values.
//!
//! The store keeps every key as a `u64` and every value of a table in a slot of one fixed
//! size (so a one-sided READ of an item knows its length). A [`Key`] packs into the
//! `u64`; a [`Value`] either has a fixed encoded size ([`Value::SIZE`], stored as is) or
//! a variable one, stored behind a 4-byte length in a slot of the table's maximum.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why stored bytes did not decode as a value (a value written by a different type, or a
/// corrupted one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes have a different length than the type's fixed size.
    #[error("{got} bytes where the type has {want}")]
    Length {
        /// The type's encoded size.
        want: usize,
        /// The bytes found.
        got: usize,
    },
    /// A string value is not UTF-8.
    #[error("a string value is not UTF-8")]
    Utf8,
    /// A `bool` value is neither 0 nor 1.
    #[error("a bool value is {0}, neither 0 nor 1")]
    Bool(u8),
    /// A variable-length slot's length prefix is larger than the slot.
    #[error("a length prefix of {len} bytes in a slot of {slot}")]
    Prefix {
        /// The length the prefix says.
        len: usize,
        /// The bytes the slot has after the prefix.
        slot: usize,
    },
    /// A [`Json`] value did not parse.
    #[error("JSON: {0}")]
    Json(String),
}

/// A key: a type that packs into the store's 8-byte keys, one to one.
///
/// Keys are hashed to partitions, so any packing spreads: there is no need to make the
/// high bits vary. Implemented for the unsigned and signed integers up to 64 bits,
/// `[u8; 8]` and pairs of `u32` (two-part keys such as (warehouse, district)).
pub trait Key: Sized {
    /// The key's 8-byte form.
    fn to_u64(&self) -> u64;
    /// The key back from its 8-byte form (every `u64` a key of this type packs into
    /// decodes to that key).
    fn from_u64(k: u64) -> Self;
}

macro_rules! int_key {
    ($($t:ty => $u:ty),*) => {$(
        impl Key for $t {
            fn to_u64(&self) -> u64 {
                *self as $u as u64
            }
            fn from_u64(k: u64) -> Self {
                k as $u as $t
            }
        }
    )*};
}
int_key!(u8 => u8, u16 => u16, u32 => u32, u64 => u64, i8 => u8, i16 => u16, i32 => u32, i64 => u64);

impl Key for [u8; 8] {
    fn to_u64(&self) -> u64 {
        u64::from_be_bytes(*self)
    }
    fn from_u64(k: u64) -> Self {
        k.to_be_bytes()
    }
}

impl Key for (u32, u32) {
    fn to_u64(&self) -> u64 {
        ((self.0 as u64) << 32) | self.1 as u64
    }
    fn from_u64(k: u64) -> Self {
        ((k >> 32) as u32, k as u32)
    }
}

/// A value: a type stored as bytes in a table's slots.
///
/// Implemented for the integers, `f32`, `f64`, `bool`, `[u8; N]` (fixed size), `String`,
/// `Vec<u8>` and [`Json<T>`] (variable size). Implement it for an application's own
/// record types: `encode` appends the record's bytes, `decode` reads them back and
/// rejects malformed input with a [`DecodeError`] (stored bytes are checked, never
/// trusted).
pub trait Value: Sized {
    /// The encoded size when every value of the type has the same one (stored without
    /// a length prefix); `None` for variable-length types.
    const SIZE: Option<usize> = None;
    /// Appends the value's bytes to `out` (exactly [`Value::SIZE`] of them if that is
    /// `Some`).
    fn encode(&self, out: &mut Vec<u8>);
    /// The value the bytes encode.
    fn decode(bytes: &[u8]) -> Result<Self, DecodeError>;
}

fn fixed<const N: usize>(b: &[u8]) -> Result<[u8; N], DecodeError> {
    b.try_into().map_err(|_| DecodeError::Length {
        want: N,
        got: b.len(),
    })
}

macro_rules! num_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            const SIZE: Option<usize> = Some(std::mem::size_of::<$t>());
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn decode(b: &[u8]) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(fixed(b)?))
            }
        }
    )*};
}
num_value!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128, f32, f64);

impl Value for bool {
    const SIZE: Option<usize> = Some(1);
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        match fixed::<1>(b)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            x => Err(DecodeError::Bool(x)),
        }
    }
}

impl<const N: usize> Value for [u8; N] {
    const SIZE: Option<usize> = Some(N);
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        fixed(b)
    }
}

impl Value for Vec<u8> {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        Ok(b.to_vec())
    }
}

impl Value for String {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::Utf8)
    }
}

/// Any serde type, stored as JSON text (variable length): convenient for records that
/// are not on a hot path; a hand-written [`Value`] is smaller and faster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Json<T>(pub T);

impl<T: Serialize + DeserializeOwned> Value for Json<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        // Writing to a Vec fails only for a type whose Serialize impl fails (a map with
        // non-string keys): such a type cannot be stored, and saying so at once is the
        // clearest answer to a programming error.
        serde_json::to_writer(out, &self.0).expect("a Json value's type serializes to JSON");
    }
    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        serde_json::from_slice(b)
            .map(Json)
            .map_err(|e| DecodeError::Json(e.to_string()))
    }
}

/// Bytes of a variable-length value's length prefix.
pub(crate) const PREFIX: usize = 4;

/// How one table's values sit in its fixed-size slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Every value has exactly this many bytes (no prefix).
    Fixed(usize),
    /// A 4-byte little-endian length, the value, zeros up to `max` bytes of value.
    Variable { max: usize },
}

impl Slot {
    /// The slot's size in the store.
    pub(crate) fn size(self) -> usize {
        match self {
            Slot::Fixed(n) => n,
            Slot::Variable { max } => PREFIX + max,
        }
    }

    /// The largest value the slot holds.
    pub(crate) fn max_value(self) -> usize {
        match self {
            Slot::Fixed(n) => n,
            Slot::Variable { max } => max,
        }
    }

    /// Encodes `v` into `out` (cleared first) as the slot stores it; `Err(len)` if the
    /// value is longer than the slot allows.
    pub(crate) fn encode<V: Value>(self, v: &V, out: &mut Vec<u8>) -> Result<(), usize> {
        out.clear();
        match self {
            Slot::Fixed(n) => {
                v.encode(out);
                if out.len() != n {
                    return Err(out.len());
                }
            }
            Slot::Variable { max } => {
                out.extend_from_slice(&[0; PREFIX]);
                v.encode(out);
                let len = out.len() - PREFIX;
                if len > max {
                    return Err(len);
                }
                out[..PREFIX].copy_from_slice(&(len as u32).to_le_bytes());
                out.resize(PREFIX + max, 0);
            }
        }
        Ok(())
    }

    /// The value a slot's bytes hold.
    pub(crate) fn decode<V: Value>(self, b: &[u8]) -> Result<V, DecodeError> {
        match self {
            Slot::Fixed(_) => V::decode(b),
            Slot::Variable { .. } => {
                let p: [u8; PREFIX] =
                    b.get(..PREFIX)
                        .and_then(|p| p.try_into().ok())
                        .ok_or(DecodeError::Length {
                            want: PREFIX,
                            got: b.len(),
                        })?;
                let len = u32::from_le_bytes(p) as usize;
                let rest = &b[PREFIX..];
                if len > rest.len() {
                    return Err(DecodeError::Prefix {
                        len,
                        slot: rest.len(),
                    });
                }
                V::decode(&rest[..len])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip<V: Value + PartialEq + std::fmt::Debug>(slot: Slot, v: V) {
        let mut b = Vec::new();
        slot.encode(&v, &mut b).unwrap();
        assert_eq!(b.len(), slot.size());
        assert_eq!(slot.decode::<V>(&b).unwrap(), v);
    }

    proptest! {
        #[test]
        fn keys_pack_one_to_one(a in any::<u32>(), b in any::<u32>(), i in any::<i64>()) {
            prop_assert_eq!(<(u32, u32)>::from_u64((a, b).to_u64()), (a, b));
            prop_assert_eq!(i64::from_u64(i.to_u64()), i);
            prop_assert_eq!(i32::from_u64((i as i32).to_u64()), i as i32);
        }

        #[test]
        fn values_round_trip(x in any::<i64>(), s in ".{0,40}", v in proptest::collection::vec(any::<u8>(), 0..64)) {
            round_trip(Slot::Fixed(8), x);
            round_trip(Slot::Variable { max: 200 }, s);
            round_trip(Slot::Variable { max: 64 }, v);
        }

        /// Whatever bytes a slot holds (another type's, corrupted), decoding returns a
        /// value or an error, never a panic.
        #[test]
        fn any_bytes_decode_or_fail_cleanly(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let slot = Slot::Variable { max: 60 };
            let _ = slot.decode::<String>(&b);
            let _ = slot.decode::<Json<Vec<u32>>>(&b);
            let _ = Slot::Fixed(8).decode::<u64>(&b);
            let _ = Slot::Fixed(1).decode::<bool>(&b);
        }
    }

    #[test]
    fn a_value_longer_than_its_slot_is_refused() {
        let mut b = Vec::new();
        assert_eq!(
            Slot::Variable { max: 3 }.encode(&"four".to_string(), &mut b),
            Err(4)
        );
        assert_eq!(
            Slot::Variable { max: 4 }.decode::<String>(&[9, 0, 0, 0, b'a', 0, 0, 0]),
            Err(DecodeError::Prefix { len: 9, slot: 4 })
        );
        assert_eq!(
            Slot::Fixed(8).decode::<u64>(&[1, 2]),
            Err(DecodeError::Length { want: 8, got: 2 })
        );
    }
}
