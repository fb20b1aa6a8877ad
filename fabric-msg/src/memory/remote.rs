//! A peer's memory as that peer described it: the [`RemoteMemory`]
//! descriptor, its wire encoding, and the bounds and access checks every
//! one-sided operation passes before anything is posted.

use crate::error::{Error, Result};
use crate::memory::access::Access;
use serde::{Deserialize, Serialize};

/// The largest encoded [`RemoteMemory`] accepted from a peer.
pub const MAX_REMOTE_MEMORY: usize = 128;

/// Memory of a peer, as that peer described it: where to address it, the
/// key, how many bytes and what access. Send it in a message
/// ([`RemoteMemory::encode`]) and bring it in with
/// [`EventLoop::import`](crate::EventLoop::import), which checks it and maps
/// raw keys. It also serialises with serde, inside your own messages.
///
/// # What a descriptor protects
///
/// Handing a peer a descriptor gives it the registration behind it. What
/// keeps it from the rest of your memory is the provider, and depends on
/// it ([`Profile::remote_protection`](crate::Profile::remote_protection)
/// says which applies; `docs/reliability.md` has the details and the tests):
///
/// - **tcp, tcp;ofi_rxm, sockets, udp;ofi_rxd**: fabric-msg chooses the
///   keys, at random over 64 bits, never reusing one in a domain. The
///   provider checks the key, the bounds of the registration and its
///   access; a descriptor forged with another key, a shifted address, a
///   widened length or widened access reaches nothing (tested). The peer
///   sees the operation fail: `FI_EACCES` on sockets; on tcp and
///   tcp;ofi_rxm the connection ends (`FI_ECANCELED`, then `FI_ENOTCONN`);
///   on udp;ofi_rxd it never completes
///   ([`CompletionError::TimedOut`](crate::CompletionError::TimedOut)).
/// - **verbs** (InfiniBand, RoCE, iWARP): the NIC chooses 32-bit keys
///   (`FI_MR_PROV_KEY`). On common NICs the upper 24 bits index the NIC's
///   table and only the low 8 bits vary, so a peer on the fabric that can
///   post RDMA can find a live key by trying; the fabric itself (partitions,
///   VLANs, who is cabled in) is the boundary, as for every verbs program.
/// - **shm**: keys are not checked. The provider copies with the target's
///   virtual addresses, so any process of the same user on the host can read
///   and write the target's memory, registered or not, as it could through
///   `/proc/PID/mem`.
///
/// Revoking: closing or dropping the [`MemoryRegion`](crate::MemoryRegion)
/// deregisters it, and its key is never handed out again by that loop, so an
/// old descriptor cannot open a newer region.
///
/// To give a peer less: register less (the provider enforces the
/// registration, not a [`window`](RemoteMemory::window): a peer can forge a
/// window back to the whole registration), grant [`Access::Read`] where
/// writing is not needed (enforced by the provider), and close regions when
/// done. `FI_MR_ENDPOINT` binding, used only where a provider requires it,
/// chooses the local endpoint that serves a region, not which peer may use
/// it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteMemory {
    addr: u64,
    len: u64,
    key: u64,
    /// The whole key, under `FI_MR_RAW`; empty otherwise.
    raw_key: Vec<u8>,
    access: Access,
    /// A raw key was mapped by `import` (not consulted without raw keys,
    /// so a descriptor deserialised by the application's own serde works).
    #[serde(skip)]
    mapped: bool,
}

impl RemoteMemory {
    /// The descriptor of `len` bytes at `addr` (the base peers add offsets
    /// to) under `key`; `raw_key` is the whole key under `FI_MR_RAW`.
    pub(crate) fn new(addr: u64, len: u64, key: u64, raw_key: Vec<u8>, access: Access) -> RemoteMemory {
        let mapped = raw_key.is_empty();
        RemoteMemory {
            addr,
            len,
            key,
            raw_key,
            access,
            mapped,
        }
    }

    /// Bytes the peer made available.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Access the peer granted.
    pub fn access(&self) -> Access {
        self.access
    }

    /// A narrower window of this memory (to hand on to another peer).
    pub fn window(&self, offset: u64, len: u64, access: Access) -> Result<RemoteMemory> {
        self.check(offset, len, access, "narrowing a window")?;
        Ok(RemoteMemory {
            addr: self.addr + offset,
            len,
            access,
            ..self.clone()
        })
    }

    /// Encode with postcard, to send to a peer.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a RemoteMemory always encodes")
    }

    /// Decode bytes from a peer, refusing oversized or malformed input.
    /// Raw keys still need [`EventLoop::import`](crate::EventLoop::import).
    pub fn decode(bytes: &[u8]) -> Result<RemoteMemory> {
        if bytes.len() > MAX_REMOTE_MEMORY {
            return Err(Error::Encoding(format!(
                "remote memory descriptor of {} bytes, more than the {MAX_REMOTE_MEMORY} allowed",
                bytes.len()
            )));
        }
        let (mut m, rest): (RemoteMemory, &[u8]) = postcard::take_from_bytes(bytes)
            .map_err(|e| Error::Encoding(format!("remote memory descriptor does not decode ({e})")))?;
        if !rest.is_empty() {
            return Err(Error::Encoding(format!(
                "{} trailing bytes after the remote memory descriptor",
                rest.len()
            )));
        }
        if m.addr.checked_add(m.len).is_none() {
            return Err(Error::Encoding(format!(
                "remote memory descriptor wraps the address space ({:#x} + {})",
                m.addr, m.len
            )));
        }
        m.mapped = m.raw_key.is_empty();
        Ok(m)
    }

    /// Check an operation of `len` bytes at `offset` needing `needs`.
    pub(crate) fn check(&self, offset: u64, len: u64, needs: Access, operation: &'static str) -> Result<()> {
        // A descriptor deserialised by the application's own serde has not
        // passed `decode`: its base plus its length may wrap.
        if self.addr.checked_add(self.len).is_none() {
            return Err(Error::Encoding(format!(
                "remote memory descriptor wraps the address space ({:#x} + {}): it was not made by \
                 a peer's fabric-msg; refuse it",
                self.addr, self.len
            )));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => {
                return Err(Error::OutOfBounds {
                    what: "peer's memory",
                    offset,
                    len,
                    size: self.len,
                })
            }
        }
        if !self.access.covers(needs) {
            return Err(Error::AccessDenied {
                operation,
                needs: needs.to_string(),
                granted: self.access.to_string(),
            });
        }
        if !self.raw_key.is_empty() && !self.mapped {
            return Err(Error::Usage(
                "this remote memory has a raw key (FI_MR_RAW) that was not mapped: bring it in with \
                 EventLoop::import"
                    .into(),
            ));
        }
        Ok(())
    }

    /// (address, key) of byte `offset`.
    pub(crate) fn target(&self, offset: u64) -> (u64, u64) {
        (self.addr + offset, self.key)
    }

    pub(crate) fn raw_key(&self) -> &[u8] {
        &self.raw_key
    }

    pub(crate) fn set_mapped_key(&mut self, key: u64) {
        self.key = key;
        self.mapped = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(len: u64, access: Access) -> RemoteMemory {
        RemoteMemory {
            addr: 0x1000,
            len,
            key: 7,
            raw_key: Vec::new(),
            access,
            mapped: true,
        }
    }

    #[test]
    fn remote_checks_bounds_and_access_before_anything_is_posted() {
        let m = remote(100, Access::Read);
        assert!(m.check(0, 100, Access::Read, "read").is_ok());
        let e = m.check(90, 11, Access::Read, "read").unwrap_err();
        assert!(
            matches!(
                e,
                Error::OutOfBounds {
                    offset: 90,
                    len: 11,
                    size: 100,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            m.check(u64::MAX, 2, Access::Read, "read").is_err(),
            "overflow is out of bounds"
        );
        let e = m.check(0, 1, Access::Write, "write").unwrap_err().to_string();
        assert!(
            e.contains("remote write") && e.contains("granted only remote read"),
            "{e}"
        );
        assert_eq!(m.target(5), (0x1005, 7));
        let w = m.window(10, 20, Access::Read).unwrap();
        assert_eq!((w.target(0), w.len()), ((0x100a, 7), 20));
        assert!(m.window(90, 20, Access::Read).is_err());
        assert!(
            m.window(0, 1, Access::ReadWrite).is_err(),
            "a window cannot widen access"
        );
    }

    /// A descriptor that skipped `decode` (the application's own serde)
    /// with a base near the top of the address space is refused, not
    /// added up into a panic or a wrapped address.
    #[test]
    fn a_wrapping_descriptor_from_serde_is_refused() {
        let mut m = remote(4096, Access::ReadWrite);
        m.addr = u64::MAX - 100;
        for (offset, len) in [(0, 1), (200, 8), (4000, 96)] {
            let e = m.check(offset, len, Access::Read, "read").unwrap_err();
            assert!(e.to_string().contains("wraps the address space"), "{e}");
        }
        assert!(m.window(200, 8, Access::Read).is_err());
    }

    #[test]
    fn descriptors_inside_the_applications_own_serde_messages_work() {
        let m = remote(64, Access::ReadWrite);
        let bytes = postcard::to_stdvec(&(7u32, m.clone())).unwrap();
        let (_, back): (u32, RemoteMemory) = postcard::from_bytes(&bytes).unwrap();
        assert!(back.check(0, 8, Access::Write, "write").is_ok());
        assert_eq!(back.target(8), m.target(8));
    }

    #[test]
    fn descriptors_round_trip_and_hostile_ones_are_refused() {
        let m = remote(4096, Access::ReadWrite);
        assert_eq!(RemoteMemory::decode(&m.encode()).unwrap(), m);
        assert!(RemoteMemory::decode(&[0u8; MAX_REMOTE_MEMORY + 1]).is_err());
        assert!(RemoteMemory::decode(&[0xff; 12]).is_err());
        let mut wraps = m.clone();
        wraps.addr = u64::MAX - 10;
        assert!(RemoteMemory::decode(&wraps.encode())
            .unwrap_err()
            .to_string()
            .contains("wraps"));
        let bytes = m.encode();
        for cut in 0..bytes.len() {
            assert!(RemoteMemory::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut raw = m.clone();
        raw.raw_key = vec![1; 16];
        let raw = RemoteMemory::decode(&raw.encode()).unwrap();
        assert!(raw
            .check(0, 1, Access::Read, "read")
            .unwrap_err()
            .to_string()
            .contains("import"));
    }
}
