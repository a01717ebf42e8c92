//! The `crd-ownership` check, over the chart's CRDs as found in the cluster (k8s-openapi's
//! `CustomResourceDefinition`, `None` when absent): unowned ones (Alibaba Cloud ACK's
//! ack-koordinator installs five) are left to their owner with `crds.<key>=false` (a Fail under
//! `--strict`, naming `--skip-crds`); another release's are a Fail.

use super::ownership::{adopt_commands, ownership, Ownership};
use super::{names, ChartCrd, Finding, Level, PreflightInput, CHECK_CRD_OWNERSHIP};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Findings for the chart's CRDs found in the cluster (`None`: absent), and the values to
/// switch off.
pub(crate) fn crd_findings(
    crds: &[(&ChartCrd, Option<CustomResourceDefinition>)],
    input: &PreflightInput<'_>,
) -> (Vec<Finding>, Vec<String>) {
    let mut out = Vec::new();
    let mut off = Vec::new();
    let mut ours: Vec<&str> = Vec::new();
    let mut absent: Vec<&str> = Vec::new();
    let mut unowned: Vec<&ChartCrd> = Vec::new();
    for (crd, obj) in crds {
        let Some(obj) = obj else {
            absent.push(&crd.name);
            continue;
        };
        match ownership(&obj.metadata, input.release, input.namespace) {
            Ownership::This => ours.push(&crd.name),
            Ownership::Unmanaged => unowned.push(crd),
            Ownership::Other { release, namespace } => out.push(Finding::new(
                Level::Fail,
                CHECK_CRD_OWNERSHIP,
                format!(
                    "CRD {} belongs to Helm release {release:?} in namespace {namespace:?}, not to {:?} in {:?}: Helm will refuse to install it into this release",
                    crd.name, input.release, input.namespace
                ),
                Some(format!(
                    "upgrade release {release:?} in namespace {namespace:?} instead, or leave the CRD to it with --skip-crds {}",
                    crd.plural
                )),
            )),
        }
    }
    if !unowned.is_empty() {
        // A CRD without a values switch cannot be left out: it must be adopted or removed.
        let (switchable, fixed): (Vec<&ChartCrd>, Vec<&ChartCrd>) =
            unowned.iter().partition(|c| c.values_key.is_some());
        for crd in &fixed {
            out.push(Finding::new(
                Level::Fail,
                CHECK_CRD_OWNERSHIP,
                format!(
                    "CRD {} exists without Helm ownership and the chart has no value to leave it out: Helm will refuse to install",
                    crd.name
                ),
                Some(adopt_commands("customresourcedefinition", &crd.name, None, input.release, input.namespace)),
            ));
        }
        if input.strict && !switchable.is_empty() {
            let plurals: Vec<&str> = switchable.iter().map(|c| c.plural.as_str()).collect();
            out.push(Finding::new(
                Level::Fail,
                CHECK_CRD_OWNERSHIP,
                format!(
                    "{} chart CRD(s) already exist without Helm ownership ({}), as on Alibaba Cloud ACK where ack-koordinator installs them: Helm refuses to install a chart whose resources exist unowned",
                    switchable.len(),
                    switchable.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
                ),
                Some(format!("--skip-crds {}", plurals.join(","))),
            ));
        } else {
            for crd in &switchable {
                let key = crd.values_key.as_deref().unwrap_or_default();
                off.push(format!("crds.{key}"));
                out.push(Finding::new(
                    Level::Warn,
                    CHECK_CRD_OWNERSHIP,
                    format!(
                        "CRD {} already exists without Helm ownership (installed by another tool, e.g. ACK's ack-koordinator): the chart will not manage it (crds.{key}=false) and the installed definition stays in use",
                        crd.name
                    ),
                    None,
                ));
            }
        }
    }
    if !ours.is_empty() {
        out.push(Finding::new(
            Level::Info,
            CHECK_CRD_OWNERSHIP,
            format!(
                "{} of {} chart CRD(s) are already managed by release {:?} in {:?}: they will be upgraded",
                ours.len(),
                crds.len(),
                input.release,
                input.namespace
            ),
            None,
        ));
    }
    if !absent.is_empty() && absent.len() < crds.len() {
        out.push(Finding::new(
            Level::Info,
            CHECK_CRD_OWNERSHIP,
            format!(
                "{} chart CRD(s) are not in the cluster yet and will be created: {}",
                absent.len(),
                names(absent.iter().copied())
            ),
            None,
        ));
    }
    (out, off)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::preflight::tests::{fixture, input};
    use serde_json::json;

    fn crd(name: &str) -> ChartCrd {
        let plural = name.split('.').next().unwrap().to_string();
        ChartCrd {
            name: name.into(),
            values_key: Some(plural.clone()),
            plural,
        }
    }

    #[test]
    fn ack_crds_values_off_or_strict_fail() {
        let crds = vec![
            crd("reservations.scheduling.koordinator.sh"),
            crd("podgroups.scheduling.sigs.k8s.io"),
            crd("devices.scheduling.koordinator.sh"),
        ];
        let found = vec![
            (
                &crds[0],
                Some(fixture(
                    "ack/crds/reservations.scheduling.koordinator.sh.json",
                )),
            ),
            (
                &crds[1],
                Some(fixture("ack/crds/podgroups.scheduling.sigs.k8s.io.json")),
            ),
            (&crds[2], None),
        ];
        let (f, off) = crd_findings(&found, &input(&[], &crds, false));
        assert_eq!(off, ["crds.reservations", "crds.podgroups"]);
        assert_eq!(f.iter().filter(|f| f.level == Level::Warn).count(), 2);
        assert!(
            f[0].message.contains("crds.reservations=false"),
            "{}",
            f[0].message
        );
        assert!(f.iter().any(|f| f.level == Level::Info
            && f.message
                .contains("1 chart CRD(s) are not in the cluster yet")));

        let (f, off) = crd_findings(&found, &input(&[], &crds, true));
        assert!(off.is_empty());
        let fail: Vec<&Finding> = f.iter().filter(|f| f.level == Level::Fail).collect();
        assert_eq!(fail.len(), 1);
        assert_eq!(
            fail[0].fix.as_deref(),
            Some("--skip-crds reservations,podgroups")
        );
    }

    #[test]
    fn crd_of_another_release_or_without_switch_fails() {
        let mut c = crd("reservations.scheduling.koordinator.sh");
        let other: CustomResourceDefinition = serde_json::from_value(json!({"metadata": {"name": c.name, "labels": {"app.kubernetes.io/managed-by": "Helm"}, "annotations": {"meta.helm.sh/release-name": "koordinator", "meta.helm.sh/release-namespace": "kube-system"}}})).unwrap();
        let crds = vec![c.clone()];
        let (f, off) = crd_findings(&[(&crds[0], Some(other))], &input(&[], &crds, false));
        assert!(off.is_empty());
        assert_eq!(f[0].level, Level::Fail);
        assert!(f[0].message.contains("\"kube-system\""), "{}", f[0].message);

        c.values_key = None;
        let crds = vec![c];
        let (f, off) = crd_findings(
            &[(&crds[0], Some(CustomResourceDefinition::default()))],
            &input(&[], &crds, false),
        );
        assert!(off.is_empty());
        assert_eq!(f[0].level, Level::Fail);
        assert!(f[0].fix.as_deref().unwrap().starts_with("kubectl label customresourcedefinition reservations.scheduling.koordinator.sh app.kubernetes.io/managed-by=Helm"));
    }
}
