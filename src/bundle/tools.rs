//! The programs a bundle carries for its site (`build --with-tools`): koord-bundle and helm,
//! as files under `tools/<os>-<arch>/`, so one file crosses and the site needs neither
//! installed. Named and placed here; read from disk by the command layer.

use super::manifest::{BundleManifest, ToolRecord};

/// The folder of the carried programs.
pub const TOOLS_DIR: &str = "tools";

/// This machine's platform as Go and OCI name it (`linux/amd64`, `linux/arm64`,
/// `darwin/arm64`): the platform of the programs a build carries, and what `load` looks for.
pub fn host_platform() -> String {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    format!("{os}/{arch}")
}

/// The path of program `name` for `platform` in the bundle (`tools/linux-amd64/helm`).
pub fn file_of(platform: &str, name: &str) -> String {
    format!("{TOOLS_DIR}/{}/{name}", platform.replace('/', "-"))
}

/// The carried program `name` that runs on `platform`, if the bundle has one.
pub fn find<'a>(m: &'a BundleManifest, name: &str, platform: &str) -> Option<&'a ToolRecord> {
    m.tools
        .iter()
        .find(|t| t.name == name && t.platform == platform)
}

/// `koord-bundle 0.1.0 and helm v3.17.3 for linux/amd64`, or `None` without tools.
pub fn summary(m: &BundleManifest) -> Option<String> {
    if m.tools.is_empty() {
        return None;
    }
    let names: Vec<String> = m
        .tools
        .iter()
        .map(|t| format!("{} {} for {}", t.name, t.version, t.platform))
        .collect();
    Some(names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_the_platform() {
        assert_eq!(file_of("linux/amd64", "helm"), "tools/linux-amd64/helm");
        let p = host_platform();
        assert!(p.contains('/') && !p.contains("x86_64"), "{p}");
    }
}
