//! What a region lets its peers do: read, write, or both (least privilege).

use crate::ffi;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Remote access a region grants its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Access {
    /// Peers may read (`FI_REMOTE_READ`).
    Read,
    /// Peers may write (`FI_REMOTE_WRITE`).
    Write,
    /// Peers may read, write and use atomics.
    ReadWrite,
}

impl Access {
    /// Whether peers may read.
    pub fn read(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    /// Whether peers may write.
    pub fn write(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }

    /// Whether this grants everything `other` does.
    pub fn covers(self, other: Access) -> bool {
        (self.read() || !other.read()) && (self.write() || !other.write())
    }

    pub(crate) fn remote_bits(self) -> u64 {
        let mut bits = 0;
        if self.read() {
            bits |= ffi::FI_REMOTE_READ as u64;
        }
        if self.write() {
            bits |= ffi::FI_REMOTE_WRITE as u64;
        }
        bits
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Read => "remote read",
            Access::Write => "remote write",
            Access::ReadWrite => "remote read and write",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_is_least_privilege() {
        assert!(Access::ReadWrite.covers(Access::Read));
        assert!(!Access::Read.covers(Access::Write));
        assert!(!Access::Write.covers(Access::ReadWrite));
        assert_eq!(Access::Read.remote_bits(), ffi::FI_REMOTE_READ as u64);
    }
}
