//! Endpoint names that come from peers, checked before libfabric reads them.
//!
//! `fi_av_insert` and `fi_connect` read an address in the provider's format
//! with no length: a sockaddr is read as far as its family says, a string
//! address (`FI_ADDR_STR`, shm's) up to its NUL. A peer that sends a short,
//! empty or unterminated name would make libfabric read past the bytes we
//! hold (an empty name crashed tcp;ofi_rxm's `fi_av_insert`), so every name
//! from a peer or a launcher passes [`check_name`] first.

use crate::ffi;

/// Longest endpoint name accepted from a peer. libfabric's own names are
/// well under this (shm's string names are at most 256 bytes).
pub(crate) const MAX_NAME: usize = 1024;

const SOCKADDR_IN: usize = 16;
const SOCKADDR_IN6: usize = 28;

/// Whether `name`, received from a peer, is a well-formed address of
/// `format` (the domain's `addr_format`) for a provider whose own names look
/// like `own`. The error says what is wrong, for a message naming the peer.
pub(crate) fn check_name(format: u32, own: &[u8], name: &[u8]) -> Result<(), String> {
    if name.is_empty() {
        return Err("the address is empty".into());
    }
    if name.len() > MAX_NAME {
        return Err(format!(
            "the address is {} bytes, more than the {MAX_NAME} allowed",
            name.len()
        ));
    }
    let sized = |want: usize, what: &str| {
        if name.len() == want {
            Ok(())
        } else {
            Err(format!(
                "{what} is {want} bytes, but the address is {}",
                name.len()
            ))
        }
    };
    match format {
        ffi::FI_SOCKADDR_IN => {
            sized(SOCKADDR_IN, "an IPv4 socket address")?;
            family_is(name, libc::AF_INET, "IPv4")
        }
        ffi::FI_SOCKADDR_IN6 => {
            sized(SOCKADDR_IN6, "an IPv6 socket address")?;
            family_is(name, libc::AF_INET6, "IPv6")
        }
        ffi::FI_SOCKADDR => match family(name) {
            Some(f) if f == libc::AF_INET => sized(SOCKADDR_IN, "an IPv4 socket address"),
            Some(f) if f == libc::AF_INET6 => sized(SOCKADDR_IN6, "an IPv6 socket address"),
            _ => sized(own.len(), "this provider's address"),
        },
        ffi::FI_ADDR_STR => check_string(own, name),
        // A format we cannot parse: as long as our own names, where we
        // have one to compare with.
        _ if own.is_empty() => Ok(()),
        _ => sized(own.len(), "this provider's address"),
    }
}

fn family(name: &[u8]) -> Option<i32> {
    let b: [u8; 2] = name.get(..2)?.try_into().ok()?;
    Some(i32::from(u16::from_ne_bytes(b)))
}

fn family_is(name: &[u8], want: i32, what: &str) -> Result<(), String> {
    match family(name) {
        Some(f) if f == want => Ok(()),
        f => Err(format!(
            "the address family is {}, not {what} ({want})",
            f.map_or("missing".into(), |f| f.to_string())
        )),
    }
}

/// A string address: printable ASCII ended by one NUL, with the same
/// scheme (`fi_shm://`, `fi_ns://`, ...) as this provider's own names.
fn check_string(own: &[u8], name: &[u8]) -> Result<(), String> {
    let Some((&0, text)) = name.split_last() else {
        return Err("the string address is not NUL-terminated".into());
    };
    if let Some(i) = text.iter().position(|&b| !(0x21..=0x7e).contains(&b)) {
        return Err(format!(
            "the string address has byte {:#04x} at {i}; addresses are printable ASCII",
            text[i]
        ));
    }
    let scheme = |n: &[u8]| {
        let s = n.split(|&b| b == 0).next().unwrap_or(n);
        s.windows(3)
            .position(|w| w == b"://")
            .map(|i| s[..i + 3].to_vec())
    };
    match (scheme(own), scheme(text)) {
        (Some(mine), Some(theirs)) if mine != theirs => Err(format!(
            "the address is a {} address, and this provider's are {}",
            String::from_utf8_lossy(&theirs),
            String::from_utf8_lossy(&mine)
        )),
        (Some(mine), None) => Err(format!(
            "the address has no scheme, and this provider's begin with {}",
            String::from_utf8_lossy(&mine)
        )),
        _ => Ok(()),
    }
}

/// For the fuzz targets: this host's kind of own name in `format` (a
/// loopback socket address; empty for other formats).
pub(crate) fn fuzz_sample(format: u32) -> Vec<u8> {
    let (len, fam) = match format {
        ffi::FI_SOCKADDR_IN => (SOCKADDR_IN, libc::AF_INET),
        ffi::FI_SOCKADDR_IN6 => (SOCKADDR_IN6, libc::AF_INET6),
        _ => return Vec::new(),
    };
    let mut name = vec![0u8; len];
    name[..2].copy_from_slice(&(fam as u16).to_ne_bytes());
    name[2..4].copy_from_slice(&9228u16.to_be_bytes());
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sockaddr_in() -> Vec<u8> {
        let mut v = vec![0u8; 16];
        v[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v
    }

    #[test]
    fn socket_addresses_must_have_their_length_and_family() {
        let own = sockaddr_in();
        assert_eq!(check_name(ffi::FI_SOCKADDR_IN, &own, &own), Ok(()));
        for bad in [vec![], vec![2], own[..15].to_vec(), vec![0u8; 17]] {
            let e = check_name(ffi::FI_SOCKADDR_IN, &own, &bad).unwrap_err();
            assert!(e.contains("empty") || e.contains("16 bytes"), "{e}");
        }
        let mut wrong_family = own.clone();
        wrong_family[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        let e = check_name(ffi::FI_SOCKADDR_IN, &own, &wrong_family).unwrap_err();
        assert!(e.contains("not IPv4"), "{e}");
        let mut six = vec![0u8; 28];
        six[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        assert_eq!(check_name(ffi::FI_SOCKADDR_IN6, &six, &six), Ok(()));
        assert_eq!(check_name(ffi::FI_SOCKADDR, &own, &six), Ok(()));
        assert!(check_name(ffi::FI_SOCKADDR, &own, &six[..20]).is_err());
        let e = check_name(ffi::FI_SOCKADDR_IN, &own, &vec![0; MAX_NAME + 1]).unwrap_err();
        assert!(e.contains("more than the 1024"), "{e}");
    }

    #[test]
    fn string_addresses_must_be_terminated_printable_and_of_our_scheme() {
        let own = b"fi_shm://4242:0\0".to_vec();
        // Another process's name may be longer or shorter than ours.
        assert_eq!(
            check_name(ffi::FI_ADDR_STR, &own, b"fi_shm://1000000:12\0"),
            Ok(())
        );
        assert_eq!(check_name(ffi::FI_ADDR_STR, &own, b"fi_shm://7:0\0"), Ok(()));
        for (bad, why) in [
            (&b"fi_shm://4242:0"[..], "NUL-terminated"),
            (b"fi_shm://42\x0042:0\0", "byte 0x00"),
            (b"fi_shm://\n\0", "byte 0x0a"),
            (b"fi_sock://1.2.3.4\0", "fi_sock:// address"),
            (b"4242\0", "no scheme"),
            (b"\0", "no scheme"),
        ] {
            let e = check_name(ffi::FI_ADDR_STR, &own, bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn other_formats_must_be_as_long_as_our_own() {
        let own = vec![7u8; 24];
        assert_eq!(check_name(ffi::FI_SOCKADDR_IB, &own, &own), Ok(()));
        let e = check_name(ffi::FI_SOCKADDR_IB, &own, &own[..1]).unwrap_err();
        assert!(e.contains("24 bytes, but the address is 1"), "{e}");
    }
}
