//! After `load` pushed OCI 1.1 referrers (the upstream ones a bundle carries, or the site's of
//! `--sign-images`) to a registry that serves the referrers API: does the API list them? A
//! client (`cosign verify --experimental-oci11`, an admission policy) finds a referrer only
//! there, so one it does not list stops the load before the install (fails closed). A
//! registry may index a manifest's subject a moment after it accepted the manifest: each
//! subject is asked at once and again after each wait of [`ASK_WAITS`] before it counts as not
//! listed.

use crate::admission::referrers;
use crate::oci::{Digest, ImageRef};
use crate::store::Registry;
use anyhow::Context as _;

/// Waits (seconds) before each ask: the first at once, then again for what the API did not
/// list yet. A caller that made the first ask itself passes `&ASK_WAITS[1..]`.
pub(super) const ASK_WAITS: [u64; 4] = [0, 1, 2, 4];

/// Referrers the registry's API must list: each subject (its image, its digest) with its
/// referrers (the referrer manifest's digest, and the name it is reported by).
pub(super) type Wanted = Vec<(ImageRef, Digest, Vec<(Digest, String)>)>;

/// Of the referrers of one subject, those a referrers answer (`bytes`) does not list; why it is
/// not a referrers list, if it is not one.
pub(super) fn not_listed(
    bytes: &[u8],
    want: &[(Digest, String)],
) -> Result<Vec<(Digest, String)>, String> {
    let listed = referrers::parse_list(bytes)?;
    Ok(want
        .iter()
        .filter(|(d, _)| !listed.iter().any(|l| &l.digest == d))
        .cloned()
        .collect())
}

/// Ask the referrers API for the referrers of `unlisted`, after each of `waits` (seconds; 0
/// asks at once); those it lists leave `unlisted`. Returns how many did. The API answered for
/// each subject before (that is why its referrers were pushed): a 404 now says the same as an
/// empty list.
pub(super) async fn ask_until_listed(
    reg: &Registry,
    unlisted: &mut Wanted,
    waits: &[u64],
) -> anyhow::Result<usize> {
    let mut found = 0;
    for &wait in waits {
        if unlisted.is_empty() {
            break;
        }
        if wait > 0 {
            tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
        }
        for (subject, signs, want) in unlisted.iter_mut() {
            let answer = reg
                .referrers(subject, signs)
                .await
                .with_context(|| format!("asking for the OCI 1.1 referrers of {subject}"))?;
            let still = match answer {
                Some(bytes) => not_listed(&bytes, want).map_err(|r| {
                    anyhow::anyhow!("the registry's referrers answer for {subject} is not a referrers list ({r})")
                })?,
                None => want.clone(),
            };
            found += want.len() - still.len();
            *want = still;
        }
        unlisted.retain(|(_, _, want)| !want.is_empty());
    }
    Ok(found)
}

/// The error for referrers still not listed after every ask of [`ASK_WAITS`]: `which` says
/// whose they are ("the carried referrers it accepted"), `fix` what to do.
pub(super) fn unlisted_error(unlisted: &Wanted, which: &str, fix: &str) -> anyhow::Error {
    let (asks, seconds) = (ASK_WAITS.len(), ASK_WAITS.iter().sum::<u64>());
    let names: Vec<&str> = unlisted
        .iter()
        .flat_map(|(_, _, want)| want.iter().map(|(_, name)| name.as_str()))
        .collect();
    anyhow::anyhow!(
        "the registry serves the OCI 1.1 referrers API but does not list {} of {which}, asked {asks} times over {seconds} s: {}; OCI 1.1 clients, and admission policies that look there, will not find them. Nothing was installed (what was pushed stays). {fix}",
        names.len(),
        names.join(", ")
    )
}
