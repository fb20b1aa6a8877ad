//! Failure notices on the wire: a rank whose collective failed tells the
//! others (`engine.rs`, `notify`). Every notice from rank `r` has the one
//! tag `tags::notice_tag(r)`, so a rank can take them with exact receives
//! where masked ones misbehave (libfabric 1.17's shm); which communicator
//! and which collective travel in the notice's head, checked here before
//! anything is believed.

use crate::world::tags;

/// A notice's head: the communicator's context (1 byte) and the
/// collective's number (4 bytes, little-endian); its text follows.
pub(crate) const NOTICE_HEAD: usize = 5;

/// The token index of a notice receive on `lane` from `from` (or any rank).
pub(crate) fn notice_index(lane: u32, from: Option<u32>) -> u32 {
    lane | from.map_or(0, |r| (r + 1) << 1)
}

/// The lane and rank of a notice receive's token index.
pub(crate) fn notice_lane(index: u32) -> (u32, Option<u32>) {
    (index & 1, (index >> 1).checked_sub(1))
}

/// A notice's context, collective number and text; `None` if it is too
/// short or names a context that cannot exist.
pub(crate) fn decode_notice(b: &[u8]) -> Option<(u8, u32, String)> {
    let (&ctx, rest) = b.split_first()?;
    if u32::from(ctx) >= tags::MAX_CONTEXTS || rest.len() < NOTICE_HEAD - 1 {
        return None;
    }
    let seq = u32::from_le_bytes(rest[..4].try_into().ok()?) & tags::SEQ_MASK;
    Some((ctx, seq, String::from_utf8_lossy(&rest[4..]).into_owned()))
}

/// Write a notice about collective `seq` of context `ctx` with `text`
/// into `b`, which holds exactly `NOTICE_HEAD + text.len()` bytes.
pub(crate) fn encode_notice(b: &mut [u8], ctx: u8, seq: u32, text: &str) {
    b[0] = ctx;
    b[1..NOTICE_HEAD].copy_from_slice(&seq.to_le_bytes());
    b[NOTICE_HEAD..].copy_from_slice(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_round_trip_and_malformed_ones_are_refused() {
        let text = "rank 3 passed BitXor";
        let mut b = vec![0u8; NOTICE_HEAD + text.len()];
        encode_notice(&mut b, 5, 77, text);
        assert_eq!(decode_notice(&b), Some((5, 77, text.to_string())));
        assert_eq!(decode_notice(&[]), None, "empty");
        assert_eq!(decode_notice(&b[..NOTICE_HEAD - 1]), None, "no whole number");
        assert_eq!(
            decode_notice(&b[..NOTICE_HEAD]),
            Some((5, 77, String::new())),
            "no text"
        );
        b[0] = tags::MAX_CONTEXTS as u8;
        assert_eq!(decode_notice(&b), None, "a context that cannot exist");
        b[0] = 0;
        b[1..NOTICE_HEAD].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_notice(&b).map(|n| n.1),
            Some(tags::SEQ_MASK),
            "numbers wrap as the World's do"
        );
    }

    #[test]
    fn a_receives_token_index_names_its_lane_and_rank() {
        for lane in [0, 1] {
            assert_eq!(notice_lane(notice_index(lane, None)), (lane, None));
            for r in [0, 1, 4095, (1 << 24) - 1] {
                assert_eq!(notice_lane(notice_index(lane, Some(r))), (lane, Some(r)));
            }
        }
    }
}
