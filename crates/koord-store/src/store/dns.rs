//! Telling "this host name does not exist" from "the name service could not be asked".
//!
//! The resolver (`getaddrinfo`, behind reqwest and tokio) answers a name that does not exist
//! with `EAI_NONAME` or `EAI_NODATA`: the name service was asked and said no, so the same command
//! fails the same way again, and the name is most often a typo (`locahost`). It answers
//! `EAI_AGAIN` ("Temporary failure in name resolution") when no name server answered: that may
//! pass. Rust's `io::Error` of a failed look-up carries only the resolver's text, so the two are
//! told apart by that text, as glibc, musl and macOS word it.

/// Does this error text (a whole error chain, any case) say that the name does not exist?
pub fn does_not_resolve(text: &str) -> bool {
    let lower = text.to_lowercase();
    [
        "name or service not known",           // glibc EAI_NONAME
        "no address associated with hostname", // glibc EAI_NODATA
        "nodename nor servname provided",      // macOS EAI_NONAME
        "name does not resolve",               // musl EAI_NONAME
        "no such host",                        // Go-style resolvers and proxies
    ]
    .iter()
    .any(|s| lower.contains(s))
}

/// How many single-character edits turn `a` into `b` (for "did you mean localhost?").
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// " (did you mean localhost?)" when `name` is a near miss of `localhost`, else "".
pub fn localhost_hint(name: &str) -> &'static str {
    let d = edit_distance(&name.to_ascii_lowercase(), "localhost");
    if d > 0 && d <= 2 {
        " (did you mean localhost?)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_no_such_name_from_no_answer() {
        assert!(does_not_resolve(
            "dns error: failed to lookup address information: Name or service not known"
        ));
        assert!(does_not_resolve("No address associated with hostname"));
        assert!(!does_not_resolve(
            "failed to lookup address information: Temporary failure in name resolution"
        ));
        assert!(!does_not_resolve("Connection refused (os error 111)"));
        assert_eq!(edit_distance("locahost", "localhost"), 1);
        assert_eq!(edit_distance("", "ab"), 2);
        assert_eq!(localhost_hint("locahost"), " (did you mean localhost?)");
        assert_eq!(localhost_hint("LOCALHOTS"), " (did you mean localhost?)");
        assert_eq!(localhost_hint("registry.example"), "");
        assert_eq!(localhost_hint("localhost"), "");
    }
}
