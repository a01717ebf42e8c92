//! `koord-bundle keygen`.

use crate::bundle::sign;
use crate::cli::KeygenArgs;
use anyhow::Context as _;

/// Write a key pair.
pub fn run(args: KeygenArgs) -> anyhow::Result<()> {
    if args.cosign {
        return super::sign_images::keygen(args);
    }
    let dir = match args.output_dir {
        Some(d) => {
            // A folder given is not created (a typo would put the keys somewhere unseen);
            // the user's config directory is.
            super::output_dir(&d, true)?;
            d
        }
        None => super::config_dir()?,
    };
    // Before any password is asked for: a key is never overwritten.
    for f in [sign::SECRET_KEY_FILE, sign::PUBLIC_KEY_FILE] {
        if dir.join(f).exists() {
            return Err(sign::SignError::Exists(dir.join(f)).into());
        }
    }
    let password = if args.unencrypted {
        None
    } else {
        Some(super::key_password(true)?.context(
            "the secret key needs a password: set KOORD_BUNDLE_KEY_PASSWORD, run on a terminal, or pass --unencrypted",
        )?)
    };
    let (sk, pk) = sign::keygen(&dir, password.clone())?;
    let id = sign::key_id(sign::load_public_key(&pk)?.keynum());
    if args.json {
        super::print_json(
            &serde_json::json!({"secretKey": sk, "publicKey": pk, "keyId": id, "encrypted": password.is_some()}),
        )?;
    } else {
        crate::say!(
            "secret key: {} (keep it on the build machine)",
            sk.display()
        );
        crate::say!("public key: {} (copy it to the loading site)", pk.display());
        crate::say!("key id:     {id}");
    }
    Ok(())
}
