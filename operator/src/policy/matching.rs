//! Which policy a queued job belongs to (DESIGN §7): among the policies whose GitHub target
//! covers the job's repository and whose labels cover every one of the job's `runs-on` labels,
//! the one with the fewest extra labels; ties by namespace, then name.
//!
//! Labels compare case-insensitively, as GitHub compares them. `self-hosted` is a label every
//! self-hosted runner carries whether or not it was listed, so it is covered by every policy and
//! never counts as an extra; the policy controller puts it in each runner's labels so that GitHub
//! agrees. The OS and architecture labels that `config.sh` adds are *not* implied: a JIT
//! registration carries exactly the labels it is given.

use runner_manager_crds::target::TargetKind;

/// The label every self-hosted runner has.
pub const SELF_HOSTED: &str = "self-hosted";

/// A policy as matching sees it.
#[derive(Clone, Debug)]
pub struct PolicyLabels<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub target: &'a TargetKind,
    pub labels: &'a [String],
}

/// A job as matching sees it.
#[derive(Clone, Copy, Debug)]
pub struct JobLabels<'a> {
    /// `owner/repo`, from the payload's `repository.full_name`.
    pub repository: &'a str,
    /// The enterprise slug when the delivery names one (enterprise hooks).
    pub enterprise: Option<&'a str>,
    pub labels: &'a [String],
}

fn eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Whether a policy's target can have runners for the job's repository.
pub fn target_covers(target: &TargetKind, job: &JobLabels<'_>) -> bool {
    let (owner, repo) = job
        .repository
        .split_once('/')
        .unwrap_or((job.repository, ""));
    match target {
        TargetKind::Repository { owner: o, repo: r } => eq(o, owner) && eq(r, repo),
        TargetKind::Organization { org } => eq(org, owner),
        TargetKind::Enterprise { enterprise } => job.enterprise.is_some_and(|e| eq(e, enterprise)),
    }
}

/// How many of the policy's labels the job does not ask for, or `None` when the policy does not
/// cover the job's labels. A job without labels matches nothing: there is no `runs-on` to serve.
pub fn extra_labels(policy: &[String], job: &[String]) -> Option<usize> {
    if job.is_empty() {
        return None;
    }
    let covered = |wanted: &String| eq(wanted, SELF_HOSTED) || policy.iter().any(|l| eq(l, wanted));
    if !job.iter().all(covered) {
        return None;
    }
    // Distinct policy labels (case-insensitively) that the job did not name, `self-hosted` aside.
    let mut extra: Vec<String> = policy
        .iter()
        .filter(|l| !eq(l, SELF_HOSTED) && !job.iter().any(|w| eq(w, l)))
        .map(|l| l.to_ascii_lowercase())
        .collect();
    extra.sort();
    extra.dedup();
    Some(extra.len())
}

/// The policy a job belongs to, if any.
pub fn match_job<'p, 'a>(
    job: &JobLabels<'_>,
    policies: &'p [PolicyLabels<'a>],
) -> Option<&'p PolicyLabels<'a>> {
    policies
        .iter()
        .filter(|p| target_covers(p.target, job))
        .filter_map(|p| extra_labels(p.labels, job.labels).map(|extra| (extra, p)))
        .min_by(|(ea, a), (eb, b)| {
            ea.cmp(eb)
                .then_with(|| a.namespace.cmp(b.namespace))
                .then_with(|| a.name.cmp(b.name))
        })
        .map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| (*s).to_owned()).collect()
    }

    fn org() -> TargetKind {
        TargetKind::Organization { org: "acme".into() }
    }

    fn job<'a>(labels: &'a [String]) -> JobLabels<'a> {
        JobLabels {
            repository: "acme/web",
            enterprise: None,
            labels,
        }
    }

    #[test]
    fn extra_labels_table() {
        // (policy, job) → extra
        let table: &[(&[&str], &[&str], Option<usize>)] = &[
            (
                &["self-hosted", "linux"],
                &["self-hosted", "linux"],
                Some(0),
            ),
            (&["self-hosted", "linux", "big"], &["linux"], Some(1)),
            (&["LINUX", "X64"], &["self-hosted", "linux", "x64"], Some(0)),
            (&["linux"], &["self-hosted"], Some(1)),
            (&["linux", "Linux"], &["self-hosted"], Some(1)),
            (&["linux"], &["gpu"], None),
            (&["linux"], &["linux", "gpu"], None),
            (&["self-hosted", "linux"], &["ubuntu-latest"], None),
            (&["linux"], &[], None),
        ];
        for (policy, wanted, want) in table {
            assert_eq!(
                extra_labels(&labels(policy), &labels(wanted)),
                *want,
                "{policy:?} {wanted:?}"
            );
        }
    }

    #[test]
    fn fewest_extra_labels_wins_and_ties_go_by_name() {
        let t = org();
        let small = labels(&["self-hosted", "linux"]);
        let big = labels(&["self-hosted", "linux", "big"]);
        let policies = [
            PolicyLabels {
                namespace: "team",
                name: "zz-big",
                target: &t,
                labels: &big,
            },
            PolicyLabels {
                namespace: "team",
                name: "b-small",
                target: &t,
                labels: &small,
            },
            PolicyLabels {
                namespace: "team",
                name: "a-small",
                target: &t,
                labels: &small,
            },
            PolicyLabels {
                namespace: "alpha",
                name: "z-small",
                target: &t,
                labels: &small,
            },
        ];
        let linux = labels(&["self-hosted", "Linux"]);
        let got = match_job(&job(&linux), &policies).unwrap();
        assert_eq!((got.namespace, got.name), ("alpha", "z-small"));
        let wants_big = labels(&["linux", "BIG"]);
        assert_eq!(
            match_job(&job(&wants_big), &policies).unwrap().name,
            "zz-big"
        );
    }

    #[test]
    fn no_match() {
        let t = org();
        let l = labels(&["self-hosted", "linux"]);
        let policies = [PolicyLabels {
            namespace: "team",
            name: "web",
            target: &t,
            labels: &l,
        }];
        let gpu = labels(&["self-hosted", "gpu"]);
        assert!(match_job(&job(&gpu), &policies).is_none());
        let hosted = labels(&["ubuntu-latest"]);
        assert!(match_job(&job(&hosted), &policies).is_none());
        assert!(match_job(&job(&[]), &policies).is_none());
        assert!(match_job(&job(&l), &[]).is_none());
    }

    #[test]
    fn target_must_cover_the_repository() {
        let l = labels(&["self-hosted"]);
        let other_repo = TargetKind::Repository {
            owner: "acme".into(),
            repo: "api".into(),
        };
        let same_repo = TargetKind::Repository {
            owner: "ACME".into(),
            repo: "Web".into(),
        };
        let other_org = TargetKind::Organization {
            org: "other".into(),
        };
        let ent = TargetKind::Enterprise {
            enterprise: "big-co".into(),
        };
        let j = job(&l);
        assert!(!target_covers(&other_repo, &j));
        assert!(target_covers(&same_repo, &j));
        assert!(!target_covers(&other_org, &j));
        assert!(target_covers(&org(), &j));
        assert!(
            !target_covers(&ent, &j),
            "no enterprise named in the delivery"
        );
        let ej = JobLabels {
            enterprise: Some("Big-Co"),
            ..j
        };
        assert!(target_covers(&ent, &ej));
        let policies = [PolicyLabels {
            namespace: "team",
            name: "api",
            target: &other_repo,
            labels: &l,
        }];
        assert!(match_job(&j, &policies).is_none());
    }
}
