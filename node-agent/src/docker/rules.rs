//! What a job may ask of its Docker engine, decided per request without I/O: the proxy
//! ([`super::proxy`]) classifies each request, refuses what is not served or not allowed with a
//! message the job's `docker` prints, and labels what creates a resource with the attempt.
//!
//! The boundary with the host is not here. The engine runs as the runner's own account, in a unit
//! with the runner's sandbox ([`super::engine`]), so a container can reach no more of the host
//! than the job itself can, whatever it is asked. These rules refuse what would only look like
//! more (a privileged container, a host namespace, a device, a bind mount of a host path) so that
//! a job learns at once that it cannot have it, and keep the engine's API to the Docker endpoints
//! jobs use: an allow-list, so an endpoint added by a later engine is refused until it is read.

use std::path::{Component, Path};

use serde_json::{Map, Value};

/// The label every container, volume, network and image build made through the proxy carries.
pub const ATTEMPT_LABEL: &str = "runner-manager.attempt";

/// The most a checked request body may hold (a container's create is a few KiB).
pub const MAX_CHECKED_BODY: usize = 1 << 20;

/// What the proxy does with a request it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// Forwarded as it is (reads, and operations on what the engine already holds).
    Pass,
    /// `POST /containers/create`: the body checked, the label added.
    ContainerCreate,
    /// `POST /containers/{id}/exec`: the body checked.
    ExecCreate,
    /// `POST /volumes/create`: the body checked, the label added.
    VolumeCreate,
    /// `POST /networks/create`: the body checked, the label added.
    NetworkCreate,
    /// `POST /build`: the query checked, the label added to its `labels`.
    Build,
    /// `POST /containers/{id}/wait`: `condition=removed` asked as `next-exit` ([`wait_query`]).
    Wait,
}

impl Endpoint {
    /// Whether the proxy reads the whole body before forwarding.
    pub fn checks_body(self) -> bool {
        matches!(
            self,
            Self::ContainerCreate | Self::ExecCreate | Self::VolumeCreate | Self::NetworkCreate
        )
    }
}

/// Why a request is refused. Closed: reaches the job's output, the agent's log and a metric.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0} is not served on a runner's Docker socket")]
    NotServed(String),
    #[error("privileged containers are refused on this runner")]
    Privileged,
    #[error("the host's {0} namespace is refused on this runner")]
    HostNamespace(&'static str),
    #[error("devices are refused on this runner")]
    Devices,
    #[error("added capabilities are refused on this runner")]
    Capabilities,
    #[error("security option {0:?} is refused on this runner")]
    SecurityOption(String),
    #[error("the OCI runtime {0:?} is refused on this runner")]
    Runtime(String),
    #[error(
        "bind mount of {0:?} is refused: only paths inside the runner's directory ({1}) may be mounted"
    )]
    BindOutside(String, String),
    #[error("network driver {0:?} is refused on this runner (bridge only)")]
    NetworkDriver(String),
    #[error("the request body is not a JSON object of at most 1 MiB")]
    Body,
}

impl Refusal {
    /// The closed kind for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotServed(_) => "not-served",
            Self::Privileged => "privileged",
            Self::HostNamespace(_) => "host-namespace",
            Self::Devices => "devices",
            Self::Capabilities => "capabilities",
            Self::SecurityOption(_) => "security-option",
            Self::Runtime(_) => "runtime",
            Self::BindOutside(..) => "bind-outside",
            Self::NetworkDriver(_) => "network-driver",
            Self::Body => "body",
        }
    }

    /// The Docker API's error body: the `docker` client prints `message` after "Error response
    /// from daemon:".
    pub fn response_body(&self) -> String {
        serde_json::json!({
            "message": format!(
                "runner-manager: {self} (see \"Docker for jobs\" in docs/operations.md)"
            )
        })
        .to_string()
    }
}

/// The path without the optional API version prefix (`/v1.41/containers/create` →
/// `/containers/create`).
fn unversioned(path: &str) -> &str {
    if let Some(rest) = path.strip_prefix("/v")
        && let Some(slash) = rest.find('/')
        && rest[..slash]
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.')
        && slash > 0
    {
        return &rest[slash..];
    }
    path
}

/// Classifies a request by method and path: the endpoints `docker`, `docker compose` and the
/// runner's container jobs and `services:` use. Anything else (the libpod API, swarm, plugins,
/// secrets, a BuildKit session) is refused.
pub fn classify(method: &str, path: &str) -> Result<Endpoint, Refusal> {
    let segments: Vec<&str> = unversioned(path)
        .trim_start_matches('/')
        .split('/')
        .collect();
    let not_served = || Refusal::NotServed(format!("{method} {}", unversioned(path)));
    let get = method == "GET" || method == "HEAD";
    let post = method == "POST";
    let delete = method == "DELETE";
    let endpoint = match segments.as_slice() {
        ["_ping"] if get => Endpoint::Pass,
        ["version" | "info" | "events"] if get => Endpoint::Pass,
        ["system", "df"] if get => Endpoint::Pass,
        ["auth"] if post => Endpoint::Pass,
        ["commit"] if post => Endpoint::Pass,
        ["build"] if post => Endpoint::Build,
        ["build", "prune"] if post => Endpoint::Pass,
        ["containers", "json"] if get => Endpoint::Pass,
        ["containers", "create"] if post => Endpoint::ContainerCreate,
        ["containers", "prune"] if post => Endpoint::Pass,
        ["containers", _, "exec"] if post => Endpoint::ExecCreate,
        ["containers", _] if delete => Endpoint::Pass,
        [
            "containers",
            _,
            "json" | "logs" | "top" | "stats" | "changes" | "export",
        ] if get => Endpoint::Pass,
        ["containers", _, "archive"] if get || method == "PUT" => Endpoint::Pass,
        [
            "containers",
            _,
            "start" | "stop" | "restart" | "kill" | "attach" | "resize" | "pause" | "unpause"
            | "rename",
        ] if post => Endpoint::Pass,
        ["containers", _, "wait"] if post => Endpoint::Wait,
        ["exec", _, "start" | "resize"] if post => Endpoint::Pass,
        ["exec", _, "json"] if get => Endpoint::Pass,
        ["images", "json" | "search"] if get => Endpoint::Pass,
        ["images", "create" | "load" | "prune"] if post => Endpoint::Pass,
        ["images", "get"] if get => Endpoint::Pass,
        // Image names hold slashes: `/images/{name}/json`, `/images/{name}` (DELETE).
        ["images", .., "json" | "history" | "get"] if get => Endpoint::Pass,
        ["images", .., "push" | "tag"] if post => Endpoint::Pass,
        ["images", _, ..] if delete => Endpoint::Pass,
        ["volumes"] if get => Endpoint::Pass,
        ["volumes", "create"] if post => Endpoint::VolumeCreate,
        ["volumes", "prune"] if post => Endpoint::Pass,
        ["volumes", _] if get || delete => Endpoint::Pass,
        ["networks"] if get => Endpoint::Pass,
        ["networks", "create"] if post => Endpoint::NetworkCreate,
        ["networks", "prune"] if post => Endpoint::Pass,
        ["networks", _] if get || delete => Endpoint::Pass,
        ["networks", _, "connect" | "disconnect"] if post => Endpoint::Pass,
        _ => return Err(not_served()),
    };
    Ok(endpoint)
}

/// A wait's query as the engine is asked it: `condition=removed` becomes `next-exit`. The
/// Docker CLI waits for `removed` on `docker run --rm`, and Podman 4.3 answers that wait with
/// status 0 whatever the container's exit (measured: `sh -c 'exit 3'` gave 0, so a failing
/// `docker run --rm` step would pass). The container is removed all the same (its
/// `AutoRemove`); the job's `docker` learns its exit code when it exits, not when it is gone.
pub fn wait_query(query: &str) -> String {
    let pairs: Vec<(String, String)> = form_pairs(query)
        .into_iter()
        .map(|(k, v)| {
            if k == "condition" && v == "removed" {
                (k, "next-exit".to_owned())
            } else {
                (k, v)
            }
        })
        .collect();
    encode_form(&pairs)
}

/// Where bind mounts may come from: the runner's own directories (its runtime, which holds the
/// job's workspace, and its dependency cache).
#[derive(Clone, Debug)]
pub struct Rules {
    pub attempt: String,
    pub bind_roots: Vec<std::path::PathBuf>,
}

impl Rules {
    /// Checks a create body and adds the attempt's label. Returns the body to forward.
    pub fn check_body(&self, endpoint: Endpoint, body: &[u8]) -> Result<Vec<u8>, Refusal> {
        if body.len() > MAX_CHECKED_BODY {
            return Err(Refusal::Body);
        }
        let mut value: Value = serde_json::from_slice(body).map_err(|_| Refusal::Body)?;
        let object = value.as_object_mut().ok_or(Refusal::Body)?;
        match endpoint {
            Endpoint::ContainerCreate => {
                if let Some(host) = object.get("HostConfig") {
                    self.check_host_config(host)?;
                }
                self.label(object);
            }
            Endpoint::ExecCreate => {
                if object.get("Privileged").and_then(Value::as_bool) == Some(true) {
                    return Err(Refusal::Privileged);
                }
            }
            Endpoint::VolumeCreate => {
                if let Some(options) = object.get("DriverOpts") {
                    self.check_volume_options(options)?;
                }
                self.label(object);
            }
            Endpoint::NetworkCreate => {
                let driver = object.get("Driver").and_then(Value::as_str).unwrap_or("");
                if !matches!(driver, "" | "bridge") {
                    return Err(Refusal::NetworkDriver(driver.to_owned()));
                }
                self.label(object);
            }
            Endpoint::Pass | Endpoint::Build | Endpoint::Wait => {}
        }
        serde_json::to_vec(&value).map_err(|_| Refusal::Body)
    }

    /// Checks `/build`'s query and returns it with the attempt's label in `labels`.
    pub fn check_build_query(&self, query: &str) -> Result<String, Refusal> {
        let mut pairs: Vec<(String, String)> = form_pairs(query);
        for (k, v) in &pairs {
            match k.as_str() {
                "networkmode" if v == "host" => return Err(Refusal::HostNamespace("network")),
                // `RUN --security=insecure` and friends.
                "securityopt" if v.contains("unconfined") || v.contains("insecure") => {
                    return Err(Refusal::SecurityOption(v.clone()));
                }
                _ => {}
            }
        }
        let mut labels: Map<String, Value> = pairs
            .iter()
            .find(|(k, _)| k == "labels")
            .and_then(|(_, v)| serde_json::from_str(v).ok())
            .unwrap_or_default();
        labels.insert(ATTEMPT_LABEL.to_owned(), Value::from(self.attempt.clone()));
        pairs.retain(|(k, _)| k != "labels");
        pairs.push(("labels".to_owned(), Value::Object(labels).to_string()));
        Ok(encode_form(&pairs))
    }

    fn label(&self, object: &mut Map<String, Value>) {
        let labels = object
            .entry("Labels")
            .or_insert_with(|| Value::Object(Map::new()));
        if !labels.is_object() {
            *labels = Value::Object(Map::new());
        }
        if let Some(map) = labels.as_object_mut() {
            map.insert(ATTEMPT_LABEL.to_owned(), Value::from(self.attempt.clone()));
        }
    }

    fn check_host_config(&self, host: &Value) -> Result<(), Refusal> {
        let field = |name: &str| host.get(name).filter(|v| !v.is_null());
        if field("Privileged").and_then(Value::as_bool) == Some(true) {
            return Err(Refusal::Privileged);
        }
        for (name, namespace) in [
            ("NetworkMode", "network"),
            ("PidMode", "pid"),
            ("IpcMode", "ipc"),
            ("UTSMode", "uts"),
            ("UsernsMode", "user"),
            ("CgroupnsMode", "cgroup"),
        ] {
            if field(name).and_then(Value::as_str) == Some("host") {
                return Err(Refusal::HostNamespace(namespace));
            }
        }
        for name in ["Devices", "DeviceRequests", "DeviceCgroupRules"] {
            if field(name)
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
            {
                return Err(Refusal::Devices);
            }
        }
        if field("CapAdd")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            return Err(Refusal::Capabilities);
        }
        for option in field("SecurityOpt")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            let o = option.to_ascii_lowercase();
            if o.contains("unconfined") || o.contains("disable") {
                return Err(Refusal::SecurityOption(option.to_owned()));
            }
        }
        if let Some(runtime) = field("Runtime").and_then(Value::as_str)
            && !runtime.is_empty()
        {
            return Err(Refusal::Runtime(runtime.to_owned()));
        }
        for bind in field("Binds")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            // `source:target[:options]`; a source without a slash names a volume.
            let source = bind.split(':').next().unwrap_or("");
            if source.starts_with('/') {
                self.check_bind(source)?;
            }
        }
        for mount in field("Mounts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match mount.get("Type").and_then(Value::as_str) {
                Some("bind") => {
                    self.check_bind(mount.get("Source").and_then(Value::as_str).unwrap_or(""))?;
                }
                Some("volume") => {
                    if let Some(options) = mount.pointer("/VolumeOptions/DriverConfig/Options") {
                        self.check_volume_options(options)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A `local` volume with `type=none,o=bind,device=<path>` is a bind mount by another name.
    fn check_volume_options(&self, options: &Value) -> Result<(), Refusal> {
        match options.get("device").and_then(Value::as_str) {
            Some(device) if device.starts_with('/') => self.check_bind(device),
            Some(device) => Err(Refusal::BindOutside(device.to_owned(), self.roots())),
            None => Ok(()),
        }
    }

    /// Inside a bind root, by its components: `..` anywhere is refused rather than resolved.
    fn check_bind(&self, source: &str) -> Result<(), Refusal> {
        let path = Path::new(source);
        let plain = path.is_absolute()
            && path
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if plain && self.bind_roots.iter().any(|root| path.starts_with(root)) {
            Ok(())
        } else {
            Err(Refusal::BindOutside(source.to_owned(), self.roots()))
        }
    }

    fn roots(&self) -> String {
        self.bind_roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `application/x-www-form-urlencoded` pairs, decoded.
fn form_pairs(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn encode_form(pairs: &[(String, String)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_wait_for_removal_is_asked_as_a_wait_for_the_exit_whose_code_the_engine_keeps() {
        assert_eq!(
            classify("POST", "/v1.41/containers/abc/wait"),
            Ok(Endpoint::Wait)
        );
        assert_eq!(wait_query("condition=removed"), "condition=next-exit");
        assert_eq!(wait_query("condition=not-running"), "condition=not-running");
        assert_eq!(wait_query(""), "");
    }

    fn rules() -> Rules {
        Rules {
            attempt: "0f0e0d0c-0000-4000-8000-000000000001".to_owned(),
            bind_roots: vec!["/var/lib/runner-manager/runners/0123456789ab".into()],
        }
    }

    fn create(host: Value) -> Result<Value, Refusal> {
        let body = json!({"Image": "alpine", "HostConfig": host}).to_string();
        rules()
            .check_body(Endpoint::ContainerCreate, body.as_bytes())
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn the_endpoints_jobs_use_are_served_and_nothing_else() {
        for (method, path, endpoint) in [
            ("GET", "/_ping", Endpoint::Pass),
            ("HEAD", "/_ping", Endpoint::Pass),
            (
                "POST",
                "/v1.41/containers/create",
                Endpoint::ContainerCreate,
            ),
            ("POST", "/v1.41/containers/abc/exec", Endpoint::ExecCreate),
            ("POST", "/v1.41/containers/abc/attach", Endpoint::Pass),
            ("POST", "/v1.41/exec/abc/start", Endpoint::Pass),
            ("POST", "/v1.41/build", Endpoint::Build),
            ("POST", "/volumes/create", Endpoint::VolumeCreate),
            ("POST", "/networks/create", Endpoint::NetworkCreate),
            ("GET", "/v1.41/images/ghcr.io/o/i:1/json", Endpoint::Pass),
            ("DELETE", "/v1.41/images/ghcr.io/o/i:1", Endpoint::Pass),
            ("DELETE", "/containers/abc", Endpoint::Pass),
            ("PUT", "/containers/abc/archive", Endpoint::Pass),
        ] {
            assert_eq!(classify(method, path), Ok(endpoint), "{method} {path}");
        }
        for (method, path) in [
            ("POST", "/v4.3.1/libpod/containers/create"),
            ("GET", "/v1.41/libpod/info"),
            ("POST", "/v1.41/plugins/pull"),
            ("POST", "/v1.41/swarm/init"),
            ("POST", "/v1.41/session"),
            ("POST", "/v1.41/secrets/create"),
            ("DELETE", "/v1.41/containers/create/x"),
            ("GET", "/v1.41/containers/create"),
            ("POST", "/vx/containers/create"),
        ] {
            assert!(
                matches!(classify(method, path), Err(Refusal::NotServed(_))),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn a_container_that_would_look_past_the_sandbox_is_refused_with_what_to_do() {
        for (host, refusal) in [
            (json!({"Privileged": true}), "privileged"),
            (json!({"NetworkMode": "host"}), "host-namespace"),
            (json!({"PidMode": "host"}), "host-namespace"),
            (json!({"UsernsMode": "host"}), "host-namespace"),
            (json!({"Devices": [{"PathOnHost": "/dev/kvm"}]}), "devices"),
            (json!({"DeviceRequests": [{"Count": -1}]}), "devices"),
            (json!({"CapAdd": ["SYS_ADMIN"]}), "capabilities"),
            (
                json!({"SecurityOpt": ["seccomp=unconfined"]}),
                "security-option",
            ),
            (json!({"SecurityOpt": ["label=disable"]}), "security-option"),
            (json!({"Runtime": "runsc"}), "runtime"),
            (json!({"Binds": ["/:/host"]}), "bind-outside"),
            (json!({"Binds": ["/etc:/etc:ro"]}), "bind-outside"),
            (
                json!({"Binds": ["/var/lib/runner-manager/runners/0123456789ab/../../x:/x"]}),
                "bind-outside",
            ),
            (
                json!({"Binds": ["/var/lib/runner-manager/runners/0123456789abc:/x"]}),
                "bind-outside",
            ),
            (
                json!({"Mounts": [{"Type": "bind", "Source": "/var/run", "Target": "/r"}]}),
                "bind-outside",
            ),
            (
                json!({"Mounts": [{"Type": "volume", "Target": "/v", "VolumeOptions":
                    {"DriverConfig": {"Options": {"type": "none", "o": "bind", "device": "/root"}}}}]}),
                "bind-outside",
            ),
        ] {
            let refused = create(host.clone()).unwrap_err();
            assert_eq!(refused.kind(), refusal, "{host}");
            let message: Value = serde_json::from_str(&refused.response_body()).unwrap();
            assert!(
                message["message"]
                    .as_str()
                    .unwrap()
                    .contains("docs/operations.md"),
                "{message}"
            );
        }
        let bind = create(
            json!({"Binds": ["/var/lib/runner-manager/runners/0123456789ab/_work:/w", "cache:/c"],
            "NetworkMode": "github_network_1", "PidMode": "container:abc"}),
        )
        .unwrap();
        assert_eq!(
            bind["Labels"][ATTEMPT_LABEL],
            "0f0e0d0c-0000-4000-8000-000000000001"
        );
    }

    #[test]
    fn every_created_resource_carries_the_attempt_whatever_labels_it_had() {
        let r = rules();
        for (endpoint, body) in [
            (
                Endpoint::ContainerCreate,
                json!({"Image": "a", "Labels": {"x": "1"}}),
            ),
            (
                Endpoint::ContainerCreate,
                json!({"Image": "a", "Labels": null}),
            ),
            (Endpoint::VolumeCreate, json!({"Name": "v"})),
            (
                Endpoint::NetworkCreate,
                json!({"Name": "n", "Labels": {ATTEMPT_LABEL: "forged"}}),
            ),
        ] {
            let out: Value = serde_json::from_slice(
                &r.check_body(endpoint, body.to_string().as_bytes()).unwrap(),
            )
            .unwrap();
            assert_eq!(out["Labels"][ATTEMPT_LABEL], r.attempt.as_str(), "{body}");
        }
        assert_eq!(
            r.check_body(
                Endpoint::NetworkCreate,
                br#"{"Name":"n","Driver":"macvlan"}"#
            )
            .unwrap_err()
            .kind(),
            "network-driver"
        );
        assert_eq!(
            r.check_body(
                Endpoint::VolumeCreate,
                br#"{"DriverOpts":{"device":"/etc"}}"#
            )
            .unwrap_err()
            .kind(),
            "bind-outside"
        );
        assert_eq!(
            r.check_body(Endpoint::ExecCreate, br#"{"Privileged":true,"Cmd":["sh"]}"#)
                .unwrap_err(),
            Refusal::Privileged
        );
        assert_eq!(
            r.check_body(Endpoint::ContainerCreate, b"[1]").unwrap_err(),
            Refusal::Body
        );
    }

    #[test]
    fn a_build_is_labelled_and_cannot_ask_for_the_hosts_network() {
        let r = rules();
        let query = r
            .check_build_query("t=app%3A1&labels=%7B%22a%22%3A%22b%22%7D&rm=1")
            .unwrap();
        let pairs = form_pairs(&query);
        let labels: Value =
            serde_json::from_str(&pairs.iter().find(|(k, _)| k == "labels").unwrap().1).unwrap();
        assert_eq!(labels["a"], "b");
        assert_eq!(labels[ATTEMPT_LABEL], r.attempt.as_str());
        assert!(pairs.contains(&("t".to_owned(), "app:1".to_owned())));
        assert_eq!(
            r.check_build_query("networkmode=host").unwrap_err().kind(),
            "host-namespace"
        );
    }
}
