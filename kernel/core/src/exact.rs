//! The exact (wildcard-free) filters of one exchange: an open-addressing hash
//! table of one cache line per entry.
//!
//! Most filters are exact, and at a million of them a lookup is memory
//! misses: a general hash map costs one for its control bytes, one for the
//! bucket and one for a key kept behind a pointer. Here an entry holds the
//! hash, the value and a short key inline (64 bytes, aligned), so a lookup is
//! usually one miss; and since the slot follows from the hash alone, a batch
//! can ask for the next topics' entries ahead ([`ExactTable::prefetch`]).

use std::hash::BuildHasher;

use crate::trie::{prefetch, ExactValue, Hit};

/// Longest key kept inline; longer ones live in `ExactTable::long_keys`.
const INLINE: usize = 30;
const EMPTY: u16 = u16::MAX;
const LONG: u16 = u16::MAX - 1;

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Entry {
    hash: u64,
    value: ExactValue,
    /// Key length (`EMPTY`: a free entry; `LONG`: `long_keys[index in key]`).
    len: u16,
    key: [u8; INLINE],
}

const FREE: Entry = Entry {
    hash: 0,
    value: ExactValue {
        hit: Hit {
            code: 0,
            rank: 0,
            subscriber: 0,
        },
        count: 0,
    },
    len: EMPTY,
    key: [0; INLINE],
};

pub struct ExactTable {
    entries: Vec<Entry>,
    mask: usize,
    long_keys: Vec<Box<[u8]>>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl ExactTable {
    /// A table of `items` (distinct keys), at most 5/8 full.
    pub fn new(items: &[(&[u8], ExactValue)]) -> Self {
        let capacity = (items.len() * 8 / 5 + 1).next_power_of_two().max(8);
        let mut table = ExactTable {
            entries: vec![FREE; capacity],
            mask: capacity - 1,
            long_keys: Vec::new(),
            hasher: hashbrown::DefaultHashBuilder::default(),
        };
        for &(key, value) in items {
            let hash = table.hash(key);
            let mut index = hash as usize & table.mask;
            while table.entries[index].len != EMPTY {
                index = (index + 1) & table.mask;
            }
            let entry = &mut table.entries[index];
            entry.hash = hash;
            entry.value = value;
            if key.len() <= INLINE {
                entry.len = key.len() as u16;
                entry.key[..key.len()].copy_from_slice(key);
            } else {
                entry.len = LONG;
                entry.key[..8].copy_from_slice(&(table.long_keys.len() as u64).to_ne_bytes());
                table.long_keys.push(key.into());
            }
        }
        table
    }

    pub fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Start loading the entry a key of `hash` would be found at first.
    #[inline(always)]
    pub fn prefetch(&self, hash: u64) {
        prefetch(&self.entries[hash as usize & self.mask]);
    }

    /// The value of `key`, whose hash is `hash`.
    pub fn get(&self, key: &[u8], hash: u64) -> Option<ExactValue> {
        let mut index = hash as usize & self.mask;
        loop {
            let entry = &self.entries[index];
            if entry.len == EMPTY {
                return None;
            }
            if entry.hash == hash {
                let stored: &[u8] = if entry.len == LONG {
                    &self.long_keys[u64::from_ne_bytes(entry.key[..8].try_into().unwrap()) as usize]
                } else {
                    &entry.key[..entry.len as usize]
                };
                if stored == key {
                    return Some(entry.value);
                }
            }
            index = (index + 1) & self.mask;
        }
    }
}
