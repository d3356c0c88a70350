//! The agent's side of Docker for jobs (`spec.docker`, [`crate::docker`]): before the JIT is
//! asked for, the attempt's engine is started beside the runner and its socket served in the
//! runtime as the runner's `DOCKER_HOST`; once the runner is proven gone, the socket is closed,
//! what the job left is counted, the engine's unit is stopped (every container with it) and its
//! directory removed, before the attempt is `Cleaned`. A restarted agent serves the sockets of
//! its live runners again; the orphan sweep stops and removes engines no attempt claims.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use runner_manager_crds::attempt::RunnerAttempt;
use runner_manager_crds::names::short_hex;
use runner_manager_crds::policy::ExecutionMode;

use crate::account::RunnerAccount;
use crate::agent::node::Agent;
use crate::docker::engine::{DOCKER_DIR, EngineDirs, EngineSpec, JOB_SOCKET};
use crate::docker::proxy::{self, Proxy};
use crate::docker::rules::Rules;
use crate::providers::cgroup::CgroupLimits;

/// How long a job's request waits for an engine still starting.
const ENGINE_WAIT: Duration = Duration::from_secs(60);

/// Whether `a` gets an engine.
fn wants(a: &RunnerAttempt) -> bool {
    a.spec.snapshot.docker && a.spec.snapshot.execution.mode == ExecutionMode::Native
}

/// The job's `DOCKER_HOST` for a runtime.
pub fn docker_host(runtime: &Path) -> String {
    format!("unix://{}", runtime.join(JOB_SOCKET).display())
}

/// Starts `a`'s engine and serves its socket in `runtime`. Returns the `DOCKER_HOST` variable
/// for the runner's environment, `None` when the attempt asks for no Docker. An engine the
/// node cannot run is not a failed launch: the socket is served all the same and answers every
/// request with the reason, which is what the job's `docker` prints.
pub async fn attach(
    agent: &Agent,
    a: &RunnerAttempt,
    runtime: &Path,
    account: RunnerAccount,
    cache: Option<&Path>,
    limits: &CgroupLimits,
) -> Result<Option<(String, String)>, String> {
    if !wants(a) {
        return Ok(None);
    }
    let id = a
        .spec
        .attempt_uuid()
        .ok_or_else(|| "the attempt has no valid id".to_owned())?;
    let short = short_hex(id);
    let dirs = EngineDirs::new(&agent.host.root, &id);
    // A directory left by a launch that died before its JIT (this attempt's own) starts over.
    let prepared = {
        let dirs = dirs.clone();
        tokio::task::spawn_blocking(move || {
            crate::workspace::remove::remove_tree(&dirs.root)?;
            dirs.prepare(account)
        })
        .await
        .map_err(|e| format!("the engine's directory was not made: {e}"))?
    };
    let unavailable = match prepared {
        Err(e) => Some(format!("its directory could not be made ({:?})", e.kind())),
        Ok(()) => dirs.socket_too_long().or_else(|| {
            agent
                .providers
                .launcher()
                .start_engine(&EngineSpec {
                    attempt: id,
                    account,
                    dirs: &dirs,
                    runtime,
                    cache,
                    podman: agent.host.docker.podman(),
                    limits,
                })
                .err()
        }),
    };
    if let Some(why) = &unavailable {
        tracing::warn!(attempt = %short, "the runner's Docker engine was not started: {why}");
    }
    serve(
        agent,
        &short,
        runtime,
        account,
        proxy_for(id, &dirs, runtime, cache, unavailable),
    )
    .map_err(|e| {
        format!(
            "the runner's Docker socket could not be served ({:?})",
            e.kind()
        )
    })?;
    Ok(Some(("DOCKER_HOST".to_owned(), docker_host(runtime))))
}

/// The proxy of attempt `id`: its label, the runner's directories as the only bind sources, its
/// engine's socket.
fn proxy_for(
    id: uuid::Uuid,
    dirs: &EngineDirs,
    runtime: &Path,
    cache: Option<&Path>,
    unavailable: Option<String>,
) -> Proxy {
    Proxy {
        rules: Rules {
            attempt: id.to_string(),
            bind_roots: std::iter::once(runtime)
                .chain(cache)
                .map(Path::to_path_buf)
                .collect(),
        },
        engine: dirs.socket(),
        engine_wait: ENGINE_WAIT,
        unavailable,
    }
}

/// Binds `<runtime>/.docker.sock` (the runner's, 0600) and serves `proxy` on it.
fn serve(
    agent: &Agent,
    short: &str,
    runtime: &Path,
    account: RunnerAccount,
    proxy: Proxy,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = runtime.join(JOB_SOCKET);
    // Whatever is at the name (a socket of an earlier agent, or anything the account put there)
    // is removed, never followed: `bind` makes the name anew.
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = std::os::unix::net::UnixListener::bind(&path)?;
    std::os::unix::fs::lchown(&path, Some(account.uid), Some(account.gid))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let handle = proxy::spawn(listener, Arc::new(proxy));
    agent.host.docker.insert(short, handle);
    Ok(())
}

/// A restarted agent's live runner with Docker: its socket served again (the engine kept
/// running under systemd), for the account that owns the runtime. Cheap when it is served.
pub fn serve_again(agent: &Agent, a: &RunnerAttempt, runtime: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Some(id) = a.spec.attempt_uuid().filter(|_| wants(a)) else {
        return;
    };
    let short = short_hex(id);
    if agent.host.docker.is_served(&short) {
        return;
    }
    // The runtime's own entry (never a link's target): its owner is the runner's account.
    let Some(account) = std::fs::symlink_metadata(runtime)
        .ok()
        .filter(std::fs::Metadata::is_dir)
        .map(|m| RunnerAccount {
            uid: m.uid(),
            gid: m.gid(),
        })
    else {
        return;
    };
    let dirs = EngineDirs::new(&agent.host.root, &id);
    let cache = agent
        .host
        .caches
        .attached(&short)
        .then(|| agent.host.caches.mount_point(&short));
    let proxy = proxy_for(id, &dirs, runtime, cache.as_deref(), None);
    match serve(agent, &short, runtime, account, proxy) {
        Ok(()) => tracing::info!(attempt = %short, "the runner's Docker socket is served again"),
        Err(e) => tracing::warn!(
            attempt = %short,
            "the runner's Docker socket could not be served again ({:?})",
            e.kind()
        ),
    }
}

/// Ends `a`'s Docker, its runner gone: the socket closed, what the job left counted and logged,
/// the engine's unit stopped with every container, its directory removed. `Err`: the engine is
/// not proven stopped or its directory not removed, and the cleanup waits.
pub async fn release(agent: &Agent, a: &RunnerAttempt) -> Result<(), String> {
    let Some(id) = a.spec.attempt_uuid().filter(|_| wants(a)) else {
        return Ok(());
    };
    let short = short_hex(id);
    agent.host.docker.close(&short);
    let dirs = EngineDirs::new(&agent.host.root, &id);
    if let Some(left) = proxy::leftovers(&dirs.socket()).await
        && !left.is_empty()
    {
        tracing::info!(
            attempt = %short,
            "the job left {} container(s), {} volume(s), {} network(s) and {} image(s) in its Docker engine; they go with it",
            left.containers,
            left.volumes,
            left.networks,
            left.images
        );
    }
    remove_engine(agent, &short, &dirs).await
}

/// Stops the engine of `short` and removes its directory.
async fn remove_engine(agent: &Agent, short: &str, dirs: &EngineDirs) -> Result<(), String> {
    agent
        .providers
        .launcher()
        .stop_engine(short)
        .map_err(|e| format!("the Docker engine is not proven stopped: {e}"))?;
    let root = dirs.root.clone();
    tokio::task::spawn_blocking(move || crate::workspace::remove::remove_tree(&root))
        .await
        .map_err(|e| format!("the Docker engine's directory was not removed: {e}"))?
        .map(|_| ())
        .map_err(|e| {
            format!(
                "the Docker engine's directory was not removed ({:?})",
                e.kind()
            )
        })
}

/// The attempt names of engine directories on the host (`<hostRoot>/docker/<12hex>`).
pub fn engine_dir_names(host_root: &Path) -> std::io::Result<Vec<String>> {
    crate::providers::launcher::attempt_names_in(&host_root.join(DOCKER_DIR))
}

/// The orphan sweep's part: engines whose attempt is gone, stopped and removed (the socket of a
/// runner that outlived a restart is served again by supervision, not here). Returns the names
/// removed.
pub async fn sweep_orphans(agent: &Agent, unclaimed: &[String]) -> Vec<String> {
    let mut removed = Vec::new();
    for short in unclaimed {
        agent.host.docker.close(short);
        match remove_engine(agent, short, &EngineDirs::named(&agent.host.root, short)).await {
            Ok(()) => removed.push(short.clone()),
            Err(e) => tracing::warn!("orphan Docker engine {short} not removed: {e}"),
        }
    }
    removed
}
