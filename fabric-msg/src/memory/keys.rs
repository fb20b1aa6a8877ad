//! Remote keys fabric-msg chooses, where the provider lets the application
//! choose them (`mr_mode` without `FI_MR_PROV_KEY`).
//!
//! A key is what a peer must present to reach a registration, so it must
//! not be guessable from another key: each one is drawn from the operating
//! system's random source over the domain's whole key width. A key is
//! handed out at most once in a domain's life, even after its region is
//! closed: a revoked key then never opens a newer region while an old
//! descriptor may still be in someone's hands.
//!
//! Keys are drawn with the `getrandom` crate rather than `libc::getrandom`:
//! it retries on `EINTR` and short reads and needs no unsafe code here.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashSet;

/// Draws before a key space of up to 16 bits is searched in order instead.
const RANDOM_DRAWS: usize = 64;

/// The keys of one domain: their width and every key ever handed out.
#[derive(Debug)]
pub(crate) struct KeySpace {
    bits: u32,
    issued: Mutex<HashSet<u64>>,
}

impl KeySpace {
    /// Keys of `key_size` bytes (the domain's `mr_key_size`; 8 at most are
    /// used, as keys travel as `u64`).
    pub(crate) fn new(key_size: usize) -> KeySpace {
        KeySpace {
            bits: 8 * key_size.clamp(1, 8) as u32,
            issued: Mutex::new(HashSet::new()),
        }
    }

    /// Bits of randomness in each key.
    #[cfg(test)]
    fn bits(&self) -> u32 {
        self.bits
    }

    /// Usable keys: all values of the width but 0 and all ones, which some
    /// providers read as "no key" (`FI_KEY_NOTAVAIL` is all ones).
    fn capacity(&self) -> u64 {
        self.mask() - 1
    }

    fn mask(&self) -> u64 {
        if self.bits == 64 {
            u64::MAX
        } else {
            (1 << self.bits) - 1
        }
    }

    /// A key never handed out before in this domain, drawn at random.
    /// `provider` names the provider in the error when none is left.
    pub(crate) fn draw(&self, provider: &str) -> Result<u64> {
        let mut issued = self.issued.lock();
        if issued.len() as u64 >= self.capacity() {
            return Err(Error::Unsupported {
                what: format!(
                    "more than {} registrations in one domain: every {}-bit key was handed out once, \
                     and keys are never reused; open a new EventLoop for more",
                    self.capacity(),
                    self.bits
                ),
                provider: provider.to_string(),
            });
        }
        let usable = |k: u64| k != 0 && k != self.mask();
        for _ in 0..RANDOM_DRAWS {
            let key = random_u64()? & self.mask();
            if usable(key) && issued.insert(key) {
                return Ok(key);
            }
        }
        // Only a nearly full narrow key space gets here (a 64-bit one would
        // need 64 collisions in a row): walk it from a random start.
        let start = random_u64()? & self.mask();
        let key = (0..=self.mask())
            .map(|i| start.wrapping_add(i) & self.mask())
            .find(|&k| usable(k) && !issued.contains(&k))
            .expect("the capacity check leaves a free key");
        issued.insert(key);
        Ok(key)
    }

    /// How many keys were handed out.
    #[cfg(test)]
    fn issued(&self) -> usize {
        self.issued.lock().len()
    }
}

fn random_u64() -> Result<u64> {
    getrandom::u64().map_err(|e| {
        Error::Usage(format!(
            "the operating system's random source failed ({e}); remote keys cannot be drawn"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_random_and_fill_the_width() {
        let keys = KeySpace::new(8);
        let drawn: Vec<u64> = (0..10_000).map(|_| keys.draw("test").unwrap()).collect();
        let unique: HashSet<u64> = drawn.iter().copied().collect();
        assert_eq!(unique.len(), drawn.len(), "a key was handed out twice");
        // A counter gives neighbours; random 64-bit keys almost never lie
        // within 2^20 of each other (odds about 10^4 * 10^4 * 2^21 / 2^64).
        let mut sorted = drawn.clone();
        sorted.sort_unstable();
        let closest = sorted.windows(2).map(|w| w[1] - w[0]).min().unwrap();
        assert!(closest > 1 << 20, "two keys only {closest} apart");
        // Every bit position is used: the top byte is not always zero.
        assert!(drawn.iter().any(|k| k >> 56 != 0), "keys use only the low bits");
        assert_eq!(keys.issued(), 10_000);
    }

    #[test]
    fn a_narrow_key_space_is_filled_exactly_once_then_refused() {
        let keys = KeySpace::new(1);
        assert_eq!(keys.bits(), 8);
        let mut seen = HashSet::new();
        for _ in 0..254 {
            let k = keys.draw("test").unwrap();
            assert!(k != 0 && k != 0xff && k <= 0xff, "key {k:#x} out of range");
            assert!(seen.insert(k), "key {k:#x} twice");
        }
        let e = keys.draw("test").unwrap_err().to_string();
        assert!(
            e.contains("254 registrations") && e.contains("never reused") && e.contains("new EventLoop"),
            "{e}"
        );
    }

    #[test]
    fn widths_are_clamped_to_what_a_u64_carries() {
        assert_eq!(KeySpace::new(0).bits(), 8);
        assert_eq!(KeySpace::new(4).bits(), 32);
        assert_eq!(KeySpace::new(16).bits(), 64);
        let k = KeySpace::new(4).draw("test").unwrap();
        assert!(k <= u32::MAX as u64);
    }
}
