//! Command-line definitions. The doc comments are the `--help` text.

use crate::bundle::pack::Compression;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Carry Koordinator into an air-gapped cluster: one signed bundle with the Helm chart, every
/// image it deploys (multi-arch) and its CRDs.
#[derive(Debug, Parser)]
#[command(name = "koord-bundle", version, about, long_about = None)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a minisign key pair (koord-bundle.key, koord-bundle.pub) for signing bundles.
    #[command(after_help = examples::KEYGEN)]
    Keygen(KeygenArgs),
    /// Resolve a chart version, pull every image it deploys and write one signed bundle.
    #[command(after_help = examples::BUILD)]
    Build(Box<BuildArgs>),
    /// Show what a bundle holds (reads only its head; no verification).
    #[command(after_help = examples::INSPECT)]
    Inspect(InspectArgs),
    /// Check a bundle's signature and every byte, with no network.
    #[command(after_help = examples::VERIFY)]
    Verify(VerifyArgs),
    /// What changed between two bundles (chart, images per platform, the bytes to carry,
    /// CRDs and their schemas, values defaults, signers), read from their heads only.
    #[command(after_help = examples::DIFF)]
    Diff(DiffArgs),
    /// Verify a bundle, push it into a private registry (digests unchanged), then install or
    /// upgrade Koordinator with helm from there.
    #[command(after_help = examples::LOAD)]
    Load(Box<LoadArgs>),
    /// Split a bundle into parts for media with a size limit (DVD, FAT32 sticks), optionally
    /// with parity parts that rebuild lost or damaged parts.
    #[command(after_help = examples::SPLIT)]
    Split(SplitArgs),
    /// Join the parts of a split bundle back into one file, byte-identical to the original
    /// (damaged or missing parts rebuilt from parity on the way).
    #[command(after_help = examples::JOIN)]
    Join(JoinArgs),
    /// Write the damaged or missing parts of a split set back whole, rebuilt from its parity
    /// parts, so the set can be copied on.
    #[command(after_help = examples::REPAIR)]
    Repair(RepairArgs),
    /// Serve a bundle (or a part of a split bundle) as a read-only OCI registry, with no
    /// extraction.
    #[command(after_help = examples::SERVE)]
    Serve(ServeArgs),
    /// helm's post-renderer, as `load` gives it to helm: rendered manifests on stdin, the
    /// manifests helm applies on stdout (CRDs marked helm.sh/resource-policy: keep).
    #[command(hide = true)]
    PostRender(PostRenderArgs),
}

/// `koord-bundle post-render --config FILE`.
#[derive(Debug, Clone, clap::Args)]
pub struct PostRenderArgs {
    /// What to change (JSON, written by load).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

/// The examples at the end of each command's `--help`.
mod examples {
    // Lines under 80 columns: clap wraps help text to the terminal.
    pub const KEYGEN: &str = "\
Examples:
  koord-bundle keygen         # password: KOORD_BUNDLE_KEY_PASSWORD or a prompt
  koord-bundle keygen --unencrypted --output-dir ./keys";
    pub const BUILD: &str = "\
Examples:
  koord-bundle build 1.8.0            # koordinator-1.8.0.tar, signed
  koord-bundle build latest --dry-run # the plan; no layer downloaded
  koord-bundle build 1.8.0 --platform linux/amd64 --source ghcr -o k.tar
  koord-bundle build 1.8.0 --split dvd --parity 1
  koord-bundle build 1.8.0 --since koordinator-1.7.0.tar  # what is new";
    pub const INSPECT: &str = "\
Examples:
  koord-bundle inspect koordinator-1.8.0.tar
  koord-bundle inspect koordinator-1.8.0.tar --manifest old.json
  koord-bundle inspect koordinator-1.8.0.tar --sbom bom.cdx.json";
    pub const DIFF: &str = "\
Examples:
  koord-bundle diff koordinator-1.7.0.tar koordinator-1.8.0.tar
  koord-bundle diff old.json koordinator-1.8.0.tar --format markdown > ticket.md
  koord-bundle diff a.tar b.tar --key koord-bundle.pub --json";
    pub const VERIFY: &str = "\
Examples:
  koord-bundle verify koordinator-1.8.0.tar --key koord-bundle.pub
  koord-bundle verify koordinator-1.8.0.tar.part002 --key koord-bundle.pub";
    pub const LOAD: &str = "\
Examples:
  koord-bundle load koordinator-1.8.0.tar --registry reg.example:5000/koord \\
      --key koord-bundle.pub
  koord-bundle load --registry reg.example --dry-run  # the bundle here
  echo \"$PW\" | koord-bundle load k.tar --registry harbor.example/koord \\
      --username ci --password-stdin --no-install";
    pub const SPLIT: &str = "\
Examples:
  koord-bundle split koordinator-1.8.0.tar --size dvd --parity 1
  koord-bundle split koordinator-1.8.0.tar --size 700M --output-dir /media/usb";
    pub const JOIN: &str = "\
Examples:
  koord-bundle join koordinator-1.8.0.tar.part000 --key koord-bundle.pub
  koord-bundle join /media/dvd/koordinator-1.8.0.tar.part001 \\
      -o /data/koordinator-1.8.0.tar --key koord-bundle.pub";
    pub const REPAIR: &str = "\
Examples:
  koord-bundle repair koordinator-1.8.0.tar.part003 --key koord-bundle.pub";
    pub const SERVE: &str = "\
Examples:
  koord-bundle serve koordinator-1.8.0.tar --key koord-bundle.pub
      # this machine only: 127.0.0.1:5000
  koord-bundle serve koordinator-1.8.0.tar --addr 0.0.0.0:5000 \\
      --tls-cert cert.pem --tls-key key.pem   # for the cluster's nodes";
}

impl Command {
    /// Whether `--json` was given: the result, and a failure too, is then one JSON document on
    /// stdout.
    pub fn json(&self) -> bool {
        match self {
            Command::Keygen(a) => a.json,
            Command::Build(a) => a.json,
            Command::Inspect(a) => a.json,
            Command::Verify(a) => a.json,
            Command::Diff(a) => a.json || a.format == "json",
            Command::Load(a) => a.json,
            Command::Split(a) => a.json,
            Command::Join(a) => a.json,
            Command::Repair(a) => a.json,
            Command::Serve(_) | Command::PostRender(_) => false,
        }
    }
}

/// `split`.
#[derive(Debug, Args)]
pub struct SplitArgs {
    /// The bundle.
    pub bundle: PathBuf,
    /// Largest part: 700M, 4G (powers of 1024), 4GB (powers of 1000), dvd, dl-dvd, bd, fat32.
    #[arg(long, value_name = "SIZE")]
    pub size: String,
    /// N more parts of Reed-Solomon recovery data, each as large as a data part: any N missing
    /// parts are rebuilt, and so is any damage that leaves at most N damaged blocks in each
    /// stripe of blocks across the parts.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub parity: usize,
    /// With --parity N: one code over the whole set instead of one per stripe, as par2 makes:
    /// any damage of up to N parts' worth of blocks is rebuilt wherever it falls (the same
    /// place scratched on more than N discs too). Slower to repair and to read when damaged:
    /// the whole set is checked and its damage rebuilt at once.
    #[arg(long)]
    pub spread: bool,
    /// Where to write the parts (an existing directory) [default: next to the bundle]. Parts
    /// of an earlier split of the same bundle there are replaced.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Sign the parts' header with this key, so the set is trusted before any part is read
    /// [default: the key in the user's config directory, if there is one].
    #[arg(long, value_name = "FILE")]
    pub sign_key: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// How a command that reads a bundle or a split set trusts it: `join`, `repair`, `serve`,
/// `verify` and `load` take the same two options, declared once.
#[derive(Debug, Clone, Args)]
pub struct SignatureArgs {
    /// Public key that signed the bundle (and a split set's header) [default: koord-bundle.pub
    /// in the user's config directory].
    #[arg(long, value_name = "PUB")]
    pub key: Option<PathBuf>,
    /// Do not check the signature (an unsigned bundle or set, or no key at hand): every byte
    /// is still checked against the bundle's own checksums, and the command says so.
    #[arg(long)]
    pub insecure_skip_signature: bool,
}

/// `join`.
#[derive(Debug, Args)]
pub struct JoinArgs {
    /// A part of the set (any part of a set written by this version; the first part,
    /// NAME.part000, of an older one).
    pub first_part: PathBuf,
    /// Output file [default: the original bundle name, in the current directory].
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// `--key` and `--insecure-skip-signature`.
    #[command(flatten)]
    pub signature: SignatureArgs,
    /// Replace the output file when it exists (otherwise join refuses to).
    #[arg(long)]
    pub force: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `repair`.
#[derive(Debug, Args)]
pub struct RepairArgs {
    /// A part of the set: any part that survived.
    pub part: PathBuf,
    /// `--key` and `--insecure-skip-signature`.
    #[command(flatten)]
    pub signature: SignatureArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The bundle, or a part of a split bundle (any part; the first of an older set).
    pub bundle: PathBuf,
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:5000")]
    pub addr: String,
    /// TLS certificate (PEM) [with --tls-key].
    #[arg(long, value_name = "F", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) [with --tls-cert].
    #[arg(long, value_name = "F", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// htpasswd file (bcrypt entries, as `htpasswd -B` writes) for basic auth.
    #[arg(long, value_name = "F")]
    pub htpasswd: Option<PathBuf>,
    /// `--key` and `--insecure-skip-signature`.
    #[command(flatten)]
    pub signature: SignatureArgs,
    /// Most connections open at once; one client address may hold at most 64 of them (or half,
    /// when that is fewer). When full, the connection idle longest is closed for a newcomer.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u16).range(2..))]
    pub max_connections: u16,
}

/// `keygen`.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Where to write the key pair: an existing directory [default: the user's config directory,
    /// ~/.config/koord-bundle, created if needed]. An existing key is never overwritten.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Do not protect the secret key with a password (otherwise the password comes from
    /// KOORD_BUNDLE_KEY_PASSWORD or a prompt on a terminal).
    #[arg(long)]
    pub unencrypted: bool,
    /// Write a cosign key pair (cosign.key, encrypted, 0600, and cosign.pub, cosign's format)
    /// for `load --sign-images`, instead of the bundle signing key; the password comes from
    /// COSIGN_PASSWORD or a prompt on a terminal.
    #[arg(long, conflicts_with = "unencrypted")]
    pub cosign: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Chart version: `1.8.0`, `v1.8.0`, `latest`, or a range (`~1.7`, `>=1.6 <1.8`).
    #[arg(default_value = "latest")]
    pub version: String,
    /// Helm chart repository (URL or local directory holding index.yaml).
    #[arg(
        long,
        value_name = "URL",
        default_value = "https://koordinator-sh.github.io/charts/"
    )]
    pub repo: String,
    /// Use this chart archive (downloaded by hand) instead of the repository.
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,
    /// Go on when the chart archive does not match the index digest, or the index gives none
    /// (recorded in the bundle).
    #[arg(long)]
    pub allow_chart_digest_mismatch: bool,
    /// Image source, in order of preference, falling back per image: aliyun, aliyun-hangzhou,
    /// ghcr, dockerhub, chart (the chart's imageRepositoryHost) or HOST[:PORT][/PATH]
    /// [default: chart, ghcr, aliyun-hangzhou]. Repeatable.
    #[arg(long = "source", value_name = "SRC")]
    pub sources: Vec<String>,
    /// Keep only these platforms (e.g. linux/amd64,linux/arm64) [default: all]. Repeatable.
    #[arg(long, value_name = "P,...", value_delimiter = ',')]
    pub platform: Vec<String>,
    /// Add an image by hand (full reference). Repeatable.
    #[arg(long = "image", value_name = "REF")]
    pub images: Vec<String>,
    /// The helm binary (3.8 or newer) that renders the chart with `helm template` to find its
    /// images (recorded in the bundle) [default: helm on PATH].
    #[arg(long, value_name = "PATH")]
    pub helm: Option<PathBuf>,
    /// Values file passed to `helm template` when finding the images. Repeatable.
    #[arg(long = "values", short = 'f', value_name = "FILE")]
    pub values: Vec<PathBuf>,
    /// Value passed to `helm template` (its --set) when finding the images. Repeatable.
    #[arg(long = "set", value_name = "K=V")]
    pub set: Vec<String>,
    /// Output file [default: koordinator-<version>.tar].
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Signing key [default: koord-bundle.key in the user's config directory].
    #[arg(long, value_name = "FILE")]
    pub sign_key: Option<PathBuf>,
    /// Write an unsigned bundle (loading it then needs --insecure-skip-signature).
    #[arg(long, conflicts_with = "sign_key")]
    pub unsigned: bool,
    /// Also keep every blob in this content-addressed blob store (a cache shared by the builds
    /// of a build server), and take blobs from it. Without it, blobs are taken from the
    /// bundles built before on this host (their index is in the cache directory) and written
    /// once, into the bundle.
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Take no blob from earlier bundles and do not add this bundle to their index (an
    /// interrupted build still resumes from its own .partial file).
    #[arg(long, conflicts_with = "cache")]
    pub no_cache: bool,
    /// Take the blobs this plain-tar bundle holds from it (re-hashed) rather than download
    /// them; it is added to the index of earlier bundles. Repeatable.
    #[arg(long, value_name = "BUNDLE")]
    pub reuse: Vec<PathBuf>,
    /// Parallel downloads.
    #[arg(long, short = 'j', value_name = "N", default_value_t = 4)]
    pub jobs: usize,
    /// Speak plain HTTP to custom (HOST[:PORT]) sources and --image registries.
    #[arg(long)]
    pub plain_http: bool,
    /// Extra CA certificate (PEM) to trust for registries and the chart repository. Repeatable.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Vec<PathBuf>,
    /// Resolve and discover, fetch manifests only, print the plan; download no layer.
    #[arg(long)]
    pub dry_run: bool,
    /// Write the bundle as parts of at most SIZE (700M, 4G, dvd, bd, fat32) instead of one file.
    #[arg(long, value_name = "SIZE")]
    pub split: Option<String>,
    /// With --split: N more parts of recovery data, so that any N missing parts are rebuilt
    /// (see `split --parity`).
    #[arg(long, value_name = "N", requires = "split", default_value_t = 0)]
    pub parity: usize,
    /// With --parity N: one code over the whole set (see `split --spread`).
    #[arg(long, requires = "split")]
    pub spread: bool,
    /// Leave out every blob this older bundle (or its manifest, from `inspect --manifest`)
    /// already carried: an incremental bundle for a site that loaded the old one.
    #[arg(long, value_name = "OLD_BUNDLE")]
    pub since: Option<PathBuf>,
    /// Compress the whole bundle (layers are already compressed; plain tar is the default).
    #[arg(long, value_enum, default_value = "none")]
    pub compress: Compression,
    /// Also carry the programs the site needs to load the bundle: this koord-bundle and the
    /// helm that rendered the chart (both for this machine's platform), under
    /// tools/<os>-<arch>/, listed in the signed checksum file. One file then crosses.
    #[arg(long)]
    pub with_tools: bool,
    /// Also carry each image's cosign signatures and attestations (the `sha256-<hex>.sig` and
    /// `.att` tags next to it at its source, for its index and each platform manifest); `load`
    /// pushes them unchanged. OCI 1.1 referrers are not read.
    #[arg(long)]
    pub with_signatures: bool,
    /// With --with-signatures: check every carried signature and attestation against this
    /// cosign public key (PEM, `cosign.pub`) before anything is written; one that does not
    /// verify, or an image this key did not sign, stops the build (exit 1).
    #[arg(long, value_name = "PUB", requires = "with_signatures")]
    pub verify_key: Option<PathBuf>,
    /// With --verify-key: carry an image that has no signature upstream without one (a
    /// warning says which) instead of refusing it. A signature that is there must still verify.
    #[arg(long, requires = "verify_key")]
    pub allow_unsigned_images: bool,
    /// Print the result as JSON on stdout (progress is silent).
    #[arg(long)]
    pub json: bool,
}

/// `inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The bundle, or a part of a split bundle (any part; the first of an older set).
    pub bundle: PathBuf,
    /// Write the bundle manifest alone to FILE (for a later `build --since FILE`, or `diff`);
    /// inspect then says where, and prints no table (--json still prints its document).
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// Write the bundle's bill of materials (CycloneDX 1.6 JSON) to FILE (inspect then says
    /// where, and prints no table; --json still prints its document), or to standard output
    /// without FILE (then nothing else is printed there). A bundle written before bundles
    /// carried one gets one derived from its manifest, CRD files and index manifests (marked
    /// as derived).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub sbom: Option<PathBuf>,
    /// Replace the --manifest or --sbom FILE when it exists (otherwise inspect refuses to).
    #[arg(long)]
    pub force: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The bundle already inside: a bundle, any part of a split set, or the file `inspect
    /// --manifest` writes.
    pub old: PathBuf,
    /// The bundle to carry in: the same kinds.
    pub new: PathBuf,
    /// Public key to check each bundle's signature with (key ID and verified yes/no are
    /// reported per bundle; without it: "not checked").
    #[arg(long, value_name = "PUB")]
    pub key: Option<PathBuf>,
    /// Output: `table` (readable on a terminal), `markdown` (for an approval ticket) or `json`.
    #[arg(long, value_name = "FORMAT", default_value = "table", value_parser = ["table", "markdown", "json"])]
    pub format: String,
    /// Print JSON (the same as `--format json`).
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
}

/// `verify`.
#[derive(Debug, Args)]
#[command(mut_group("kube", |g| g.requires("cluster")))]
pub struct VerifyArgs {
    /// The bundle, or a part of a split bundle (any part; the first, NAME.part000, of an older
    /// set): every block of every part is checked against the signed header, and damaged or
    /// missing ones are rebuilt from parity when the set has parity parts.
    pub bundle: PathBuf,
    /// `--key` and `--insecure-skip-signature`.
    #[command(flatten)]
    pub signature: SignatureArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Then check the cluster against the bundle: every container (init, regular, ephemeral)
    /// of the release's pods runs a digest the bundle carries for its image (exit 1 naming
    /// those that do not; exit 4, "could not tell", when nothing failed but a container has not
    /// started).
    #[arg(long)]
    pub cluster: bool,
    /// The release and the cluster (with --cluster).
    #[command(flatten, next_help_heading = "With --cluster")]
    pub kube: KubeArgs,
}

/// The release and the cluster it is in: load's, and verify's with --cluster (which refuses
/// them without it).
#[derive(Debug, Clone, Args)]
#[group(id = "kube", multiple = true)]
pub struct KubeArgs {
    /// Release name.
    #[arg(long, default_value = "koordinator")]
    pub release: String,
    /// Release namespace: where helm keeps its release records [default: default, as
    /// Koordinator's guide installs it; load also finds the namespace release NAME is in]. The
    /// chart puts its own objects into koordinator-system whatever this is.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Kubeconfig, one file [default: the $KUBECONFIG list, merged as kubectl merges it, else
    /// ~/.kube/config]. load's helm gets the same files.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context [default: the current context]; load's helm gets the context used.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

/// `load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// The bundle, or a part of a split bundle (any part; the first of an older set)
    /// [default: the single koordinator-* bundle, or split set, in the current directory].
    pub bundle: Option<PathBuf>,
    /// Target registry: HOST[:PORT][/PREFIX].
    #[arg(long, value_name = "HOST[:PORT][/PREFIX]")]
    pub registry: String,
    /// `--key` and `--insecure-skip-signature`.
    #[command(flatten)]
    pub signature: SignatureArgs,
    /// Registry user (with --password-stdin).
    #[arg(long, value_name = "U", requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the registry password from standard input.
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
    /// Extra CA certificate (PEM) for the registry. Repeatable.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Vec<PathBuf>,
    /// Speak plain HTTP to the registry.
    #[arg(long)]
    pub plain_http: bool,
    /// Do not verify the registry's TLS certificate (a warning is printed).
    #[arg(long)]
    pub insecure_skip_tls_verify: bool,
    /// Parallel uploads.
    #[arg(long, short = 'j', value_name = "N", default_value_t = 4)]
    pub jobs: usize,
    /// Harbor: create the project pushed into (the first path component: PREFIX's first part,
    /// else koordinator-sh and charts) when it does not exist, as a private project, through
    /// Harbor's API; the login must be allowed to create projects.
    #[arg(long)]
    pub create_project: bool,
    /// Push only: no helm and no pre-flight of the cluster (helm is then not needed).
    #[arg(long)]
    pub no_install: bool,
    /// Sign every image pushed (each index and platform manifest) with this cosign private
    /// key (cosign.key of `cosign generate-key-pair` or `keygen --cosign`; its password from
    /// COSIGN_PASSWORD or a prompt), and attach each image's CycloneDX BOM entry as a cosign
    /// attestation, in cosign's tag scheme: for admission policies that admit signed images
    /// only. An image this key signed already is not signed again.
    #[arg(long, value_name = "KEY")]
    pub sign_images: Option<PathBuf>,
    /// With --sign-images: the folder the two admission policies for the key are written
    /// into (koordinator-signed-kyverno.yaml, a Kyverno ImageValidatingPolicy, and
    /// koordinator-signed-policy-controller.yaml, a sigstore ClusterImagePolicy), each
    /// admitting the images under --registry only when signed by this key, offline (no
    /// transparency log). Default: the current directory. Written also with --no-install.
    #[arg(long, value_name = "DIR", requires = "sign_images")]
    pub policy_dir: Option<PathBuf>,
    /// Push and install nothing: verify, pre-flight, print the push plan and the helm command,
    /// and render the chart with helm to check every image is in the bundle.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// The helm binary [default: helm on PATH].
    #[arg(long, value_name = "PATH")]
    pub helm: Option<PathBuf>,
    /// `--release`, `--namespace`, `--kubeconfig`, `--context`.
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Values file passed to helm (after the generated values). Repeatable.
    #[arg(long = "values", short = 'f', value_name = "FILE")]
    pub values: Vec<PathBuf>,
    /// Value passed to helm (last). Repeatable.
    #[arg(long = "set", value_name = "K=V")]
    pub set: Vec<String>,
    /// Koordinator feature gates (chart value featureGates).
    #[arg(long, value_name = "GATES")]
    pub feature_gates: Option<String>,
    /// CRDs the chart must not manage (crds.<plural>=false), e.g. for ones installed by ACK.
    /// Repeatable.
    #[arg(long, value_name = "PLURAL,...", value_delimiter = ',')]
    pub skip_crds: Vec<String>,
    /// Run koord-manager on the host network (EKS with a custom CNI).
    #[arg(long)]
    pub host_network: bool,
    /// Image pull secret for the workloads. Repeatable.
    #[arg(long, value_name = "NAME")]
    pub image_pull_secret: Vec<String>,
    /// Fail the pre-flight instead of working around conflicts (CRDs without Helm ownership),
    /// on custom resources that an upgrade of their CRD would refuse or prune (pruned fields
    /// are refused anyway, unless --allow-field-loss), and on images of the bundle the chart
    /// names outside a container's image field (not pinned).
    #[arg(long)]
    pub strict: bool,
    /// On upgrade, start from the new chart's defaults and this run's values only: the
    /// values the release was installed with (`helm get values`) are dropped. Without it they
    /// are kept and this run's values go over them (helm's --reset-then-reuse-values).
    #[arg(long, conflicts_with = "reuse_values")]
    pub reset_values: bool,
    /// On upgrade, helm's --reuse-values: the release's merged values as they are, the new
    /// chart's defaults unused for every key set before.
    #[arg(long)]
    pub reuse_values: bool,
    /// Install a chart older than the newest one the release ever deployed (a downgrade), or
    /// one whose direction cannot be told (a version that is not SemVer, a record that cannot
    /// be read). Without it such a load is refused before anything is pushed.
    #[arg(long)]
    pub allow_downgrade: bool,
    /// Replace the chart's CRDs even where custom resources in the cluster set fields the new
    /// definitions do not have (after a CRD downgrade, or a chart that drops a field): the API
    /// server drops those fields from the objects on their next write. Without it such a load
    /// is refused before anything is pushed, naming the objects and the fields.
    #[arg(long)]
    pub allow_field_loss: bool,
    /// Pre-flight checks to go on without when they cannot tell (a Warn instead of a Fail):
    /// server-version (a version that does not parse), node-arch (no nodes yet, nodes that
    /// report no platform, a bundle that lists none), platform (a kind node's kubelet
    /// configuration unreadable). A check that finds a problem still fails. Repeatable.
    #[arg(long, value_name = "CHECK,...", value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(crate::cluster::SKIPPABLE_CHECKS))]
    pub skip_check: Vec<String>,
    /// Leave the chart's CRDs to helm as the chart renders them: `helm uninstall` then
    /// deletes them and every object of theirs. By default load marks them
    /// `helm.sh/resource-policy: keep` (a post-renderer), so that an uninstall keeps them.
    #[arg(long)]
    pub no_keep_crds: bool,
    /// Install the images by tag, as the chart renders them. By default load pins every image
    /// the bundle carries to its digest (`REF@sha256:...`, a post-renderer), so what runs is
    /// what crossed: a tag pushed again in the registry changes nothing that runs.
    #[arg(long)]
    pub no_pin: bool,
    /// Keep the chart's imagePullPolicy for pinned images (by default IfNotPresent: a digest
    /// cannot change, and a registry outage then does not stop a container restart).
    #[arg(long, conflicts_with = "no_pin")]
    pub keep_pull_policy: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from([
            "koord-bundle",
            "build",
            "1.8.0",
            "--platform",
            "linux/amd64,linux/arm64",
            "--source",
            "ghcr",
            "--source",
            "aliyun",
        ])
        .unwrap();
        let Command::Build(b) = c.command else {
            panic!("expected build")
        };
        assert_eq!(b.platform, ["linux/amd64", "linux/arm64"]);
        assert_eq!(b.sources, ["ghcr", "aliyun"]);
        let c = Cli::try_parse_from(["koord-bundle", "build"]).unwrap();
        let Command::Build(b) = c.command else {
            panic!("expected build")
        };
        assert_eq!(b.version, "latest");
    }

    /// verify and load take the release and cluster flags from one struct; verify refuses them
    /// without --cluster (they would be ignored), and the release's default is not "given".
    #[test]
    fn kube_args_are_shared() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["koord-bundle"], args].concat());
        for flag in ["--release", "--namespace", "--kubeconfig", "--context"] {
            let e = parse(&["verify", "b.tar", flag, "x"]).expect_err(flag);
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::MissingRequiredArgument,
                "{flag}"
            );
            assert!(e.to_string().contains("--cluster"), "{flag}: {e}");
        }
        let Command::Verify(v) = parse(&["verify", "b.tar"]).unwrap().command else {
            panic!("expected verify")
        };
        assert_eq!(
            (v.kube.release.as_str(), v.kube.namespace),
            ("koordinator", None)
        );
        let Command::Verify(v) = parse(&["verify", "b.tar", "--cluster", "--namespace", "ns"])
            .unwrap()
            .command
        else {
            panic!("expected verify")
        };
        assert_eq!(v.kube.namespace.as_deref(), Some("ns"));
        let Command::Load(l) = parse(&["load", "--registry", "r", "--context", "c"])
            .unwrap()
            .command
        else {
            panic!("expected load")
        };
        assert_eq!(l.kube.context.as_deref(), Some("c"));
        assert_eq!(l.kube.release, "koordinator");
    }
}
