//! The node Lease (DESIGN §6 "Heartbeat"): `runner-manager-agent-<node>` in the system
//! namespace, created or taken over at start, renewed every heartbeat with a duration of three
//! heartbeats, its annotations the [`AgentAdvert`] the operator's placement reads. It is
//! liveness for the operator; the host `flock` is the fence.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use runner_manager_crds::lease::{AgentAdvert, Provider};
use runner_manager_crds::names::agent_lease_name;

use crate::agent::node::Agent;
use crate::workspace::slot_table::SlotKey;

const FIELD_MANAGER: &str = "runner-manager-node-agent";

fn renewed(agent: &Agent) {
    agent.metrics().lease_renewal(true);
    *agent
        .cluster
        .last_renewed
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
}

/// Renews the Lease until the process ends; an advert change renews at once.
pub async fn heartbeat(agent: Arc<Agent>) {
    let api = Api::<Lease>::namespaced(agent.cluster.kube.clone(), &agent.cluster.system_namespace);
    let name = agent_lease_name(&agent.cluster.node);
    let holder = format!("{}/{}", agent.cluster.node, std::process::id());
    let mut failing = false;
    loop {
        let advert = agent.advert();
        match renew(
            &api,
            &name,
            &holder,
            agent.cluster.heartbeat.as_secs(),
            &advert,
        )
        .await
        {
            Ok(()) if failing => {
                renewed(&agent);
                tracing::info!("lease renewed again");
                failing = false;
            }
            Ok(()) => renewed(&agent),
            Err(e) if !failing => {
                agent.metrics().lease_renewal(false);
                tracing::warn!("lease renewal failed: {e}");
                failing = true;
            }
            Err(_) => agent.metrics().lease_renewal(false),
        }
        tokio::select! {
            () = tokio::time::sleep(agent.cluster.heartbeat) => {}
            () = agent.cluster.advert_changed.notified() => {}
        }
    }
}

/// Server-side apply, forced: creates the Lease or takes it over from a previous agent.
async fn renew(
    api: &Api<Lease>,
    name: &str,
    holder: &str,
    heartbeat_secs: u64,
    advert: &AgentAdvert,
) -> Result<(), kube::Error> {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            annotations: Some(advert.to_annotations()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(
                i32::try_from(heartbeat_secs.saturating_mul(3)).unwrap_or(i32::MAX),
            ),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    let mut value = serde_json::to_value(&lease).map_err(kube::Error::SerdeError)?;
    if let Some(o) = value.as_object_mut() {
        o.insert("apiVersion".into(), "coordination.k8s.io/v1".into());
        o.insert("kind".into(), "Lease".into());
    }
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .map(|_| ())
}

/// Package digests with an extracted tree under `<hostRoot>/packages`.
pub fn cached_packages(packages_root: &Path) -> BTreeSet<String> {
    std::fs::read_dir(packages_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect()
}

/// Existing slot directories `<slotsRoot>/<ns>/<policy uid>/sN` not leased, per policy uid.
pub fn free_cleaned_slots(
    slots_root: &Path,
    leased: impl Fn(&str, &str, u32) -> bool,
) -> BTreeMap<String, u32> {
    let mut free = BTreeMap::new();
    for (ns, uid, n, _) in crate::workspace::slot_path::slot_dirs(slots_root) {
        if !leased(&ns, &uid, n) {
            *free.entry(uid).or_insert(0) += 1;
        }
    }
    free
}

/// The advert of an agent with `capacity`, `counted` attempts holding or waiting for capacity.
pub fn advert(
    capacity: u32,
    counted: usize,
    recovery_complete: bool,
    recovery_blocked: Option<runner_manager_crds::lease::RecoveryBlocked>,
    packages: BTreeSet<String>,
    free_slots: BTreeMap<String, u32>,
) -> AgentAdvert {
    AgentAdvert {
        capacity,
        free: capacity.saturating_sub(u32::try_from(counted).unwrap_or(u32::MAX)),
        recovery_complete,
        recovery_blocked,
        providers: [Provider::Native].into(),
        packages,
        free_slots,
        foreign_requests: None,
        native_refused: None,
    }
}

impl Agent {
    /// What the Lease says now.
    pub fn advert(&self) -> AgentAdvert {
        let pending = self.pending();
        let counted = self.book().counted_with(&pending);
        let slots = self.slots().clone();
        let advert = advert(
            self.host.capacity,
            counted,
            self.gate.is_complete(),
            self.gate.blocked(),
            cached_packages(&self.host.root.join("packages")),
            free_cleaned_slots(&self.host.slots_root, |ns, uid, n| {
                slots
                    .leased(&SlotKey {
                        namespace: ns.to_owned(),
                        policy_uid: uid.to_owned(),
                    })
                    .contains(&n)
            }),
        );
        let mut providers = advert.providers.clone();
        if self.providers.native_refused().is_some() {
            providers.remove(&runner_manager_crds::lease::Provider::Native);
        }
        AgentAdvert {
            foreign_requests: self.cluster.foreign_pods.requests(),
            native_refused: self.providers.native_refused().map(|r| r.lease()),
            providers,
            ..advert
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_is_what_the_agent_counts_and_never_negative() {
        let a = advert(4, 3, true, None, BTreeSet::new(), BTreeMap::new());
        assert_eq!(a.free, 1);
        assert_eq!(
            advert(2, 5, false, None, BTreeSet::new(), BTreeMap::new()).free,
            0
        );
    }

    #[test]
    fn only_unleased_slot_directories_are_free() {
        let root = tempfile::tempdir().unwrap();
        for s in [
            "team/uid-1/s1",
            "team/uid-1/s2",
            "team/uid-2/s1",
            "team/uid-1/junk",
        ] {
            std::fs::create_dir_all(root.path().join(s)).unwrap();
        }
        let free = free_cleaned_slots(root.path(), |_, uid, n| uid == "uid-1" && n == 1);
        assert_eq!(
            free,
            [("uid-1".to_owned(), 1), ("uid-2".to_owned(), 1)].into()
        );
    }
}
