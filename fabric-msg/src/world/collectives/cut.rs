//! A failure's reason cut to the bytes a notice (`notice.rs`) or a slot
//! (`on_node.rs`) carries: the cut falls on a character boundary, so the
//! other ranks read whole UTF-8 (`str::floor_char_boundary` is not stable
//! yet).

/// The longest start of `text` of at most `max` bytes that ends on a
/// character boundary.
pub(crate) fn within(text: &str, max: usize) -> &str {
    let mut cut = text.len().min(max);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn a_cut_never_splits_a_character() {
        assert_eq!(within("abc", 10), "abc");
        assert_eq!(within("abc", 2), "ab");
        assert_eq!(within("", 3), "");
        // "é" is two bytes: a cut through it keeps neither.
        assert_eq!(within("aé", 2), "a");
        assert_eq!(within("aé", 3), "aé");
        assert_eq!(within("€", 2), "");
    }
}
