//! One test world for every scenario suite: the control plane client (or the reason to skip),
//! the CRDs, the system and team namespaces, the simulated GitHub (with or without a runner
//! package), the credential and webhook Secrets, a ready-made policy, simulated nodes with their
//! host roots and cgroup parents, and the command lines of the operator and the agent binaries.
//!
//! A suite says what its world needs through [`WorldBuilder`] and gets a [`World`]; the layers
//! that run processes over it ([`Product`](super::product::Product): operators and agents under
//! test; [`AgentWorld`](super::agent::AgentWorld): one agent with a broker-only operator) are
//! built by the same builder, so a world is set up in one place only.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use runner_manager_crds::names::ownership_label;
use runner_manager_crds::policy::ScalePolicy;
use runner_manager_operator::broker::tls;
use serde_json::{Value, json};

use super::cluster::{client_or_skip, fresh_namespace, install_crds};
use super::github::{APP_ID, ORG, PAT, SimulatedGitHub, app_keys};
use super::node::{SimNode, unique_node_name};
use super::process::binary;
use super::wait;
use crate::fake_github::PackageInfo;
use crate::standin_runner::package::{PackageSpec, build, cached};

/// The placeholder image every test operator makes placeholders of (imported on the real node).
pub const PLACEHOLDER_IMAGE: &str = "runner-manager.local/pause:1";

/// The name of the team's GitHub App Secret ([`WorldBuilder::app_secret`]).
pub const APP_SECRET: &str = "github-app";

/// The name of the operator's webhook HMAC Secret in the system namespace.
pub const WEBHOOK_SECRET_NAME: &str = "runner-manager-webhook";

/// What the simulated GitHub publishes as the runner release.
#[derive(Clone, Debug, Default)]
pub enum Package {
    /// No release: the world never downloads a runner.
    #[default]
    None,
    /// The stand-in runner package, built in the world's scratch directory and served.
    StandIn,
    /// The runner-sized stand-in package (≥ 9,000 files, ≥ 150 MB, incompressible; issue 15
    /// item 8), what the benchmarks launch: built once per content under
    /// `target/e2e-cache/packages/` and served from there.
    RunnerSized,
    /// A release described by hand (a version and digest the operator resolves; nothing is
    /// downloaded).
    Published(PackageInfo),
}

/// Where a Secret of the builder goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SecretHome {
    System,
    Team,
    /// The team's and every extra namespace.
    Tenants,
}

/// A Secret the builder creates.
#[derive(Clone, Debug)]
struct SecretSpec {
    home: SecretHome,
    name: String,
    data: Vec<(String, String)>,
}

/// A world to be set up; see [`World::builder`].
#[derive(Clone, Debug)]
pub struct WorldBuilder {
    pub(crate) test: String,
    system_prefix: String,
    team_prefix: String,
    extra_namespaces: Vec<String>,
    package: Package,
    secrets: Vec<SecretSpec>,
    app_secret: bool,
    web_policy: bool,
    policy_defaults: Value,
    github_tls: bool,
}

/// The defaults [`World::policy`] merges a spec over: repository `acme/web`, the App Secret,
/// labels `self-hosted, linux`, scenario timeouts, webhook scaling.
fn default_policy_spec() -> Value {
    json!({
        "github": {"url": "https://github.com/acme/web", "credentialsSecretRef": {"name": APP_SECRET}},
        "labels": ["self-hosted", "linux"],
        "maxRunners": 4,
        "runner": {"version": "latest"},
        "timeouts": {"registration": "60s", "idle": "10m"},
        "scaling": {"webhook": true, "pollInterval": "10s"}
    })
}

impl WorldBuilder {
    fn new(test: &str) -> Self {
        Self {
            test: test.to_owned(),
            system_prefix: "rm-sys".into(),
            team_prefix: "rm-team".into(),
            extra_namespaces: Vec::new(),
            package: Package::None,
            secrets: Vec::new(),
            app_secret: false,
            web_policy: false,
            policy_defaults: default_policy_spec(),
            github_tls: false,
        }
    }

    /// Serve the simulated GitHub over HTTPS with a certificate a private CA signed (a GitHub
    /// Enterprise Server with an internal CA); the operator and agent commands of the world are
    /// given that CA (`--github-ca-file`, `--download-ca-file`).
    pub fn github_tls(mut self) -> Self {
        self.github_tls = true;
        self
    }

    /// Prefixes of the system and team namespaces' (unique) names.
    pub fn namespaces(mut self, system: &str, team: &str) -> Self {
        self.system_prefix = system.to_owned();
        self.team_prefix = team.to_owned();
        self
    }

    /// More tenant namespaces (by prefix), in [`World::extra`] in order; the App Secret goes to
    /// each as to the team's.
    pub fn extra_namespaces(mut self, prefixes: &[String]) -> Self {
        self.extra_namespaces.extend(prefixes.iter().cloned());
        self
    }

    /// What the simulated GitHub publishes as the runner release.
    pub fn package(mut self, package: Package) -> Self {
        self.package = package;
        self
    }

    /// The stand-in package unless the builder already chose one (the product and agent worlds
    /// need a package; a bench asks for [`Package::RunnerSized`]).
    pub(crate) fn package_or_stand_in(self) -> Self {
        if matches!(self.package, Package::None) {
            self.package(Package::StandIn)
        } else {
            self
        }
    }

    /// The GitHub App Secret [`APP_SECRET`] (`appId`, `privateKey`; no installation id, so it is
    /// looked up) in the team's and every extra namespace.
    pub fn app_secret(mut self) -> Self {
        self.app_secret = true;
        self
    }

    /// A Secret `name` holding the simulated GitHub's personal access token, in the team's
    /// namespace.
    pub fn pat_secret(self, name: &str) -> Self {
        self.secret_in(SecretHome::Team, name, &[("token", PAT)])
    }

    /// A Secret `name` with `data`, in the team's namespace.
    pub fn team_secret(self, name: &str, data: &[(&str, &str)]) -> Self {
        self.secret_in(SecretHome::Team, name, data)
    }

    /// The webhook HMAC Secret [`WEBHOOK_SECRET_NAME`] holding `secret`, in the system namespace.
    pub fn webhook_secret(self, secret: &str) -> Self {
        self.secret_in(
            SecretHome::System,
            WEBHOOK_SECRET_NAME,
            &[("secret", secret)],
        )
    }

    fn secret_in(mut self, home: SecretHome, name: &str, data: &[(&str, &str)]) -> Self {
        self.secrets.push(SecretSpec {
            home,
            name: name.to_owned(),
            data: data
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        });
        self
    }

    /// The team's policy `web` for `acme/web` with the App Secret (its uid in
    /// [`World::policy_uid`]): the policy a broker resolves credentials through.
    pub fn web_policy(mut self) -> Self {
        self.web_policy = true;
        self
    }

    /// The spec [`World::policy`] merges every policy's spec over (instead of the defaults).
    pub fn policy_defaults(mut self, spec: Value) -> Self {
        self.policy_defaults = spec;
        self
    }

    /// Set the world up; `None` (with the reason printed) without `KUBECONFIG`.
    pub async fn build(mut self) -> Result<Option<World>, String> {
        if self.app_secret {
            let key = app_keys().map_err(|e| fail("keys", e))?.0.clone();
            self = self.secret_in(
                SecretHome::Tenants,
                APP_SECRET,
                &[("appId", &APP_ID.to_string()), ("privateKey", &key)],
            );
        }
        let Some(kube) = client_or_skip(&self.test)
            .await
            .map_err(|e| fail("client", e))?
        else {
            return Ok(None);
        };
        install_crds(&kube).await.map_err(|e| fail("crds", e))?;
        let system = fresh_namespace(&kube, &self.system_prefix)
            .await
            .map_err(|e| fail("ns", e))?;
        let team = fresh_namespace(&kube, &self.team_prefix)
            .await
            .map_err(|e| fail("ns", e))?;
        let mut extra = Vec::new();
        for prefix in &self.extra_namespaces {
            extra.push(
                fresh_namespace(&kube, prefix)
                    .await
                    .map_err(|e| fail("ns", e))?,
            );
        }
        // Runner accounts reach their runtimes below here: the scratch root is traversable.
        let scratch = tempfile::tempdir().map_err(|e| fail("tempdir", e))?;
        std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| fail("chmod", e))?;
        let package = match self.package {
            Package::None => None,
            Package::Published(info) => Some(info),
            Package::StandIn => {
                let listener = binary("standin-runner-listener").map_err(|e| fail("binary", e))?;
                let dir = scratch.path().join("package");
                std::fs::create_dir_all(&dir).map_err(|e| fail("package dir", e))?;
                Some(build(&PackageSpec::small(listener), &dir).map_err(|e| fail("package", e))?)
            }
            Package::RunnerSized => {
                let listener = binary("standin-runner-listener").map_err(|e| fail("binary", e))?;
                let root = target_dir().join("e2e-cache").join("packages");
                let spec = PackageSpec::runner_sized(listener);
                let started = std::time::Instant::now();
                let info = tokio::task::spawn_blocking(move || cached(&spec, &root))
                    .await
                    .map_err(|e| fail("package", e))?
                    .map_err(|e| fail("package", e))?;
                eprintln!(
                    "runner-sized package {} ({} MB) ready in {:.1} s",
                    info.path.display(),
                    info.size / (1024 * 1024),
                    started.elapsed().as_secs_f64()
                );
                Some(info)
            }
        };
        let fake = if self.github_tls {
            SimulatedGitHub::start_tls_with_package(package.clone()).await
        } else {
            SimulatedGitHub::start_with_package(package.clone()).await
        }
        .map_err(|e| fail("fake github", e))?;
        let github_ca_file = match &fake.ca_pem {
            None => None,
            Some(pem) => {
                let path = scratch.path().join("github-ca.pem");
                std::fs::write(&path, pem).map_err(|e| fail("github CA file", e))?;
                Some(path)
            }
        };
        for SecretSpec { home, name, data } in &self.secrets {
            let data: Vec<(&str, &str)> =
                data.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let homes: Vec<&String> = match home {
                SecretHome::System => vec![&system],
                SecretHome::Team => vec![&team],
                SecretHome::Tenants => std::iter::once(&team).chain(&extra).collect(),
            };
            for ns in homes {
                create_secret(&kube, ns, name, &data).await?;
            }
        }
        let logs = logs_dir(&self.test);
        let _ = std::fs::remove_dir_all(&logs);
        eprintln!(
            "{}: team namespace {team}, system namespace {system}, logs in {}",
            self.test,
            logs.display()
        );
        let mut world = World {
            test: self.test,
            kube,
            system,
            team,
            extra,
            fake,
            package,
            policy_uid: String::new(),
            policy_defaults: self.policy_defaults,
            logs,
            github_ca_file,
            scratch,
        };
        if self.web_policy {
            world.policy_uid = world.web_policy().await?;
        }
        Ok(Some(world))
    }
}

/// A test's world: see the module documentation.
pub struct World {
    pub test: String,
    pub kube: Client,
    pub system: String,
    pub team: String,
    /// The namespaces of [`WorldBuilder::extra_namespaces`], in order.
    pub extra: Vec<String>,
    pub fake: SimulatedGitHub,
    /// The release the simulated GitHub publishes, if any.
    pub package: Option<PackageInfo>,
    /// The uid of the team's policy `web` ([`WorldBuilder::web_policy`]), or empty.
    pub policy_uid: String,
    policy_defaults: Value,
    logs: PathBuf,
    /// The simulated GitHub's CA (PEM file), when it serves HTTPS ([`WorldBuilder::github_tls`]).
    pub github_ca_file: Option<PathBuf>,
    scratch: tempfile::TempDir,
}

impl Drop for World {
    fn drop(&mut self) {
        // Before the scratch directory goes: an agent materializing by overlay (the default,
        // `--materialize auto`) is killed with its runtimes still mounted, and removing the
        // scratch directory would leave those mounts in the machine's mount table (CI runs on a
        // developer's host). Every agent of any world has its host root under the scratch
        // directory, so this one place covers them all; only the agent's own overlays are taken.
        // The worlds holding this one have stopped their agents and runners by now (their
        // `Drop` runs before their fields'); a mount a straggler still holds is detached.
        use runner_manager_node_agent::packages::overlay;
        let mounts = overlay::overlays_under(self.scratch.path()).unwrap_or_default();
        for m in mounts.iter().rev() {
            if let Err(e) = overlay::unmount(m) {
                eprintln!("could not unmount {}: {e}", m.display());
            }
        }
    }
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("test", &self.test)
            .field("team", &self.team)
            .finish_non_exhaustive()
    }
}

/// One simulated node with what an agent process on it needs: its own host root and cgroup
/// parent (a world's nodes share nothing on the host).
#[derive(Debug)]
pub struct NodeHost {
    pub node: SimNode,
    /// The agent's `--host-root` (0755, under the world's scratch directory).
    pub host: PathBuf,
    /// The agent's `--cgroup-parent`, unique to this node.
    pub cgroup_parent: String,
}

impl NodeHost {
    /// The cgroup v2 directory of this node's runners.
    pub fn cgroup_dir(&self) -> PathBuf {
        PathBuf::from("/sys/fs/cgroup/unified").join(&self.cgroup_parent)
    }
}

impl World {
    /// The fake's counters (`{"<endpoint>": {"<status>": n}}`), failing with a harness error.
    pub async fn fake_counters(&self) -> Result<serde_json::Value, String> {
        self.fake.counters().await.map_err(|e| fail("counters", e))
    }

    /// The runner package this world published (built with `package_or_stand_in`).
    pub fn published_package(&self) -> Result<PackageInfo, String> {
        self.package
            .clone()
            .ok_or_else(|| "the world publishes no package".to_owned())
    }

    /// A world for test `test` (its name also names the log directory).
    pub fn builder(test: &str) -> WorldBuilder {
        WorldBuilder::new(test)
    }

    /// The directory this world's process logs go to (`target/e2e-logs/<test>`).
    pub fn logs(&self) -> &Path {
        &self.logs
    }

    /// The world's private scratch directory (0755).
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    /// The cluster's ownership label for this world's system namespace (what the operator
    /// stamps on the registrations it makes).
    pub async fn ownership_label(&self) -> Result<String, String> {
        let kube_system = Api::<Namespace>::all(self.kube.clone())
            .get("kube-system")
            .await
            .map_err(|e| fail("kube-system", e))?;
        let uid = kube_system
            .metadata
            .uid
            .ok_or_else(|| "kube-system has no uid".to_owned())?;
        Ok(ownership_label(&uid, &self.system))
    }

    /// The broker CA the operator publishes in its ConfigMap, once it has (as agents wait).
    pub async fn broker_ca(&self, within: Duration) -> Result<String, String> {
        let api = Api::<ConfigMap>::namespaced(self.kube.clone(), &self.system);
        wait::until(within, "the broker CA to be published", || {
            let api = api.clone();
            async move {
                api.get_opt(tls::CA_CONFIGMAP)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|cm| cm.data?.get("ca.crt").cloned())
            }
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// A new simulated node `<prefix>-<8 hex>` with `labels` (Node, agent Pod, bound broker
    /// token), its host root and a fresh cgroup parent.
    pub async fn add_node(
        &self,
        prefix: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<NodeHost, String> {
        let name = unique_node_name(prefix);
        let dir = self.scratch.path().join(&name);
        let node = SimNode::create(&self.kube, &self.system, &name, labels, &dir)
            .await
            .map_err(|e| fail("node", e))?;
        let host = dir.join("host");
        std::fs::create_dir_all(&host).map_err(|e| fail("host root", e))?;
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| fail("chmod", e))?;
        Ok(NodeHost {
            node,
            host,
            cgroup_parent: format!(
                "runner-manager-e2e-{}.slice",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
        })
    }

    /// The operator binary's command line for this world: its system namespace, the team's and
    /// the extra namespaces watched (the test cluster is shared: a world's operators reconcile
    /// only its own), every address on a port of the system's choosing, the simulated GitHub,
    /// JSON logs — then `flags` (`--flag`, `value`), each replacing a flag of the same name
    /// given before it. Flag values may name the namespaces: `{team}` and `{extraN}`.
    pub fn operator_command(
        &self,
        flags: &[(&str, &str)],
    ) -> Result<std::process::Command, String> {
        let watched = std::iter::once(&self.team)
            .chain(&self.extra)
            .cloned()
            .collect::<Vec<_>>()
            .join(",");
        let base = [
            ("--namespace", self.system.as_str()),
            ("--broker-addr", "127.0.0.1:0"),
            ("--admission-addr", "127.0.0.1:0"),
            ("--webhook-addr", "127.0.0.1:0"),
            ("--metrics-addr", "127.0.0.1:0"),
            ("--github-api-url", self.fake.base_url()),
            ("--watch-namespace", &watched),
            ("--log-format", "json"),
            // The broker makes placeholders of this image when an agent orders them
            // (`RM_PLACEHOLDERS` on the agent); the node-less test cluster never runs them.
            ("--placeholder-image", PLACEHOLDER_IMAGE),
        ];
        let ca = self
            .github_ca_file
            .as_ref()
            .map(|p| p.display().to_string());
        let tls: Vec<(&str, &str)> = ca
            .as_deref()
            .map(|ca| ("--github-ca-file", ca))
            .into_iter()
            .collect();
        let mut args: Vec<(String, String)> = Vec::new();
        for (k, v) in base.iter().chain(&tls).chain(flags) {
            let mut v = v.replace("{team}", &self.team);
            for (i, ns) in self.extra.iter().enumerate() {
                v = v.replace(&format!("{{extra{i}}}"), ns);
            }
            // clap refuses a flag given twice: a later one replaces the earlier.
            match args.iter_mut().find(|(f, _)| f == k) {
                Some(slot) => slot.1 = v,
                None => args.push(((*k).to_owned(), v)),
            }
        }
        let mut cmd = std::process::Command::new(
            binary("runner-manager-operator").map_err(|e| fail("binary", e))?,
        );
        for (k, v) in args {
            cmd.args([k, v]);
        }
        Ok(cmd)
    }

    /// The node agent's command line for `node` in this world, run by `program` (the agent
    /// binary itself, or a wrapper such as `prlimit` given the binary as its last argument):
    /// its node, host root and slots root, `capacity`, the direct launcher in the node's cgroup
    /// parent, the broker at `broker_url` with the node's bound token — then `flags`.
    pub fn agent_command(
        &self,
        mut program: std::process::Command,
        node: &NodeHost,
        capacity: u32,
        broker_url: &str,
        flags: &[(&str, &str)],
    ) -> std::process::Command {
        program.args([
            "--node-name",
            &node.node.name,
            "--host-root",
            &node.host.display().to_string(),
            "--slots-root",
            &node.host.join("slots").display().to_string(),
            "--capacity",
            &capacity.to_string(),
            "--launcher",
            "direct",
            "--cgroup-parent",
            &node.cgroup_parent,
            "--broker-url",
            broker_url,
            "--system-namespace",
            &self.system,
            "--broker-token-file",
            &node.node.token_file.display().to_string(),
        ]);
        if let Some(ca) = &self.github_ca_file {
            program.arg("--download-ca-file").arg(ca);
        }
        for (k, v) in flags {
            program.args([k, v]);
        }
        program
    }

    /// The agent binary.
    pub fn agent_binary() -> Result<std::process::Command, String> {
        Ok(std::process::Command::new(
            binary("runner-manager-node-agent").map_err(|e| fail("binary", e))?,
        ))
    }

    /// Create a ScalePolicy `name` in the team namespace with `spec` merged over the world's
    /// policy defaults ([`WorldBuilder::policy_defaults`]).
    pub async fn policy(&self, name: &str, spec: Value) -> Result<ScalePolicy, String> {
        self.policy_in(&self.team, name, spec).await
    }

    /// Like [`policy`](Self::policy), in namespace `namespace` (the team's or an extra one).
    pub async fn policy_in(
        &self,
        namespace: &str,
        name: &str,
        spec: Value,
    ) -> Result<ScalePolicy, String> {
        let mut base = self.policy_defaults.clone();
        merge(&mut base, spec);
        create_policy(&self.kube, namespace, name, base).await
    }

    /// The team's policy `web`: `acme/web` with the App Secret, labels `self-hosted, linux`, up
    /// to 4 runners; its uid.
    async fn web_policy(&self) -> Result<String, String> {
        let spec = json!({
            "github": {"url": format!("https://github.com/{ORG}/web"), "credentialsSecretRef": {"name": APP_SECRET}},
            "labels": ["self-hosted", "linux"], "maxRunners": 4
        });
        create_policy(&self.kube, &self.team, "web", spec)
            .await?
            .metadata
            .uid
            .ok_or_else(|| "the policy has no uid".to_owned())
    }

    /// A Secret `name` with `data` in namespace `ns`.
    pub async fn secret(&self, ns: &str, name: &str, data: &[(&str, &str)]) -> Result<(), String> {
        create_secret(&self.kube, ns, name, data).await
    }

    pub fn attempts(&self) -> Api<runner_manager_crds::attempt::RunnerAttempt> {
        Api::namespaced(self.kube.clone(), &self.team)
    }

    pub fn policies(&self) -> Api<ScalePolicy> {
        Api::namespaced(self.kube.clone(), &self.team)
    }

    /// The team namespace's pods (runner pods and placeholders stand there).
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.kube.clone(), &self.team)
    }

    /// The resource requests of `pod`'s first container (the runner's, or the placeholder's).
    pub fn container_requests(
        pod: &Pod,
    ) -> BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
        pod.spec
            .as_ref()
            .and_then(|s| s.containers.first()?.resources.as_ref()?.requests.clone())
            .unwrap_or_else(|| panic!("{:?} requests nothing", pod.metadata.name))
    }

    /// The first Event of `reason` on the team's object `name`, waited for up to `deadline`.
    pub async fn event_on(
        &self,
        name: &str,
        reason: &str,
        deadline: Duration,
    ) -> Result<k8s_openapi::api::events::v1::Event, String> {
        let events =
            Api::<k8s_openapi::api::events::v1::Event>::namespaced(self.kube.clone(), &self.team);
        wait::until(deadline, &format!("a {reason} event on {name}"), || async {
            events
                .list(&kube::api::ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                })
        })
        .await
        .map_err(|e| e.to_string())
    }
}

async fn create_policy(
    kube: &Client,
    namespace: &str,
    name: &str,
    spec: Value,
) -> Result<ScalePolicy, String> {
    let policy: ScalePolicy = serde_json::from_value(json!({
        "apiVersion": "runner-manager.dev/v1alpha1", "kind": "ScalePolicy",
        "metadata": {"name": name}, "spec": spec
    }))
    .map_err(|e| fail("policy", e))?;
    Api::<ScalePolicy>::namespaced(kube.clone(), namespace)
        .create(&PostParams::default(), &policy)
        .await
        .map_err(|e| fail("create policy", e))
}

/// What a layer over a [`World`] (a struct with a `world: World` field) offers: the world's
/// fields and helpers through `Deref`, and a `Debug` that names the world.
macro_rules! over_world {
    ($layer:ident) => {
        impl std::ops::Deref for $layer {
            type Target = $crate::harness::world::World;
            fn deref(&self) -> &$crate::harness::world::World {
                &self.world
            }
        }

        impl std::fmt::Debug for $layer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($layer))
                    .field("world", &self.world)
                    .finish_non_exhaustive()
            }
        }
    };
}
pub(crate) use over_world;

pub(crate) fn fail(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// Kill every process in every cgroup under `dir` and remove the cgroups: what a world's
/// runners leave when a test ends (they outlive their agent by design).
pub fn kill_cgroup_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            let _ = std::fs::write(e.path().join("cgroup.kill"), "1");
            // The kill is asynchronous: give the kernel a bounded moment to empty the group.
            for _ in 0..100 {
                if std::fs::remove_dir(e.path()).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// `target/e2e-logs/<test>`.
/// The cargo target directory the test runs from (`target/<profile>/deps/<test>`).
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(std::env::temp_dir)
}

fn logs_dir(test: &str) -> PathBuf {
    target_dir().join("e2e-logs").join(test)
}

async fn create_secret(
    kube: &Client,
    ns: &str,
    name: &str,
    data: &[(&str, &str)],
) -> Result<(), String> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .map(|_| ())
        .map_err(|e| fail("secret", e))
}

/// JSON merge of `over` into `base` (objects merged key by key, everything else replaced).
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o,
    }
}
