//! The Redis names of one lock: the lock key `<prefix><namespace>{<key>}`, the keys and channel
//! named after it and the fence counter of its cluster slot; the way back from a Redis key to
//! the user's key, and the `SCAN` pattern of the lock keys whose user key matches a glob.

use std::sync::{Arc, LazyLock};

use super::ids::LockKey;
use crate::error::{ErrorKind, LockError};
use crate::scripts::{CHANNEL_SUFFIX, QUEUE_SUFFIX, TURN_SUFFIX};

/// The Redis names of one lock: the lock key, and the keys and channel named after it (made
/// when needed: the scripts name them themselves).
#[derive(Clone, Debug)]
pub(crate) struct KeyNames {
    /// The key as the caller wrote it.
    pub(crate) user: Arc<str>,
    pub(crate) lock: LockKey,
    /// The fence counter of the lock's cluster slot (see [`fence_counter`]; on one server
    /// every lock draws from [`server_counter`] instead).
    fence: Arc<str>,
}

impl KeyNames {
    /// `<prefix><namespace>{<key>}` (the mutex's namespace is empty, the other kinds' a word of
    /// their own such as `rw:`: no key of one namespace can name a key of another, the character
    /// after the prefix is always `{` for the mutex, a letter for the others), with `%`, `{` and
    /// `}` in the key written as `%25`, `%7B` and `%7D`: the hash tag (and so the cluster slot)
    /// is always the whole key, whatever text the key was built from, and since a lock key
    /// always ends with `}`, no key can name another lock's fence counter, waiting set or turn
    /// marker (`<lock key>:wq` and so on).
    pub(crate) fn in_namespace(
        prefix: &str,
        namespace: &str,
        key: &str,
    ) -> Result<KeyNames, LockError> {
        if key.is_empty() {
            return Err(LockError::new(
                ErrorKind::InvalidKey,
                "lock key is empty; give every lock a name such as \"goods:42\"",
            ));
        }
        let mut lock = String::with_capacity(prefix.len() + namespace.len() + key.len() + 2);
        lock.push_str(prefix);
        lock.push_str(namespace);
        lock.push('{');
        for c in key.chars() {
            match c {
                '%' => lock.push_str("%25"),
                '{' => lock.push_str("%7B"),
                '}' => lock.push_str("%7D"),
                c => lock.push(c),
            }
        }
        lock.push('}');
        Ok(KeyNames {
            user: key.into(),
            fence: fence_counter(prefix, slot_of(lock.as_bytes())).into(),
            lock: lock.into(),
        })
    }

    /// The names of the lock whose Redis key is `lock` (one this service's `in_namespace`
    /// made under `prefix`).
    pub(crate) fn of_lock_key(prefix: &str, lock: LockKey) -> KeyNames {
        let tagged = lock.strip_prefix(prefix).unwrap_or(&lock);
        let user = tagged
            .find('{')
            .and_then(|open| tagged[open + 1..].strip_suffix('}'))
            .map_or_else(|| lock.to_string(), decode_key);
        KeyNames {
            user: user.into(),
            fence: fence_counter(prefix, slot_of(lock.as_bytes())).into(),
            lock,
        }
    }

    /// The user key of the Redis key `<prefix><namespace>{<encoded key>}`; `None` for a key
    /// that is not a lock key of that namespace under `prefix` (another prefix's or
    /// namespace's, an auxiliary key).
    pub(crate) fn parse(prefix: &str, namespace: &str, redis_key: &str) -> Option<String> {
        let tagged = redis_key.strip_prefix(prefix)?.strip_prefix(namespace)?;
        let encoded = tagged.strip_prefix('{')?.strip_suffix('}')?;
        if encoded.is_empty() || encoded.contains(['{', '}']) {
            return None;
        }
        Some(decode_key(encoded))
    }

    /// The `SCAN MATCH` pattern of the lock keys under `prefix` of every kind whose key matches
    /// the glob `pattern`: the prefix with glob characters escaped, any namespace, and the pattern
    /// inside the hash tag written the way `KeyNames` writes keys. Auxiliary keys (`…}:wq`,
    /// `…}:turn`) never match: they do not end with `}`; the fence counters (`fence:{n}`) do,
    /// and [`parse`](Self::parse) tells them apart (no kind's namespace is `fence:`).
    pub(crate) fn scan_pattern(prefix: &str, pattern: &str) -> String {
        let mut glob = String::with_capacity(prefix.len() + pattern.len() + 4);
        for c in prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                glob.push('\\');
            }
            glob.push(c);
        }
        glob.push_str("*{");
        for c in pattern.chars() {
            match c {
                '%' => glob.push_str("%25"),
                '{' => glob.push_str("%7B"),
                '}' => glob.push_str("%7D"),
                c => glob.push(c),
            }
        }
        glob.push('}');
        glob
    }

    /// The fence counter of the lock's cluster slot: shared by every lock of the slot, never
    /// expiring (see [`fence_counter`]).
    pub(crate) fn fence(&self) -> &str {
        &self.fence
    }

    /// The set of services waiting for the lock.
    pub(crate) fn queue(&self) -> String {
        format!("{}{QUEUE_SUFFIX}", self.lock)
    }

    /// The marker of the service whose turn it is.
    pub(crate) fn turn(&self) -> String {
        self.suffixed(TURN_SUFFIX)
    }

    /// The key named after the lock key with `suffix`.
    pub(crate) fn suffixed(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.lock)
    }

    /// The wake-up channel.
    pub(crate) fn channel(&self) -> String {
        format!("{}{CHANNEL_SUFFIX}", self.lock)
    }
}

/// How many cluster slots there are.
const SLOTS: usize = 16_384;

/// The cluster slot of a Redis key, as Redis computes it: CRC16 (XMODEM) of its hash tag (the
/// text between the first `{` and the next `}`, when not empty) or of the whole key, mod 16384.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let crc = tagged
        .unwrap_or(key)
        .iter()
        .fold(0, |crc, &byte| crc16(crc, byte));
    crc % SLOTS as u16
}

/// The CRC16 of a text whose prefix has the CRC16 `crc`, once `byte` follows it.
fn crc16(crc: u16, byte: u8) -> u16 {
    (crc << 8) ^ CRC16[usize::from((crc >> 8) as u8 ^ byte)]
}

/// CRC16 (XMODEM, polynomial 0x1021) of every byte value: [`slot_of`] takes a byte at a time.
const CRC16: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// Per cluster slot, the smallest number whose decimal text hashes to that slot: the hash tag
/// of the slot's fence counter. A fixed table (the same in every process and version), made
/// once, by the first lock call of a process, in well under a millisecond: the numbers are
/// tried in order (about 110,000 of them), and the CRC16 of a number's text is that of its
/// tenth's text with its last digit added, one step each (writing every number as text took
/// that first call 5-10 ms).
static FENCE_TAGS: LazyLock<Box<[u32]>> = LazyLock::new(|| {
    let mut tags = vec![u32::MAX; SLOTS].into_boxed_slice();
    let mut missing = SLOTS;
    // the CRC16 of every number's decimal text so far, by number
    let mut crcs: Vec<u16> = Vec::with_capacity(1 << 17);
    let mut n: u32 = 0;
    while missing > 0 {
        let digit = b'0' + (n % 10) as u8;
        let tenth = if n < 10 { 0 } else { crcs[(n / 10) as usize] };
        let crc = crc16(tenth, digit);
        crcs.push(crc);
        let slot = usize::from(crc % SLOTS as u16);
        if tags[slot] == u32::MAX {
            tags[slot] = n;
            missing -= 1;
        }
        n += 1;
    }
    tags
});

/// `<prefix>fence:{<n>}`: the fencing-token counter of every lock in `slot` under `prefix`,
/// with `n` from [`FENCE_TAGS`], so that it lives in that slot. At most one counter per slot,
/// whatever the number of lock keys; counters never expire. No lock key has this form (a lock
/// key has `{` or a kind's namespace right after the prefix, never `fence:`).
fn fence_counter(prefix: &str, slot: u16) -> String {
    format!("{prefix}fence:{{{}}}", FENCE_TAGS[usize::from(slot)])
}

/// The fence counter every lock under `prefix` draws its tokens from on one server (single,
/// master-slave, Sentinel): one for all of them, so that the operations of one script call
/// share it (read once, written once per call); named as slot 0's, so it is a counter of the
/// same form as a cluster's (`<prefix>fence:{<n>}`).
pub(crate) fn server_counter(prefix: &str) -> String {
    fence_counter(prefix, 0)
}

/// Undoes `KeyNames`' escaping of `%`, `{` and `}` (left to right, so `%257B` is `%7B`).
fn decode_key(encoded: &str) -> String {
    let mut key = String::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some(at) = rest.find('%') {
        key.push_str(&rest[..at]);
        let escape = &rest[at..];
        let (decoded, len) = if escape.starts_with("%25") {
            ('%', 3)
        } else if escape.starts_with("%7B") {
            ('{', 3)
        } else if escape.starts_with("%7D") {
            ('}', 3)
        } else {
            ('%', 1)
        };
        key.push(decoded);
        rest = &escape[len..];
    }
    key.push_str(rest);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_use_a_hash_tag() {
        let n = KeyNames::in_namespace("lock:", "", "goods:42").unwrap();
        assert_eq!(&*n.lock, "lock:{goods:42}");
        assert_eq!(n.fence(), fence_counter("lock:", slot_of(b"goods:42")));
        assert_eq!(n.channel(), "lock:{goods:42}:ch");
        // braces from the key never choose the hash tag, and a key can never name another
        // lock's counter, waiting set or turn marker
        let n = KeyNames::in_namespace("lock:", "", "shop:{7}:goods:1").unwrap();
        assert_eq!(&*n.lock, "lock:{shop:%7B7%7D:goods:1}");
        let n = KeyNames::in_namespace("lock:", "", "a}:x{b").unwrap();
        assert_eq!(&*n.lock, "lock:{a%7D:x%7Bb}");
        let victim = KeyNames::in_namespace("lock:", "", "a{t}").unwrap();
        for reserved in [":wq", ":turn", ":ch"] {
            let n = KeyNames::in_namespace("lock:", "", &format!("a{{t}}{reserved}")).unwrap();
            assert_ne!(*n.lock, *format!("{}{reserved}", victim.lock));
            assert!(n.lock.ends_with('}'));
        }
        let n = KeyNames::in_namespace("lock:", "", "100%").unwrap();
        assert_eq!(&*n.lock, "lock:{100%25}");
        assert_ne!(
            n.lock,
            KeyNames::in_namespace("lock:", "", "100%25").unwrap().lock
        );
        let e = KeyNames::in_namespace("lock:", "", "").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidKey);
    }

    #[test]
    fn lock_keys_parse_back() {
        for namespace in ["", "rw:", "sem:"] {
            for key in ["goods:42", "shop:{7}:a", "100%", "a%7Bb", "x}y"] {
                let names = KeyNames::in_namespace("lock:", namespace, key).unwrap();
                assert_eq!(
                    KeyNames::parse("lock:", namespace, &names.lock),
                    Some(key.to_owned()),
                    "{}",
                    names.lock
                );
                for other in ["", "rw:", "sem:"].iter().filter(|n| **n != namespace) {
                    assert_eq!(KeyNames::parse("lock:", other, &names.lock), None);
                }
                for aux in [names.fence().to_owned(), names.queue(), names.turn()] {
                    assert_eq!(KeyNames::parse("lock:", namespace, &aux), None);
                }
            }
        }
        assert_eq!(KeyNames::parse("lock:", "", "other:{a}"), None);
        assert_eq!(KeyNames::parse("lock:", "", "lock:queue:{a}"), None);
        assert_eq!(KeyNames::parse("lock:", "", "lock:{}"), None);
        assert_eq!(decode_key("%25%7B%7D%zz%"), "%{}%zz%");
    }

    #[test]
    fn scan_patterns_escape_the_prefix_and_encode_the_key() {
        assert_eq!(KeyNames::scan_pattern("lock:", "*"), "lock:*{*}");
        assert_eq!(
            KeyNames::scan_pattern("a*[x]:", "goods:?"),
            "a\\*\\[x\\]:*{goods:?}"
        );
        assert_eq!(
            KeyNames::scan_pattern("lock:", "shop:{7}*"),
            "lock:*{shop:%7B7%7D*}"
        );
    }

    #[test]
    fn slots_are_redis_cluster_slots() {
        use redis::cluster_routing::Slot;
        for key in [
            "goods:42",
            "lock:{goods:42}",
            "a{}b",
            "{",
            "x{y",
            "fence:{12}",
            "",
        ] {
            assert_eq!(
                Some(Slot::for_key(key)),
                Slot::new(slot_of(key.as_bytes())),
                "{key}"
            );
        }
        // known values from the cluster spec
        assert_eq!(slot_of(b"123456789"), 0x31c3);
    }

    #[test]
    fn every_slots_counter_has_the_smallest_tag_of_that_slot() {
        // the names every version and process uses: slot 0's is the one server's counter
        assert_eq!(server_counter("lock:"), "lock:fence:{3560}");
        // each tag is the first number whose text hashes to its slot (checked by writing the
        // numbers out, for every slot whose tag is below 20,000)
        let mut first = vec![None; SLOTS];
        for n in 0u32..20_000 {
            let slot = usize::from(slot_of(n.to_string().as_bytes()));
            first[slot].get_or_insert(n);
        }
        let checked = first.iter().flatten().count();
        assert!(checked > 10_000, "{checked} slots checked");
        for (slot, n) in first.iter().enumerate() {
            if let Some(n) = n {
                assert_eq!(FENCE_TAGS[slot], *n, "slot {slot}");
            } else {
                assert!(FENCE_TAGS[slot] >= 20_000, "slot {slot}");
            }
        }
    }

    #[test]
    fn every_slot_has_one_fence_counter_in_that_slot() {
        let mut names = std::collections::HashSet::new();
        for slot in 0..SLOTS as u16 {
            let name = fence_counter("lock:", slot);
            assert_eq!(slot_of(name.as_bytes()), slot, "{name}");
            assert!(names.insert(name));
            // never a lock key of any namespace
            for namespace in ["", "rw:", "sem:"] {
                assert_eq!(
                    KeyNames::parse("lock:", namespace, &fence_counter("lock:", slot)),
                    None
                );
            }
        }
        // a lock and its counter share a slot, whatever the key
        for key in ["goods:42", "shop:{7}:a", "100%", "x}y"] {
            let n = KeyNames::in_namespace("lock:", "rw:", key).unwrap();
            assert_eq!(slot_of(n.fence().as_bytes()), slot_of(n.lock.as_bytes()));
        }
    }
}
