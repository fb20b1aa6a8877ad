//! The bytes `--verify` sends and checks: byte `k` of message `seq` is
//! `seq * 131 + k` (mod 256), so a message that lands in the wrong buffer,
//! arrives twice or is cut short is caught, not just corruption.

fn byte(seq: usize, k: usize) -> u8 {
    seq.wrapping_mul(131).wrapping_add(k) as u8
}

/// Fill `bytes` as message `seq`.
pub fn fill(bytes: &mut [u8], seq: usize) {
    for (k, b) in bytes.iter_mut().enumerate() {
        *b = byte(seq, k);
    }
}

/// Check that `bytes` is message `seq` of `len` bytes.
pub fn check(bytes: &[u8], seq: usize, len: usize) -> Result<(), String> {
    if bytes.len() != len {
        return Err(format!(
            "message {seq}: received {} bytes, expected {len}",
            bytes.len()
        ));
    }
    match bytes.iter().enumerate().find(|&(k, b)| *b != byte(seq, k)) {
        Some((k, b)) => Err(format!(
            "message {seq}: byte {k} of {len} is {b:#04x}, expected {:#04x}",
            byte(seq, k)
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catches_wrong_message_length_and_byte() {
        let mut b = vec![0u8; 300];
        fill(&mut b, 7);
        assert!(check(&b, 7, 300).is_ok());
        assert!(check(&b, 8, 300).unwrap_err().contains("byte 0"));
        assert!(check(&b[..299], 7, 300)
            .unwrap_err()
            .contains("received 299 bytes"));
        b[299] ^= 1;
        assert!(check(&b, 7, 300).unwrap_err().contains("byte 299 of 300"));
        assert!(check(&[], 3, 0).is_ok(), "empty messages are fine");
    }
}
