//! The agent binary refuses roots it must not work in before it creates anything (issue 14):
//! the refusal names the flag and the fix, the process exits non-zero, and no directory of
//! either root exists afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn agent(host: &Path, slots: &Path) -> std::process::Output {
    agent_with(host, slots, &[])
}

fn agent_with(host: &Path, slots: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_runner-manager-node-agent"))
        .args(extra)
        .args([
            "--node-name",
            "preflight-node",
            "--launcher",
            "direct",
            "--host-root",
        ])
        .arg(host)
        .arg("--slots-root")
        .arg(slots)
        .env_remove("RM_HOST_ROOT")
        .env_remove("RM_SLOTS_ROOT")
        // Were the preflight skipped, the agent would stop here instead, with another message.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .unwrap()
}

#[test]
fn the_agent_refuses_unsafe_roots_before_creating_anything() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    let cases: [(&Path, std::path::PathBuf, &str); 5] = [
        (&host, host.join("packages/slots"), "--slots-root"),
        (&host, host.join("runners"), "--slots-root"),
        (&host, host.clone(), "--slots-root"),
        (
            Path::new("/proc/runner-manager"),
            dir.path().join("slots"),
            "--host-root",
        ),
        (&host, dir.path().join("../slots").join("x"), "--slots-root"),
    ];
    for (host_root, slots_root, flag) in cases {
        let out = agent(host_root, &slots_root);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{host_root:?} {slots_root:?}");
        assert!(stderr.contains(flag), "{flag} named: {stderr}");
        assert!(
            !stderr.contains("Kubernetes"),
            "refused before anything else: {stderr}"
        );
        assert!(
            !host.exists(),
            "nothing created: {host:?} for {slots_root:?}"
        );
        assert!(!slots_root.exists());
    }
    // Outside the tempdir, the default layout's shape passes the preflight (and fails later, at
    // the Kubernetes configuration).
    let out = agent(&host, &host.join("slots"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Kubernetes"), "{stderr}");
}

/// The refusal's log line, as shipped (JSON): a closed `error` kind that the field allow-list
/// keeps, the path and the fix in the message only, no path in any field (row 5).
#[test]
fn a_refused_root_is_logged_with_a_closed_kind_and_no_path_in_a_field() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    let slots = host.join("runners");
    let out = agent_with(&host, &slots, &["--log-format", "json"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line: serde_json::Value = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["error"].is_string())
        .unwrap_or_else(|| panic!("no line with an error kind: {stderr}"));
    let fields = line["fields"].as_object().unwrap();
    assert_eq!(fields["error"], "root_refused");
    let message = fields["message"].as_str().unwrap();
    assert!(message.contains(&slots.display().to_string()), "{message}");
    assert!(
        message.contains("--slots-root"),
        "the fix is named: {message}"
    );
    for (k, v) in fields {
        assert!(
            k == "message" || !v.to_string().contains('/'),
            "a path in field {k}: {v}"
        );
    }
    assert_eq!(
        fields.keys().filter(|k| *k != "message").count(),
        1,
        "{fields:?}"
    );
}
