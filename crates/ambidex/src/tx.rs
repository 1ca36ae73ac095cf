//! Typed transactions: [`Tx`] (reads and writes) and [`ReadTx`] (reads only) over the
//! protocol's [`Txn`].
//!
//! The protocol fetches keys in batches (one doorbell per batch): a key read joins the
//! read set and is validated at commit; a key fetched for update is locked when it is
//! fetched (or at commit, under the one-sided policies). Writes are staged and travel
//! with the commit. Each key has one entry per transaction, so a transaction reads its
//! own writes.

use crate::codec::{Key, Value};
use crate::error::Error;
use crate::schema::Table;
use ambidex_txn::{AbortReason, ItemId, Txn, WriteKind};
use std::sync::Arc;

/// What a transaction does with one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Read,
    Update,
    Insert,
    Delete,
}

/// One key of the transaction.
struct Entry {
    table: u32,
    /// The table's name, for errors.
    name: Arc<str>,
    /// Fetched (by a get, or by the commit).
    fetched: bool,
    key: u64,
    item: ItemId,
    mode: Mode,
    /// The value written (encoded as the slot stores it), once staged.
    staged: Option<Vec<u8>>,
}

/// A read-write transaction, handed to the closure of
/// [`Node::run`](crate::Node::run). Reads are `async` (they may fetch from other nodes);
/// writes are staged and take effect at commit, which happens when the closure returns
/// `Ok`.
pub struct Tx<'a> {
    txn: Option<Txn<'a>>,
    entries: Vec<Entry>,
    /// The abort that ended the transaction, once one did.
    aborted: Option<AbortReason>,
}

impl<'a> Tx<'a> {
    pub(crate) fn new(txn: Txn<'a>) -> Tx<'a> {
        Tx {
            txn: Some(txn),
            entries: Vec::new(),
            aborted: None,
        }
    }

    /// The transaction's id (unique per coordinator thread; recorded in histories).
    pub fn id(&self) -> u64 {
        self.txn.as_ref().map(|t| t.id()).unwrap_or(0)
    }

    fn txn(&mut self) -> Result<&mut Txn<'a>, Error> {
        if let Some(reason) = self.aborted {
            return Err(Error::Aborted { reason });
        }
        self.txn.as_mut().ok_or(Error::Stopped)
    }

    fn find(&self, table: u32, key: u64) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.table == table && e.key == key)
    }

    /// Adds the entry of `key`, whose protocol item is `item`; returns its index.
    fn push<K, V>(&mut self, table: &Table<K, V>, key: u64, item: ItemId, mode: Mode) -> usize {
        self.entries.push(Entry {
            table: table.id,
            name: table.name.clone(),
            fetched: false,
            key,
            item,
            mode,
            staged: None,
        });
        self.entries.len() - 1
    }

    /// Fetches every key added since the last fetch; an abort ends the transaction.
    async fn fetch(&mut self) -> Result<(), AbortReason> {
        let Some(txn) = self.txn.as_mut() else {
            return Err(AbortReason::User);
        };
        let r = txn.execute().await;
        match r {
            Ok(()) => self.entries.iter_mut().for_each(|e| e.fetched = true),
            Err(reason) => self.aborted = Some(reason),
        }
        r
    }

    /// The error for abort `reason` met while fetching keys of `table`; `key` when the
    /// fetch was of that one key (a missing or existing key then names it).
    fn abort_error<K, V>(table: &Table<K, V>, key: Option<u64>, reason: AbortReason) -> Error {
        match (reason, key) {
            (AbortReason::MissingKey, Some(key)) => Error::NotFound {
                table: table.name.to_string(),
                key,
            },
            (AbortReason::InsertExists, Some(key)) => Error::AlreadyExists {
                table: table.name.to_string(),
                key,
            },
            _ => Error::Aborted { reason },
        }
    }

    fn decode<K, V: Value>(table: &Table<K, V>, key: u64, b: &[u8]) -> Result<V, Error> {
        table.slot.decode(b).map_err(|source| Error::Decode {
            table: table.name.to_string(),
            key,
            source,
        })
    }

    /// The value entry `i` has now: staged, fetched, or absent.
    fn current<K, V: Value>(&self, table: &Table<K, V>, i: usize) -> Result<Option<V>, Error> {
        let e = &self.entries[i];
        if e.mode == Mode::Delete {
            return Ok(None);
        }
        if let Some(b) = &e.staged {
            return Self::decode(table, e.key, b).map(Some);
        }
        let txn = self.txn.as_ref().ok_or(Error::Stopped)?;
        match txn.get(e.item) {
            Some(b) => Self::decode(table, e.key, b).map(Some),
            None => Ok(None),
        }
    }

    fn encode<K, V: Value>(table: &Table<K, V>, v: &V) -> Result<Vec<u8>, Error> {
        let mut b = Vec::with_capacity(table.slot.size());
        table
            .slot
            .encode(v, &mut b)
            .map_err(|len| Error::ValueTooLarge {
                table: table.name.to_string(),
                len,
                max: table.slot.max_value(),
            })?;
        Ok(b)
    }

    /// Adds the keys of `keys` not yet in the transaction with `mode` (fetched at the
    /// next fetch), and checks the ones that are can be used that way.
    fn add_keys<K: Key, V>(
        &mut self,
        table: &Table<K, V>,
        keys: &[K],
        mode: Mode,
    ) -> Result<Vec<usize>, Error> {
        let mut at = Vec::with_capacity(keys.len());
        for k in keys {
            let key = k.to_u64();
            let i = match self.find(table.id, key) {
                Some(i) => {
                    let e = &self.entries[i];
                    if mode != Mode::Read && e.mode == Mode::Read {
                        return Err(Error::KeyMisuse {
                            table: table.name.to_string(),
                            key,
                            what: "read in this transaction, then fetched for update: fetch keys to write with get_for_update from the start",
                        });
                    }
                    i
                }
                None => {
                    let txn = self.txn()?;
                    let item = match mode {
                        Mode::Read => txn.read(table.id, key),
                        _ => txn.write(table.id, key, WriteKind::Update),
                    };
                    self.push(table, key, item, mode)
                }
            };
            at.push(i);
        }
        Ok(at)
    }

    async fn get_keys<K: Key, V: Value>(
        &mut self,
        table: &Table<K, V>,
        keys: &[K],
        mode: Mode,
    ) -> Result<Vec<Option<V>>, Error> {
        self.txn()?;
        let at = self.add_keys(table, keys, mode)?;
        if let Err(reason) = self.fetch().await {
            let one = (keys.len() == 1).then(|| keys[0].to_u64());
            return Err(Self::abort_error(table, one, reason));
        }
        at.into_iter().map(|i| self.current(table, i)).collect()
    }

    /// The value of `key` in `table` (`None` if absent), as of this transaction: its own
    /// write if it wrote one, else what it fetched. The key joins the read set, checked
    /// at commit: if another transaction changes it first, this one aborts (and
    /// `Node::run` retries it).
    pub async fn get<K: Key, V: Value>(
        &mut self,
        table: &Table<K, V>,
        key: K,
    ) -> Result<Option<V>, Error> {
        let mut v = self.get_keys(table, &[key], Mode::Read).await?;
        Ok(v.pop().flatten())
    }

    /// [`Tx::get`] of several keys of one table, fetched together (one round trip per
    /// node involved), in the order given.
    pub async fn get_many<K: Key, V: Value>(
        &mut self,
        table: &Table<K, V>,
        keys: &[K],
    ) -> Result<Vec<Option<V>>, Error> {
        self.get_keys(table, keys, Mode::Read).await
    }

    /// The value of `key`, fetched to be written: the key is locked for this
    /// transaction (at once, or at commit under the one-sided lock policies). The key
    /// must exist ([`Error::NotFound`] otherwise, which ends the transaction); write it
    /// with [`Tx::put`] or [`Tx::delete`].
    pub async fn get_for_update<K: Key, V: Value>(
        &mut self,
        table: &Table<K, V>,
        key: K,
    ) -> Result<V, Error> {
        let packed = key.to_u64();
        let mut v = self.get_keys(table, &[key], Mode::Update).await?;
        v.pop().flatten().ok_or_else(|| Error::NotFound {
            table: table.name.to_string(),
            key: packed,
        })
    }

    /// [`Tx::get_for_update`] of several keys of one table, fetched together, in the
    /// order given. Every key must exist.
    pub async fn get_many_for_update<K: Key, V: Value>(
        &mut self,
        table: &Table<K, V>,
        keys: &[K],
    ) -> Result<Vec<V>, Error> {
        let vals = self.get_keys(table, keys, Mode::Update).await?;
        vals.into_iter()
            .zip(keys)
            .map(|(v, k)| {
                v.ok_or_else(|| Error::NotFound {
                    table: table.name.to_string(),
                    key: k.to_u64(),
                })
            })
            .collect()
    }

    /// Writes `value` for `key` at commit. A key fetched with
    /// [`Tx::get_for_update`] (or inserted or put before) takes the new value; any other
    /// key is updated blindly: it is locked at commit and must exist then (the
    /// transaction aborts with `missing_key` otherwise; to create a key, use
    /// [`Tx::insert`]).
    pub fn put<K: Key, V: Value>(
        &mut self,
        table: &Table<K, V>,
        key: K,
        value: &V,
    ) -> Result<(), Error> {
        let b = Self::encode(table, value)?;
        self.stage(table, key.to_u64(), Mode::Update, b)
    }

    /// Creates `key` with `value` at commit. The key must not exist then: the
    /// transaction aborts with [`Error::AlreadyExists`] (when the commit finds it) or
    /// `insert_exists`.
    pub fn insert<K: Key, V: Value>(
        &mut self,
        table: &Table<K, V>,
        key: K,
        value: &V,
    ) -> Result<(), Error> {
        let b = Self::encode(table, value)?;
        self.stage(table, key.to_u64(), Mode::Insert, b)
    }

    /// Deletes `key` at commit. The key must exist then (the transaction aborts with
    /// `missing_key` otherwise).
    pub fn delete<K: Key, V: Value>(&mut self, table: &Table<K, V>, key: K) -> Result<(), Error> {
        let key = key.to_u64();
        let name = &table.name;
        let unsupported = |what| Error::KeyMisuse {
            table: name.to_string(),
            key,
            what,
        };
        match self.find(table.id, key) {
            Some(i) => match self.entries[i].mode {
                Mode::Read => Err(unsupported(
                    "read in this transaction, then deleted: fetch keys to write with get_for_update",
                )),
                Mode::Insert => Err(unsupported("inserted in this transaction, then deleted")),
                Mode::Delete => Ok(()),
                Mode::Update => {
                    let item = self.entries[i].item;
                    self.txn()?.delete_instead(item);
                    let e = &mut self.entries[i];
                    e.mode = Mode::Delete;
                    e.staged = None;
                    Ok(())
                }
            },
            None => {
                let item = self.txn()?.write(table.id, key, WriteKind::Delete);
                self.push(table, key, item, Mode::Delete);
                Ok(())
            }
        }
    }

    fn stage<K, V>(
        &mut self,
        table: &Table<K, V>,
        key: u64,
        mode: Mode,
        bytes: Vec<u8>,
    ) -> Result<(), Error> {
        let unsupported = |what| Error::KeyMisuse {
            table: table.name.to_string(),
            key,
            what,
        };
        let i = match self.find(table.id, key) {
            Some(i) => {
                match (self.entries[i].mode, mode) {
                    (Mode::Read, _) => {
                        return Err(unsupported(
                            "read in this transaction, then written: fetch keys to write with get_for_update",
                        ))
                    }
                    (Mode::Delete, _) => {
                        return Err(unsupported("deleted in this transaction, then written"))
                    }
                    (Mode::Update, Mode::Insert) => {
                        return Err(Error::AlreadyExists {
                            table: table.name.to_string(),
                            key,
                        })
                    }
                    _ => {}
                }
                i
            }
            None => {
                let kind = match mode {
                    Mode::Insert => WriteKind::Insert,
                    _ => WriteKind::Update,
                };
                let item = self.txn()?.write(table.id, key, kind);
                self.push(table, key, item, mode)
            }
        };
        let item = self.entries[i].item;
        self.txn()?.set(item, &bytes);
        self.entries[i].staged = Some(bytes);
        Ok(())
    }

    /// Commits (fetching what is still unfetched first); the abort reason on failure.
    pub(crate) async fn commit(&mut self) -> Result<(), Error> {
        if let Some(reason) = self.aborted {
            return Err(Error::Aborted { reason });
        }
        let txn = self.txn.take().ok_or(Error::Stopped)?;
        match txn.commit().await {
            Ok(_) => Ok(()),
            Err(reason) => {
                self.aborted = Some(reason);
                Err(self.commit_error(reason))
            }
        }
    }

    /// An abort at commit: a missing or existing key is named when the commit fetched
    /// one key that could be it.
    fn commit_error(&self, reason: AbortReason) -> Error {
        let could_be = |e: &&Entry| {
            !e.fetched
                && match reason {
                    AbortReason::MissingKey => matches!(e.mode, Mode::Update | Mode::Delete),
                    AbortReason::InsertExists => e.mode == Mode::Insert,
                    _ => false,
                }
        };
        let mut keys = self.entries.iter().filter(could_be);
        match (keys.next(), keys.next(), reason) {
            (Some(e), None, AbortReason::MissingKey) => Error::NotFound {
                table: e.name.to_string(),
                key: e.key,
            },
            (Some(e), None, AbortReason::InsertExists) => Error::AlreadyExists {
                table: e.name.to_string(),
                key: e.key,
            },
            _ => Error::Aborted { reason },
        }
    }

    /// Aborts (releasing its locks), unless it ended already.
    pub(crate) async fn abort(&mut self) {
        if let Some(txn) = self.txn.take() {
            txn.abort().await;
        }
    }
}

/// A read-only transaction, handed to the closure of
/// [`Node::read`](crate::Node::read): every value it returns is of one serializable
/// snapshot (its reads are validated at commit, and it is retried if another
/// transaction changed one first). A transaction of one key skips validation.
pub struct ReadTx<'a> {
    pub(crate) tx: Tx<'a>,
}

impl ReadTx<'_> {
    /// The value of `key` (`None` if absent); see [`Tx::get`].
    pub async fn get<K: Key, V: Value>(
        &mut self,
        table: &Table<K, V>,
        key: K,
    ) -> Result<Option<V>, Error> {
        self.tx.get(table, key).await
    }

    /// The values of `keys`, fetched together; see [`Tx::get_many`].
    pub async fn get_many<K: Key, V: Value>(
        &mut self,
        table: &Table<K, V>,
        keys: &[K],
    ) -> Result<Vec<Option<V>>, Error> {
        self.tx.get_many(table, keys).await
    }

    /// The transaction's id.
    pub fn id(&self) -> u64 {
        self.tx.id()
    }
}
