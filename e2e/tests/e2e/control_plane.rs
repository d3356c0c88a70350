//! Against a real API server (v1.20, built by `e2e/control-plane/`): the CRDs install, the
//! samples are accepted, the invalid policies are refused with the field named, unknown fields a
//! tenant might use to name host paths or URLs are pruned, and status writes are a CAS that the
//! journal re-reads and re-decides on conflict. Skipped, with the reason, without `KUBECONFIG`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use runner_manager_crds::attempt::{RunnerAttempt, Transition, WorkspacePlacement, spec_hash};
use runner_manager_crds::patch::PatchError;
use runner_manager_crds::policy::{ScalePolicy, WorkspaceMode};
use runner_manager_crds::state::{Actor, AttemptState};
use runner_manager_crds::validate::validate_policy;
use runner_manager_crds::writer::{Decision, JournalError, JournalWriter, OnConflict};
use runner_manager_e2e::harness::cluster::install_crds;
use runner_manager_e2e::harness::fixtures::native_attempt;
use runner_manager_e2e::harness::world::World;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn yaml_docs(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| serde_json::Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

use serde::Deserialize;

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// The first `# <key>: <value>` header line of a testdata file.
fn header(path: &Path, key: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let prefix = format!("# {key}: ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
        .unwrap_or_else(|| panic!("{} has no `{prefix}` header", path.display()))
}

fn policies(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<ScalePolicy>(&()))
}

/// The client and the test's own (team) namespace, the CRDs installed.
async fn setup(test: &str) -> Option<(Client, String)> {
    let world = World::builder(test)
        .namespaces("rm-sys", "rm-e2e")
        .build()
        .await
        .unwrap()?;
    Some((world.kube.clone(), world.team.clone()))
}

#[tokio::test]
async fn crds_install_and_become_established() {
    let Some((client, _)) = setup("crds_install_and_become_established").await else {
        return;
    };
    // Applying twice is a no-op: the operator applies its CRDs at every start.
    install_crds(&client).await.unwrap();
}

#[tokio::test]
async fn every_sample_is_accepted_and_valid() {
    let Some((client, ns)) = setup("every_sample_is_accepted_and_valid").await else {
        return;
    };
    let files = yaml_files(&repo_root().join("deploy/samples"));
    assert!(files.len() >= 3, "deploy/samples holds the samples");
    let mut policies_created = 0;
    for file in files {
        for doc in yaml_docs(&file) {
            match doc["kind"].as_str() {
                Some("ScalePolicy") => {
                    let typed: ScalePolicy = serde_json::from_value(doc.clone()).unwrap();
                    let problems = validate_policy(&typed.spec);
                    assert!(problems.is_empty(), "{}: {problems:?}", file.display());
                    let obj: DynamicObject = serde_json::from_value(doc).unwrap();
                    policies(&client, &ns)
                        .create(&PostParams::default(), &obj)
                        .await
                        .unwrap_or_else(|e| panic!("{} refused: {e}", file.display()));
                    policies_created += 1;
                }
                Some("ConfigMap") => {
                    let cm: ConfigMap = serde_json::from_value(doc).unwrap();
                    Api::<ConfigMap>::namespaced(client.clone(), &ns)
                        .create(&PostParams::default(), &cm)
                        .await
                        .unwrap();
                }
                other => panic!("{}: unexpected kind {other:?}", file.display()),
            }
        }
    }
    // Read back through the typed API: defaults filled in by the server's schema.
    let typed: Api<ScalePolicy> = Api::namespaced(client.clone(), &ns);
    let all = typed.list(&Default::default()).await.unwrap();
    assert_eq!(all.items.len(), policies_created);
    let org = typed.get("acme-org").await.unwrap();
    assert_eq!(org.spec.workspace.mode, WorkspaceMode::Ephemeral);
    assert_eq!(org.spec.runner.version, "latest");
    assert_eq!(org.spec.min_idle, 0);
}

#[tokio::test]
async fn every_invalid_policy_is_refused_naming_the_field() {
    let Some((client, ns)) = setup("every_invalid_policy_is_refused_naming_the_field").await else {
        return;
    };
    let files = yaml_files(&repo_root().join("e2e/testdata/invalid"));
    assert!(
        files.len() >= 12,
        "at least 12 invalid policies, found {}",
        files.len()
    );
    for file in files {
        let field = header(&file, "field");
        let doc = yaml_docs(&file).remove(0);
        let obj: DynamicObject = serde_json::from_value(doc).unwrap();
        match policies(&client, &ns)
            .create(&PostParams::default(), &obj)
            .await
        {
            Ok(_) => panic!("{} was accepted", file.display()),
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{}: {status:?}", file.display());
                assert!(
                    status.message.contains(&field),
                    "{}: the server's message does not name {field}: {}",
                    file.display(),
                    status.message
                );
            }
            Err(e) => panic!("{}: {e}", file.display()),
        }
    }
}

#[tokio::test]
async fn fields_a_tenant_might_add_for_paths_or_urls_are_pruned() {
    let Some((client, ns)) = setup("fields_a_tenant_might_add_for_paths_or_urls_are_pruned").await
    else {
        return;
    };
    for file in yaml_files(&repo_root().join("e2e/testdata/pruned")) {
        let pruned = header(&file, "pruned");
        let doc = yaml_docs(&file).remove(0);
        let obj: DynamicObject = serde_json::from_value(doc).unwrap();
        let stored = policies(&client, &ns)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap();
        let mut value = &serde_json::to_value(&stored).unwrap();
        let path: Vec<&str> = pruned.split('.').collect();
        let (last, parents) = path.split_last().unwrap();
        for p in parents {
            value = &value[p];
        }
        assert!(
            value.is_object(),
            "{}: parent of {pruned} kept",
            file.display()
        );
        assert!(
            value.get(last).is_none(),
            "{}: {pruned} was stored",
            file.display()
        );
    }
}

fn attempt(id: u128) -> RunnerAttempt {
    native_attempt(uuid::Uuid::from_u128(id), "web", "policy-uid", "node-a")
}

fn admit(a: &RunnerAttempt) -> Decision {
    if a.status.clone().unwrap_or_default().journal.state() == AttemptState::Pending {
        Decision::Take(Transition::Admit {
            placement: WorkspacePlacement::ephemeral("/var/lib/runner-manager/runners/abc"),
            spec_hash: spec_hash(&a.spec),
        })
    } else {
        Decision::Nothing
    }
}

// Multi-threaded: the decision closure below makes a blocking call to play a concurrent writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_are_a_cas_and_the_journal_rereads_on_conflict() {
    let Some((client, ns)) =
        setup("status_writes_are_a_cas_and_the_journal_rereads_on_conflict").await
    else {
        return;
    };
    let api: Api<RunnerAttempt> = Api::namespaced(client.clone(), &ns);
    let created = api
        .create(
            &PostParams::default(),
            &attempt(0x3f2a9c01_77aa_4bcd_8e00_123456789abc),
        )
        .await
        .unwrap();
    let name = created.metadata.name.clone().unwrap();

    // The operator writes a fact (its own fields, a plain merge patch): the resourceVersion moves.
    let fact = serde_json::json!({"status": {"github": {"status": "offline", "busy": false, "generation": 1}}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&fact))
        .await
        .unwrap();

    // A write from the stale copy is refused with 409: nothing is overwritten.
    let agent = JournalWriter::new(api.clone(), Actor::Agent);
    let stale = agent
        .write(&created, admit(&created), Timestamp::now())
        .await;
    match stale {
        Err(e) if e.is_conflict() => {}
        other => panic!("a stale resourceVersion must be refused with 409, got {other:?}"),
    }
    let now = api.get_status(&name).await.unwrap();
    assert_eq!(now.status.unwrap().journal.state(), AttemptState::Pending);

    // A writer that leaves conflicts to its next pass (the operator's) gets the 409 back.
    let returned = agent
        .clone()
        .on_conflict(OnConflict::Return)
        .advance(&name, Some(&created), admit)
        .await;
    assert!(
        matches!(&returned, Err(e) if e.is_conflict()),
        "{returned:?}"
    );

    // `advance` re-reads and re-decides. Force one conflict: while deciding on the first read,
    // another writer (the operator again) changes the object.
    let mut decisions = 0;
    let written = agent.advance(&name, None, |a| {
        decisions += 1;
        if decisions == 1 {
            let fact = serde_json::json!({"status": {"github": {"status": "offline", "busy": false, "generation": 2}}});
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&fact),
                ))
            })
            .unwrap();
        }
        admit(a)
    })
    .await
    .unwrap()
    .expect("the edge was taken");
    assert_eq!(decisions, 2, "one conflict, one re-read and re-decision");
    let status = written.status.unwrap();
    assert_eq!(status.journal.state(), AttemptState::Allocated);
    assert_eq!(
        status.journal.spec_hash(),
        Some(spec_hash(&written.spec).as_str())
    );
    // The operator's fact survived the agent's write: each owns its half.
    assert_eq!(status.facts.github.unwrap().generation, 2);

    // Re-deciding on the fresh object finds nothing to do: no second write.
    let again = agent.advance(&name, None, admit).await.unwrap();
    assert!(again.is_none());

    // An illegal edge is refused before anything is sent.
    let illegal = agent
        .advance(&name, None, |_| {
            Decision::Take(Transition::Conclude(
                runner_manager_crds::outcome::Outcome::CompletedJob,
            ))
        })
        .await;
    assert!(
        matches!(illegal, Err(JournalError::Patch(PatchError::Edge(_)))),
        "{illegal:?}"
    );
    // And the broker's edge is refused to the agent.
    let wrong_actor = agent
        .advance(&name, None, |_| {
            Decision::Take(Transition::MarkPrepared { environment: None })
        })
        .await
        .unwrap()
        .unwrap();
    let by_agent = agent
        .advance(&name, None, |_| {
            Decision::Take(Transition::ReceiveJit {
                runner: runner_manager_crds::attempt::RunnerRegistration {
                    name: "runner-manager-x".into(),
                    id: 1,
                },
            })
        })
        .await;
    assert_eq!(
        wrong_actor.status.unwrap().journal.state(),
        AttemptState::Prepared
    );
    assert!(
        matches!(by_agent, Err(JournalError::Patch(PatchError::Edge(_)))),
        "{by_agent:?}"
    );
}

#[tokio::test]
async fn a_changed_spec_is_refused_by_the_journal() {
    let Some((client, ns)) = setup("a_changed_spec_is_refused_by_the_journal").await else {
        return;
    };
    let api: Api<RunnerAttempt> = Api::namespaced(client.clone(), &ns);
    let name1 = attempt(1).metadata.name.unwrap();
    api.create(&PostParams::default(), &attempt(1))
        .await
        .unwrap();
    JournalWriter::new(api.clone(), Actor::Agent)
        .advance(&name1, None, admit)
        .await
        .unwrap()
        .unwrap();
    // Someone edits the snapshot after admission.
    let edit = serde_json::json!({"spec": {"snapshot": {"labels": ["self-hosted", "gpu"]}}});
    api.patch(&name1, &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    let r = JournalWriter::new(api.clone(), Actor::Agent)
        .advance(&name1, None, |_| {
            Decision::Take(Transition::MarkPrepared { environment: None })
        })
        .await;
    assert!(
        matches!(r, Err(JournalError::Patch(PatchError::SpecChanged))),
        "{r:?}"
    );
    // Concluding stays possible, so the attempt can still end and be cleaned.
    let concluded = JournalWriter::new(api.clone(), Actor::Agent)
        .advance(&name1, None, |_| {
            Decision::Take(Transition::Conclude(
                runner_manager_crds::outcome::Outcome::Failed(
                    runner_manager_crds::outcome::FailureReason::SpecChanged,
                ),
            ))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        concluded.status.unwrap().journal.state(),
        AttemptState::Failed
    );
}
