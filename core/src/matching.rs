//! Which policy a queued job belongs to (DESIGN §7): among the *eligible* policies whose GitHub
//! host is the job's and whose target covers the job's repository, and whose labels cover every
//! one of the job's `runs-on` labels, the one with the fewest extra labels; ties by namespace,
//! then name.
//!
//! Eligible means Ready for its current generation (its credentials were proven against its own
//! host and target) and allowed by the owner bindings (`policy::tenancy`): a policy that merely
//! names a repository, with a junk Secret or from a namespace the admin did not bind, takes no
//! job, however its namespace sorts (issue 13, finding 4).
//!
//! Labels compare case-insensitively, as GitHub compares them. `self-hosted` is a label every
//! self-hosted runner carries whether or not it was listed, so it is covered by every policy and
//! never counts as an extra; the policy controller puts it in each runner's labels so that GitHub
//! agrees. The OS and architecture labels that `config.sh` adds are *not* implied: a JIT
//! registration carries exactly the labels it is given.

use crate::target::TargetKind;

/// The label every self-hosted runner has.
pub const SELF_HOSTED: &str = "self-hosted";

/// A policy as matching sees it.
#[derive(Clone, Debug)]
pub struct PolicyLabels<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// The host of the policy's URL (`github.com`, a GHES host), lowercase.
    pub host: &'a str,
    pub target: &'a TargetKind,
    pub labels: &'a [String],
    /// Whether the policy may take jobs at all (Ready with proven credentials, owner binding
    /// respected). An ineligible policy never wins, not even a tie.
    pub eligible: bool,
}

/// A job as matching sees it.
#[derive(Clone, Copy, Debug)]
pub struct JobLabels<'a> {
    /// The GitHub host the job lives on (from the payload's `repository.html_url`, or the
    /// polled target's host). `acme/web` on github.com and on a GHES host are different
    /// repositories.
    pub host: &'a str,
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
        .filter(|p| p.eligible && eq(p.host, job.host))
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
            host: "github.com",
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
                host: "github.com",
                target: &t,
                labels: &big,
                eligible: true,
            },
            PolicyLabels {
                namespace: "team",
                name: "b-small",
                host: "github.com",
                target: &t,
                labels: &small,
                eligible: true,
            },
            PolicyLabels {
                namespace: "team",
                name: "a-small",
                host: "github.com",
                target: &t,
                labels: &small,
                eligible: true,
            },
            PolicyLabels {
                namespace: "alpha",
                name: "z-small",
                host: "github.com",
                target: &t,
                labels: &small,
                eligible: true,
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
            host: "github.com",
            target: &t,
            labels: &l,
            eligible: true,
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
            host: "github.com",
            target: &other_repo,
            labels: &l,
            eligible: true,
        }];
        assert!(match_job(&j, &policies).is_none());
    }

    #[test]
    fn an_ineligible_policy_never_wins_even_a_tie_it_would_win_by_namespace() {
        // The attack of issue 13: namespace `aaa` names the victim's repository with a junk
        // Secret. It sorts first, so only eligibility keeps it from the victim's jobs.
        let repo = TargetKind::Repository {
            owner: "acme".into(),
            repo: "web".into(),
        };
        let l = labels(&["self-hosted", "linux"]);
        let policy = |namespace, eligible| PolicyLabels {
            namespace,
            name: "runners",
            host: "github.com",
            target: &repo,
            labels: &l,
            eligible,
        };
        let j = job(&l);
        let both = [policy("aaa", false), policy("team", true)];
        assert_eq!(match_job(&j, &both).unwrap().namespace, "team");
        let attacker_alone = [policy("aaa", false)];
        assert!(match_job(&j, &attacker_alone).is_none());
        // With eligibility it would have won: the order is what the attack relies on.
        let unguarded = [policy("aaa", true), policy("team", true)];
        assert_eq!(match_job(&j, &unguarded).unwrap().namespace, "aaa");
    }

    #[test]
    fn the_host_is_part_of_the_match() {
        let repo = TargetKind::Repository {
            owner: "acme".into(),
            repo: "web".into(),
        };
        let l = labels(&["self-hosted"]);
        let ghes = [PolicyLabels {
            namespace: "aaa",
            name: "ghes",
            host: "ghe.example.com",
            target: &repo,
            labels: &l,
            eligible: true,
        }];
        assert!(
            match_job(&job(&l), &ghes).is_none(),
            "acme/web on a GHES host is not acme/web on github.com"
        );
        let on_ghes = JobLabels {
            host: "GHE.example.com",
            ..job(&l)
        };
        assert_eq!(match_job(&on_ghes, &ghes).unwrap().name, "ghes");
    }
}
