//! The framed header: on endpoints without remote CQ data (or where
//! framing is forced) each message starts with its length and optional
//! immediate data, and write_data's follow-up notice is recognised by it.

use crate::memory::buffer::HEADROOM;

/// fabric-msg's message header on framed endpoints: the payload length
/// (little-endian u64, top bit set when immediate data follows) and the
/// immediate data (little-endian u64).
pub(super) const DATA_FLAG: u64 = 1 << 63;
/// Set (with `DATA_FLAG`, length 0) in the follow-up message that carries
/// a write_data's immediate value where the fabric has no remote CQ data.
pub(super) const NOTIFY_FLAG: u64 = 1 << 62;

/// The header of write_data's follow-up message.
pub(crate) fn encode_notify(data: u64) -> [u8; HEADROOM] {
    let mut h = [0u8; HEADROOM];
    h[..8].copy_from_slice(&(DATA_FLAG | NOTIFY_FLAG).to_le_bytes());
    h[8..].copy_from_slice(&data.to_le_bytes());
    h
}

/// Whether a received frame is write_data's follow-up message.
pub(super) fn is_notify(h: &[u8; HEADROOM], received: usize) -> bool {
    received == HEADROOM && h[..8] == (DATA_FLAG | NOTIFY_FLAG).to_le_bytes()
}

pub(super) fn encode_header(len: usize, data: Option<u64>) -> [u8; HEADROOM] {
    let mut h = [0u8; HEADROOM];
    let word = len as u64 | if data.is_some() { DATA_FLAG } else { 0 };
    h[..8].copy_from_slice(&word.to_le_bytes());
    h[8..].copy_from_slice(&data.unwrap_or(0).to_le_bytes());
    h
}

/// (payload length, data) from a header, if `received` covers one.
pub(super) fn decode_header(h: &[u8; HEADROOM], received: usize) -> Option<(usize, Option<u64>)> {
    if received < HEADROOM {
        return None;
    }
    let word = u64::from_le_bytes(h[..8].try_into().ok()?);
    let data = u64::from_le_bytes(h[8..].try_into().ok()?);
    let len = usize::try_from(word & !(DATA_FLAG | NOTIFY_FLAG)).ok()?;
    Some((len, (word & DATA_FLAG != 0).then_some(data)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_short_frames() {
        let h = encode_header(3, Some(0xfeed));
        assert_eq!(decode_header(&h, HEADROOM + 3), Some((3, Some(0xfeed))));
        assert_eq!(decode_header(&encode_header(0, None), HEADROOM), Some((0, None)));
        assert_eq!(decode_header(&h, HEADROOM - 1), None, "shorter than a header");
        let n = encode_notify(42);
        assert!(is_notify(&n, HEADROOM) && !is_notify(&h, HEADROOM) && !is_notify(&n, HEADROOM + 1));
        assert_eq!(decode_header(&n, HEADROOM), Some((0, Some(42))));
    }
}
