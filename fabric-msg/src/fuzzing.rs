//! Entry points for fuzzing: every decoder that takes bytes from a peer, a
//! launcher or a file, each as one function of arbitrary bytes that must
//! never panic, hang or allocate beyond the decoder's own limit. Used by the
//! cargo-fuzz targets (`fabric-msg/fuzz/`) for long runs and by the bounded
//! property-based run in the test suite (`tests/fuzz_decoders.rs`).
//!
//! Not part of the API: hidden from the docs, and free to change.
//!
//! Lives here: outside the layers, which it only calls into; nothing in the
//! crate uses it.

use crate::discovery::classify::FabricKind;
use crate::discovery::config::LadderConfig;
use crate::discovery::info::EndpointType;
use crate::discovery::profile::{check_peer, WireProfile, PROTOCOL_VERSION};
use crate::memory::access::Access;
use crate::memory::remote::RemoteMemory;

/// A plausible local profile to check decoded peers against.
fn local_profile() -> WireProfile {
    WireProfile {
        protocol_version: PROTOCOL_VERSION,
        provider: "tcp;ofi_rxm".into(),
        fabric_kind: FabricKind::Tcp,
        endpoint_type: EndpointType::Rdm,
        mr_key_size: 8,
        virt_addr: false,
        cq_data_size: 8,
        max_msg_size: 1 << 30,
        tag_bits: 64,
        framed: false,
        atomics_emulated: true,
    }
}

/// The bootstrap's handshake frame (after its 4-byte length, which the
/// reader checks against `MAX_FRAME` first), then what the handshake does
/// with a hello: the profile compared with ours, the endpoint name checked
/// as each address format would (the nonce any `u64` may be, and is only
/// sent back as connection data).
pub fn bootstrap_frame(body: &[u8]) {
    if let Some((profile, name, _nonce)) = crate::transport::bootstrap::fuzz_frame(body) {
        let _ = check_peer(&local_profile(), &profile);
        addresses(&name);
    }
}

/// An endpoint name from a peer or a launcher, checked as each address
/// format fabric-msg meets would check it.
pub fn addresses(name: &[u8]) {
    use crate::ffi;
    let sin = crate::transport::address::fuzz_sample(ffi::FI_SOCKADDR_IN);
    let sin6 = crate::transport::address::fuzz_sample(ffi::FI_SOCKADDR_IN6);
    let shm = b"fi_shm://4242\0".to_vec();
    for (format, own) in [
        (ffi::FI_SOCKADDR_IN, sin),
        (ffi::FI_SOCKADDR_IN6, sin6),
        (ffi::FI_ADDR_STR, shm),
    ] {
        let _ = crate::transport::address::check_name(format, &own, name);
    }
}

/// The World's rendezvous frame (after its length check).
pub fn rendezvous_frame(body: &[u8]) {
    let _ = crate::world::fuzz_rendezvous_frame(body);
}

/// A peer's [`WireProfile`], then the comparison with ours both ways.
pub fn wire_profile(bytes: &[u8]) {
    if let Ok(p) = WireProfile::decode(bytes) {
        let _ = check_peer(&local_profile(), &p);
        let _ = check_peer(&p, &local_profile());
        let _ = check_peer(&p, &p);
    }
}

/// A [`RemoteMemory`] descriptor through both ways in (`decode` and serde
/// through postcard), then the arithmetic a one-sided operation does with
/// it, at offsets and lengths taken from the input's end.
pub fn remote_memory(bytes: &[u8]) {
    let decoded = RemoteMemory::decode(bytes);
    let via_serde = postcard::from_bytes::<RemoteMemory>(bytes);
    for m in [decoded.ok(), via_serde.ok()].into_iter().flatten() {
        let tail = |k: usize| {
            let mut w = [0u8; 8];
            let n = bytes.len().min(8 * (k + 1));
            let from = n.saturating_sub(8);
            w[..n - from].copy_from_slice(&bytes[from..n]);
            u64::from_le_bytes(w)
        };
        let (offset, len) = (tail(0), tail(1));
        for access in [Access::Read, Access::Write, Access::ReadWrite] {
            if m.check(offset, len, access, "fuzz").is_ok() {
                let _ = m.target(offset);
            }
            if let Ok(w) = m.window(offset, len, access) {
                let _ = w.check(0, w.len(), access, "fuzz");
                let _ = w.encode();
            }
        }
        let _ = m.encode();
    }
}

/// `providers.toml` text (the loader reads at most 1 MiB of a regular file
/// first).
pub fn ladder_config(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let _ = LadderConfig::parse(text, "fuzz input");
    }
}

/// The header fabric-msg puts in front of framed messages, as a receive
/// reads it from whatever arrived.
pub fn frame_header(bytes: &[u8]) {
    crate::transport::event_loop::fuzz_header(bytes);
}

/// An emulated atomic's request or reply as the target or origin reads it
/// from whatever arrived in the reserved tag space.
pub fn atomic_message(bytes: &[u8]) {
    crate::transport::event_loop::fuzz_atomic_message(bytes);
}

/// `PMIX_LOCAL_PEERS`, as a launcher hands it over, for a world whose size
/// and rank come from the input's first bytes.
pub fn local_peers(bytes: &[u8]) {
    let (size, me, text) = match bytes {
        [s, m, rest @ ..] => (u32::from(*s) + 1, u32::from(*m), rest),
        _ => return,
    };
    let _ = crate::world::fuzz_local_peers(text, size, me % size);
}

/// Each target's name, its function, and real inputs to start from (what
/// fabric-msg itself sends or ships), for mutation-based fuzzing.
pub type Target = (&'static str, fn(&[u8]), Vec<Vec<u8>>);

/// Every target with its seeds.
pub fn targets() -> Vec<Target> {
    let profile = local_profile();
    let sin = crate::transport::address::fuzz_sample(crate::ffi::FI_SOCKADDR_IN);
    let shm = b"fi_shm://4242\0".to_vec();
    let remote = RemoteMemory::new(
        0x7f00_0000_1000,
        4096,
        0x1234_5678_9abc_def0,
        Vec::new(),
        Access::ReadWrite,
    );
    let raw = RemoteMemory::new(0x1000, 1 << 20, 0, vec![0xab; 16], Access::Read);
    let mut header = crate::transport::event_loop::fuzz_header_seeds();
    header.push(Vec::new());
    vec![
        (
            "bootstrap_frame",
            bootstrap_frame as fn(&[u8]),
            crate::transport::bootstrap::fuzz_seeds(profile.clone(), sin.clone()),
        ),
        ("addresses", addresses, vec![sin, shm]),
        (
            "rendezvous_frame",
            rendezvous_frame,
            crate::world::fuzz_rendezvous_seeds(),
        ),
        (
            "wire_profile",
            wire_profile,
            profile.encode().into_iter().collect(),
        ),
        (
            "remote_memory",
            remote_memory,
            vec![remote.encode(), raw.encode()],
        ),
        (
            "ladder_config",
            ladder_config,
            vec![include_bytes!("../../providers.toml").to_vec()],
        ),
        ("frame_header", frame_header, header),
        (
            "atomic_message",
            atomic_message,
            crate::transport::event_loop::fuzz_atomic_seeds(),
        ),
        (
            "local_peers",
            local_peers,
            vec![b"\x07\x02 0,2,5".to_vec(), b"\x00\x00 0".to_vec()],
        ),
    ]
}
