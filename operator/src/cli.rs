//! The operator's command line. Every flag can also come from the environment (Deployment env).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use runner_manager_crds::duration::ManifestDuration;

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn duration(s: &str) -> Result<Duration, String> {
    ManifestDuration::parse(s)
        .map(ManifestDuration::as_duration)
        .map_err(|e| e.to_string())
}

/// runner-manager operator: reconciles ScalePolicies and RunnerAttempts, talks to GitHub, serves
/// the JIT broker and the webhook receiver.
#[derive(Debug, Parser)]
#[command(name = "runner-manager-operator", version)]
pub struct Cli {
    /// The operator's namespace (its Lease, broker certificate Secret and CA ConfigMap).
    #[arg(long, env = "POD_NAMESPACE", default_value = "runner-manager-system")]
    pub namespace: String,
    /// Where the JIT broker listens (HTTPS).
    #[arg(long, env = "RM_BROKER_ADDR", default_value = "0.0.0.0:8443")]
    pub broker_addr: SocketAddr,
    /// Where the admission webhook listens (HTTPS, the broker's certificate): a listener of its
    /// own, with its own bounds, so a flood of the broker port cannot starve the API server's
    /// admission calls, nor a flood of this one the agents' JIT requests.
    #[arg(long, env = "RM_ADMISSION_ADDR", default_value = "0.0.0.0:8444")]
    pub admission_addr: SocketAddr,
    /// Where the workflow_job webhook receiver listens.
    #[arg(long, env = "RM_WEBHOOK_ADDR", default_value = "0.0.0.0:8080")]
    pub webhook_addr: SocketAddr,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, env = "RM_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// The Secret (in --namespace) holding the webhook HMAC secret under key `secret`.
    #[arg(
        long,
        env = "RM_WEBHOOK_SECRET_NAME",
        default_value = "runner-manager-webhook"
    )]
    pub webhook_secret_name: String,
    /// Override the GitHub API base URL (tests, or a proxy). Normally derived from each policy's
    /// URL: api.github.com, or https://HOST/api/v3 for Enterprise Server.
    #[arg(long, env = "RM_GITHUB_API_URL")]
    pub github_api_url: Option<String>,
    /// An admin-run mirror of runner packages; tenants never name download URLs.
    #[arg(long, env = "RM_RUNNER_MIRROR_URL")]
    pub runner_mirror_url: Option<String>,
    /// Run under a Lease so only one replica reconciles.
    #[arg(long, env = "RM_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// How long a node's agent Lease may stay expired before its live attempts are Orphaned(NodeLost).
    #[arg(long, env = "RM_NODE_LOST_GRACE", default_value = "10m", value_parser = duration)]
    pub node_lost_grace: Duration,
    /// Cleaned attempts kept per policy before garbage collection.
    #[arg(long, env = "RM_ATTEMPT_HISTORY", default_value_t = 20)]
    pub attempt_history: u32,
    /// Consecutive failed launches before a policy is Degraded and stops replacing.
    #[arg(long, env = "RM_MAX_CONSECUTIVE_FAILURES", default_value_t = 5)]
    pub max_consecutive_failures: u32,
    /// Apply the CRDs at start (server-side apply), so an upgrade cannot leave old ones behind.
    #[arg(long, env = "RM_APPLY_CRDS", default_value_t = true, action = clap::ArgAction::Set)]
    pub apply_crds: bool,
    /// The node agents' service account (in --namespace): only its pods may ask the broker.
    #[arg(
        long,
        env = "RM_AGENT_SERVICE_ACCOUNT",
        default_value = "runner-manager-node-agent"
    )]
    pub agent_service_account: String,
    /// Labels every agent pod carries (the DaemonSet's selector), `k=v,k=v`.
    #[arg(long, env = "RM_AGENT_POD_SELECTOR", default_value = "app.kubernetes.io/component=node-agent", value_parser = selector)]
    pub agent_pod_selector: std::collections::BTreeMap<String, String>,
    /// The agent DaemonSet (in --namespace): the broker accepts only pods it controls, compared
    /// by uid, so a pod that merely copies the agents' labels and node is not an agent.
    #[arg(
        long,
        env = "RM_AGENT_DAEMONSET",
        default_value = "runner-manager-node-agent"
    )]
    pub agent_daemonset: String,
    /// The operator's own service account (in --namespace): the admission webhook lets only it
    /// (and `system:masters`) create RunnerAttempts or change their spec.
    #[arg(
        long,
        env = "RM_OPERATOR_SERVICE_ACCOUNT",
        default_value = "runner-manager-operator"
    )]
    pub operator_service_account: String,
    /// The ValidatingWebhookConfiguration (the chart's) whose `caBundle` the operator sets to the
    /// broker CA at start. The webhook is served on --admission-addr either way.
    #[arg(long, env = "RM_ADMISSION_WEBHOOK_CONFIGURATION")]
    pub admission_webhook_configuration: Option<String>,
    /// The broker Service's name (its certificate covers the Service's DNS names).
    #[arg(
        long,
        env = "RM_BROKER_SERVICE",
        default_value = "runner-manager-broker"
    )]
    pub broker_service: String,
    /// Run the policy and attempt controllers (under leader election). With false the process
    /// serves only the broker, the webhook receiver and metrics (tests of the node agent).
    #[arg(long, env = "RM_CONTROLLERS", default_value_t = true, action = clap::ArgAction::Set)]
    pub controllers: bool,
    /// Reconcile ScalePolicies and RunnerAttempts of this namespace only, or of these
    /// (comma-separated; a namespaced install, or tests sharing one cluster); all namespaces when
    /// unset.
    #[arg(long, env = "RM_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Bind GitHub owners (repository owners, organizations, enterprises) to the namespaces that
    /// may name them: `owner=ns1,ns2;owner2=ns3`. A policy in any other namespace naming a bound
    /// owner is not Ready (OwnerBoundElsewhere) and takes no job, whatever its credentials.
    /// Unbound owners may be named from any namespace. Chart value `ownerNamespaces`.
    #[arg(long, env = "RM_OWNER_NAMESPACES", default_value = "", value_parser = owner_bindings)]
    pub owner_namespaces: crate::policy::tenancy::OwnerBindings,
    /// This replica's identity in the leader Lease (the pod name in a cluster).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long a leader's Lease holds without renewal; a standby takes over after it.
    #[arg(long, env = "RM_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
    /// How often each policy's GitHub target is observed (one runner list per target per pass).
    #[arg(long, env = "RM_OBSERVE_INTERVAL", default_value = "30s", value_parser = duration)]
    pub observe_interval: Duration,
    /// The longest a reconcile pass waits for a change before running anyway.
    #[arg(long, env = "RM_RESYNC_INTERVAL", default_value = "10s", value_parser = duration)]
    pub resync_interval: Duration,
    /// An orphan registration must be seen orphaned on two passes at least this far apart.
    #[arg(long, env = "RM_ORPHAN_GRACE", default_value = "5m", value_parser = duration)]
    pub orphan_grace: Duration,
    /// A `Pending` attempt the agent has not admitted within this is expired and replaced.
    #[arg(long, env = "RM_ADMISSION_TIMEOUT", default_value = "60s", value_parser = duration)]
    pub admission_timeout: Duration,
    /// A pending job without assignment for this long is checked once with GET …/jobs/{id}.
    #[arg(long, env = "RM_JOB_CHECK_GRACE", default_value = "2m", value_parser = duration)]
    pub job_check_grace: Duration,
    /// First wait before a policy's failed launch is replaced; doubles per consecutive failure.
    #[arg(long, env = "RM_REPLACEMENT_BACKOFF", default_value = "5s", value_parser = duration)]
    pub replacement_backoff: Duration,
    /// Cap of the replacement backoff.
    #[arg(long, env = "RM_REPLACEMENT_BACKOFF_MAX", default_value = "5m", value_parser = duration)]
    pub replacement_backoff_max: Duration,
    /// The GitHub hosts a policy's `spec.github.url` may name (`host` or `host:port`,
    /// comma-separated). A policy naming another host is not Ready (HostNotAllowed): a tenant's
    /// host would choose both the runner package's URL and its sha256. Chart value
    /// `operator.githubHosts`.
    #[arg(long, env = "RM_GITHUB_HOSTS", default_value = "github.com", value_parser = host_list)]
    pub github_hosts: runner_manager_crds::hosts::HostList,
    /// Hosts, besides the policy's own GitHub host and the mirror's, that a runner package URL
    /// from GitHub's downloads listing may name (an Enterprise Server usually lists packages on
    /// another host). Chart value `operator.downloadHosts`.
    #[arg(long, env = "RM_DOWNLOAD_HOSTS", default_value = "", value_parser = host_list)]
    pub download_hosts: runner_manager_crds::hosts::HostList,
    /// Hosts that may be spoken to over plain http (the GitHub API base, package URLs); every
    /// other URL must be https. Empty in production. Chart value `operator.allowHttpHosts`.
    #[arg(long, env = "RM_ALLOW_HTTP_HOSTS", default_value = "", value_parser = host_list)]
    pub allow_http_hosts: runner_manager_crds::hosts::HostList,
    /// A PEM file of CA certificates trusted, beside the system's, for GitHub API calls: a
    /// GitHub Enterprise Server whose certificate a private CA signed. Chart value `caBundle`.
    #[arg(long, env = "RM_GITHUB_CA_FILE")]
    pub github_ca_file: Option<std::path::PathBuf>,
    /// The most bytes of one GitHub response body the operator reads; a longer one is refused
    /// while it streams.
    #[arg(long, env = "RM_GITHUB_MAX_RESPONSE_BYTES", default_value_t = 8 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..))]
    pub github_max_response_bytes: u64,
    /// The most runners any one node hosts, whatever its agent advertises (the operator places
    /// by the smaller of the two). Unset: the agents' adverts. Chart value
    /// `operator.maxRunnersPerNode`.
    #[arg(long, env = "RM_MAX_RUNNERS_PER_NODE", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_runners_per_node: Option<u32>,
    /// Lifetime of the broker's serving certificate (issued from the kept CA, at most 2160h =
    /// 90 days); it is re-issued at two thirds of it and swapped in without dropping a
    /// connection.
    #[arg(long, env = "RM_BROKER_CERT_LIFETIME", default_value = "720h", value_parser = cert_lifetime)]
    pub broker_cert_lifetime: Duration,
    /// The most bytes of a webhook delivery read before its signature is checked (GitHub's
    /// workflow_job deliveries are ~8-14 KiB; one with hundreds of steps is larger).
    #[arg(long, env = "RM_WEBHOOK_MAX_BODY_BYTES", default_value_t = 64 * 1024, value_parser = clap::value_parser!(u64).range(1024..=26_214_400))]
    pub webhook_max_body_bytes: u64,
    /// Both listeners (webhook, broker): how long a client may take to send a request's headers
    /// (and the TLS handshake), and to send its body.
    #[arg(long, env = "RM_LISTENER_HEADER_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub listener_header_timeout: Duration,
    /// Both listeners: a connection with no byte in either direction for this long is closed.
    #[arg(long, env = "RM_LISTENER_IDLE_TIMEOUT", default_value = "90s", value_parser = duration)]
    pub listener_idle_timeout: Duration,
    /// Both listeners: open connections each accepts at once; more wait in the kernel's backlog.
    #[arg(long, env = "RM_LISTENER_MAX_CONNECTIONS", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub listener_max_connections: u32,
    /// Every listener: connections one source address may hold at once (the rest of
    /// --listener-max-connections stays for everyone else).
    #[arg(long, env = "RM_LISTENER_MAX_CONNECTIONS_PER_PEER", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub listener_max_connections_per_peer: u32,
    /// Log format.
    #[arg(long, env = "RM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// The image of the placeholder pods the broker makes beside native runners for the agents
    /// (docs/placeholder-pods.md); empty: no placeholders (an agent's order is refused).
    #[arg(long, env = "RM_PLACEHOLDER_IMAGE", default_value = "")]
    pub placeholder_image: String,
    /// The placeholders' PriorityClass (the chart's); empty: none.
    #[arg(long, env = "RM_PLACEHOLDER_PRIORITY_CLASS", default_value = "")]
    pub placeholder_priority_class: String,
}

impl Cli {
    /// How the broker makes placeholder pods; `None` without `--placeholder-image`.
    pub fn placeholder_spec(&self) -> Option<runner_manager_crds::pods::PlaceholderSpec> {
        (!self.placeholder_image.is_empty()).then(|| runner_manager_crds::pods::PlaceholderSpec {
            image: self.placeholder_image.clone(),
            priority_class: (!self.placeholder_priority_class.is_empty())
                .then(|| self.placeholder_priority_class.clone()),
        })
    }
}

fn host_list(s: &str) -> Result<runner_manager_crds::hosts::HostList, String> {
    runner_manager_crds::hosts::HostList::parse(s).map_err(|e| e.to_string())
}

/// The most a broker certificate may live.
pub const MAX_CERT_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);

fn cert_lifetime(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d > MAX_CERT_LIFETIME {
        return Err("at most 2160h (90 days)".to_owned());
    }
    if d < Duration::from_secs(10) {
        return Err("at least 10s".to_owned());
    }
    Ok(d)
}

fn owner_bindings(s: &str) -> Result<crate::policy::tenancy::OwnerBindings, String> {
    crate::policy::tenancy::OwnerBindings::parse(s).map_err(|e| e.to_string())
}

fn selector(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("`{pair}` is not key=value"))
        })
        .collect()
}
