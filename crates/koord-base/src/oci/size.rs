//! Sizes that come from outside (descriptors, tar headers, part headers, `Range`), and their
//! sums: every one is checked, none wraps.
//!
//! An OCI descriptor's `size` is an int64 (image-spec `descriptor.md`), and a file offset is an
//! `off_t` (an i64 on every platform this runs on): [`MAX_SIZE`], 2^63 - 1, bounds a blob and
//! any sum of blobs that has to fit in one file. A larger size is refused wherever it is met.

/// The largest size a descriptor can declare and a file can hold: 2^63 - 1.
pub const MAX_SIZE: u64 = i64::MAX as u64;

/// `2^63 - 1`, for messages.
pub const MAX_SIZE_TEXT: &str = "2^63 - 1";

/// The sum of `sizes`, or `None` when it passes [`MAX_SIZE`].
pub fn checked_sum(sizes: impl IntoIterator<Item = u64>) -> Option<u64> {
    sizes
        .into_iter()
        .try_fold(0u64, |acc, s| acc.checked_add(s).filter(|&t| t <= MAX_SIZE))
}

/// `a + b`, or `None` when it passes [`MAX_SIZE`].
pub fn checked_add(a: u64, b: u64) -> Option<u64> {
    a.checked_add(b).filter(|&t| t <= MAX_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_stop_at_the_bound_and_never_wrap() {
        assert_eq!(checked_sum([1, 2, 3]), Some(6));
        assert_eq!(checked_sum([]), Some(0));
        assert_eq!(checked_sum([MAX_SIZE]), Some(MAX_SIZE));
        assert_eq!(checked_sum([MAX_SIZE, 1]), None);
        assert_eq!(checked_sum([u64::MAX, 1]), None);
        assert_eq!(checked_sum([u64::MAX]), None);
        // Two halves that wrap u64 to a small number: refused, not 158 bytes.
        assert_eq!(checked_sum([u64::MAX, 159]), None);
        assert_eq!(checked_add(MAX_SIZE - 1, 1), Some(MAX_SIZE));
        assert_eq!(checked_add(MAX_SIZE, 1), None);
    }
}
