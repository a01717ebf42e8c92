//! The values koord-bundle sets when `load` installs the Koordinator chart (written to a
//! private values file that helm reads first, before the user's `--values` and `--set`).
//!
//! Merging values files and reading `--set` is helm's job: koord-bundle passes them on as
//! they are, to `helm template` (build) and `helm upgrade --install` (load).

use serde_yaml_ng::{Mapping, Value};

/// The values koord-bundle sets for the Koordinator chart:
///
/// * `imageRepositoryHost` (the chart prefixes every image with it),
/// * `featureGates` when given,
/// * `crds.<key>: false` for each CRD switched off (values keys such as `reservations`),
/// * `manager.hostNetwork: true` when asked (only then: `false` is the chart's default, and
///   leaving it out keeps a value reused with `--reuse-values`),
/// * `imagePullSecrets` as a list of `{name: …}` when any.
pub fn generated_values(
    image_repository_host: &str,
    feature_gates: Option<&str>,
    crds_off: &[String],
    host_network: bool,
    image_pull_secrets: &[String],
) -> Value {
    let mut root = Mapping::new();
    root.insert("imageRepositoryHost".into(), image_repository_host.into());
    if let Some(fg) = feature_gates {
        root.insert("featureGates".into(), fg.into());
    }
    if !crds_off.is_empty() {
        let mut crds = Mapping::new();
        for k in crds_off {
            crds.insert(k.as_str().into(), Value::Bool(false));
        }
        root.insert("crds".into(), Value::Mapping(crds));
    }
    if host_network {
        let mut manager = Mapping::new();
        manager.insert("hostNetwork".into(), Value::Bool(true));
        root.insert("manager".into(), Value::Mapping(manager));
    }
    if !image_pull_secrets.is_empty() {
        let list = image_pull_secrets
            .iter()
            .map(|s| {
                let mut m = Mapping::new();
                m.insert("name".into(), s.as_str().into());
                Value::Mapping(m)
            })
            .collect();
        root.insert("imagePullSecrets".into(), Value::Sequence(list));
    }
    Value::Mapping(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn y(s: &str) -> Value {
        koord_base::yaml::parse_value("test", s.as_bytes(), &koord_base::yaml::VALUES)
            .expect("yaml")
    }

    #[test]
    fn generated_values_shape() {
        let val = generated_values(
            "h:1/p",
            Some("X=true,Y=false"),
            &["reservations".into(), "devices".into()],
            true,
            &["regcred".into(), "other".into()],
        );
        let expected: Value = y(
            "imageRepositoryHost: h:1/p\nfeatureGates: X=true,Y=false\ncrds: {reservations: false, devices: false}\nmanager: {hostNetwork: true}\nimagePullSecrets: [{name: regcred}, {name: other}]\n",
        );
        assert_eq!(val, expected);
        let minimal = generated_values("h", None, &[], false, &[]);
        assert_eq!(minimal, y("imageRepositoryHost: h"));
    }
}
