//! Demand (DESIGN §7): `desired = min(maxRunners, busy + pendingJobs + minIdle)`, and the scale
//! decision from a policy's attempts. Scale-down only ever names idle runners (DESIGN §4 rule 3);
//! the controller deregisters each one first and lets a 422 (a job just landed) cancel it.

use jiff::Timestamp;

use crate::state::AttemptState;

/// What the decision needs to know of one attempt of the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptView<'a> {
    pub name: &'a str,
    pub state: AttemptState,
    /// `spec.termination` is set: the attempt is already on its way out and supplies nothing.
    pub termination_requested: bool,
    /// Since when the runner has been idle (`registeredAt`, or the last `Busy→Idle`); `None`
    /// sorts as the oldest, since nothing says it is recent.
    pub idle_since: Option<Timestamp>,
}

/// Attempts of a policy counted by what they are doing: the policy's status counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// On their way up: `Pending` to `Starting`, not being terminated.
    pub starting: u32,
    /// Registered without a job, not being terminated.
    pub idle: u32,
    /// Running a job (whether or not a termination was asked: a busy runner finishes its job).
    pub busy: u32,
    /// Live but with a termination requested (idle or still starting): leaving, supply nothing.
    pub terminating: u32,
    /// Concluded (or, OCI, being torn down) and not yet `Cleaned`.
    pub cleaning: u32,
}

impl Counts {
    pub fn of<'a>(attempts: impl IntoIterator<Item = &'a AttemptView<'a>>) -> Self {
        let mut c = Self::default();
        for a in attempts {
            match a.state {
                AttemptState::Busy => c.busy += 1,
                AttemptState::Cleaned => {}
                s if s.is_terminal() => c.cleaning += 1,
                _ if a.termination_requested => c.terminating += 1,
                AttemptState::Idle => c.idle += 1,
                // Pending and every live state before Idle.
                _ => c.starting += 1,
            }
        }
        c
    }

    /// Runners that are, or will be, able to take a job.
    pub fn supply(&self) -> u32 {
        self.starting + self.idle + self.busy
    }

    /// Runners that may be alive on GitHub or a node right now (the `maxRunners` ceiling).
    pub fn alive(&self) -> u32 {
        self.supply() + self.terminating
    }
}

/// The policy's bounds and the size of its pending-job ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DemandInput {
    pub min_idle: u32,
    pub max_runners: u32,
    pub pending_jobs: u32,
}

/// `min(maxRunners, busy + pendingJobs + minIdle)`.
pub fn desired(input: DemandInput, busy: u32) -> u32 {
    busy.saturating_add(input.pending_jobs)
        .saturating_add(input.min_idle)
        .min(input.max_runners)
}

/// What the controller should do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScaleDecision<'a> {
    /// Create this many attempts.
    Up { create: u32 },
    /// Deregister, then terminate, these idle attempts (oldest idle first).
    Down { idle: Vec<&'a str> },
    /// Supply matches demand, or the only surplus is runners that cannot be removed (starting or
    /// busy): wait for them.
    Steady,
    /// More is wanted, but `maxRunners` runners are alive (some still leaving).
    AtMaxRunners,
}

/// The whole answer: counts for the status, the desired count and the decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scale<'a> {
    pub counts: Counts,
    pub desired: u32,
    pub decision: ScaleDecision<'a>,
}

/// Decide from the policy's attempts.
///
/// Scale-down picks the **oldest idle first**: each idle runner dies at its idle timeout anyway,
/// so keeping the newest keeps the runners with the most useful life left and saves launches
/// (and JIT mints); the oldest are also the likeliest to carry an older snapshot (runner
/// version, env) than the policy's current one. A starting runner is never cancelled (it may be
/// about to take a job, and its JIT is already spent) and a busy one is never named.
pub fn decide<'a>(input: DemandInput, attempts: &'a [AttemptView<'a>]) -> Scale<'a> {
    let counts = Counts::of(attempts);
    let desired = desired(input, counts.busy);
    let supply = counts.supply();
    let decision = if supply < desired {
        // Leaving runners still count against the ceiling: `maxRunners` bounds what is alive.
        let room = input.max_runners.saturating_sub(counts.alive());
        let create = (desired - supply).min(room);
        if create == 0 {
            ScaleDecision::AtMaxRunners
        } else {
            ScaleDecision::Up { create }
        }
    } else if supply > desired && counts.idle > 0 {
        let surplus = (supply - desired).min(counts.idle) as usize;
        let mut idle: Vec<&AttemptView<'a>> = attempts
            .iter()
            .filter(|a| a.state == AttemptState::Idle && !a.termination_requested)
            .collect();
        idle.sort_by(|a, b| a.idle_since.cmp(&b.idle_since).then(a.name.cmp(b.name)));
        ScaleDecision::Down {
            idle: idle.into_iter().take(surplus).map(|a| a.name).collect(),
        }
    } else {
        ScaleDecision::Steady
    };
    Scale {
        counts,
        desired,
        decision,
    }
}

/// [`decide`], with a scale-up held back by `presumed_taken` pending jobs the policy's own
/// runners have evidently taken (`policy::ledger::presumed_taken`): the ledger less those is what
/// still needs a runner. Scale-down and the published desired count use the whole ledger, so
/// no runner is removed on a presumption.
pub fn decide_holding<'a>(
    input: DemandInput,
    attempts: &'a [AttemptView<'a>],
    presumed_taken: u32,
) -> Scale<'a> {
    let scale = decide(input, attempts);
    if presumed_taken == 0 || !matches!(scale.decision, ScaleDecision::Up { .. }) {
        return scale;
    }
    let held = decide(
        DemandInput {
            pending_jobs: input.pending_jobs.saturating_sub(presumed_taken),
            ..input
        },
        attempts,
    );
    let decision = match held.decision {
        up @ ScaleDecision::Up { .. } => up,
        ScaleDecision::AtMaxRunners => ScaleDecision::AtMaxRunners,
        ScaleDecision::Down { .. } | ScaleDecision::Steady => ScaleDecision::Steady,
    };
    Scale { decision, ..scale }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttemptState::*;

    fn at(secs: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(secs).unwrap())
    }

    fn a(name: &str, state: AttemptState) -> AttemptView<'_> {
        AttemptView {
            name,
            state,
            termination_requested: false,
            idle_since: None,
        }
    }

    fn idle(name: &str, since: i64) -> AttemptView<'_> {
        AttemptView {
            idle_since: at(since),
            ..a(name, Idle)
        }
    }

    fn input(min_idle: u32, max_runners: u32, pending_jobs: u32) -> DemandInput {
        DemandInput {
            min_idle,
            max_runners,
            pending_jobs,
        }
    }

    #[test]
    fn desired_is_busy_plus_pending_plus_min_idle_capped() {
        // (min_idle, max, pending, busy) → desired
        let table = [
            (0, 10, 0, 0, 0),
            (2, 10, 0, 0, 2),
            (2, 10, 3, 0, 5),
            (2, 10, 3, 4, 9),
            (2, 10, 30, 4, 10),
            (0, 1, 0, 5, 1),
            (u32::MAX, 7, u32::MAX, u32::MAX, 7),
        ];
        for (min_idle, max, pending, busy, want) in table {
            assert_eq!(
                desired(input(min_idle, max, pending), busy),
                want,
                "{min_idle} {max} {pending} {busy}"
            );
        }
    }

    #[test]
    fn counts_by_state() {
        let mut leaving = a("t", Idle);
        leaving.termination_requested = true;
        let mut busy_asked = a("u", Busy);
        busy_asked.termination_requested = true;
        let attempts = [
            a("p", Pending),
            a("al", Allocated),
            a("pr", Prepared),
            a("j", JitReceived),
            a("s", Starting),
            a("i", Idle),
            a("b", Busy),
            busy_asked,
            leaving,
            a("f", Finished),
            a("o", Orphaned),
            a("d", CleanupDeferred),
            a("c", Cleaned),
        ];
        let c = Counts::of(&attempts);
        assert_eq!(
            c,
            Counts {
                starting: 5,
                idle: 1,
                busy: 2,
                terminating: 1,
                cleaning: 3,
            }
        );
        assert_eq!(c.supply(), 8);
        assert_eq!(c.alive(), 9);
    }

    #[test]
    fn scale_decisions() {
        struct Case<'a> {
            what: &'a str,
            input: DemandInput,
            attempts: Vec<AttemptView<'a>>,
            want: ScaleDecision<'a>,
        }
        let mut leaving = idle("leaving", 1);
        leaving.termination_requested = true;
        let cases = [
            Case {
                what: "scale from zero on a pending job",
                input: input(0, 10, 1),
                attempts: vec![],
                want: ScaleDecision::Up { create: 1 },
            },
            Case {
                what: "min idle honoured from nothing",
                input: input(2, 10, 0),
                attempts: vec![a("c", Cleaned), a("f", Failed)],
                want: ScaleDecision::Up { create: 2 },
            },
            Case {
                what: "starting runners count as supply",
                input: input(0, 10, 3),
                attempts: vec![a("p", Pending), a("s", Starting)],
                want: ScaleDecision::Up { create: 1 },
            },
            Case {
                what: "busy runners add to demand",
                input: input(1, 10, 0),
                attempts: vec![a("b1", Busy), a("b2", Busy)],
                want: ScaleDecision::Up { create: 1 },
            },
            Case {
                what: "steady",
                input: input(1, 10, 1),
                attempts: vec![a("b", Busy), idle("i", 5), a("s", Starting)],
                want: ScaleDecision::Steady,
            },
            Case {
                what: "capped by maxRunners",
                input: input(0, 3, 10),
                attempts: vec![a("b", Busy)],
                want: ScaleDecision::Up { create: 2 },
            },
            Case {
                what: "a leaving runner holds its place under the ceiling",
                input: input(0, 2, 5),
                attempts: vec![a("b", Busy), leaving.clone()],
                want: ScaleDecision::AtMaxRunners,
            },
            Case {
                what: "a leaving runner supplies nothing",
                input: input(1, 10, 0),
                attempts: vec![leaving.clone()],
                want: ScaleDecision::Up { create: 1 },
            },
            Case {
                what: "scale down oldest idle first, never busy",
                input: input(1, 10, 0),
                attempts: vec![
                    a("b", Busy),
                    idle("new", 300),
                    idle("old", 100),
                    idle("mid", 200),
                ],
                want: ScaleDecision::Down {
                    idle: vec!["old", "mid"],
                },
            },
            Case {
                what: "ties by name; unknown idle time is oldest",
                input: input(0, 10, 0),
                attempts: vec![idle("b", 100), idle("a", 100), a("z", Idle)],
                want: ScaleDecision::Down {
                    idle: vec!["z", "a", "b"],
                },
            },
            Case {
                what: "surplus of starting runners is left alone",
                input: input(0, 10, 0),
                attempts: vec![a("p", Pending), a("s", Starting)],
                want: ScaleDecision::Steady,
            },
            Case {
                what: "surplus larger than the idle runners: only the idle ones go",
                input: input(0, 10, 0),
                attempts: vec![a("s", Starting), idle("i", 1), a("b", Busy)],
                want: ScaleDecision::Down { idle: vec!["i"] },
            },
            Case {
                what: "only busy runners over the ceiling: nothing is touched",
                input: input(0, 1, 0),
                attempts: vec![a("b1", Busy), a("b2", Busy)],
                want: ScaleDecision::Steady,
            },
            Case {
                what: "already leaving idle runners are not named again",
                input: input(0, 10, 0),
                attempts: vec![leaving.clone(), idle("i", 9)],
                want: ScaleDecision::Down { idle: vec!["i"] },
            },
        ];
        for c in &cases {
            let got = decide(c.input, &c.attempts);
            assert_eq!(got.decision, c.want, "{}", c.what);
            if let ScaleDecision::Down { idle } = &got.decision {
                for name in idle {
                    let chosen = c.attempts.iter().find(|x| x.name == *name).unwrap();
                    assert_eq!(chosen.state, Idle, "{}: only idle runners", c.what);
                }
            }
        }
    }

    #[test]
    fn a_presumption_holds_back_scale_up_but_never_scales_down() {
        let attempts = [a("b", Busy)];
        // Two pending, one presumed taken by the busy runner: one more runner, not two.
        let s = decide_holding(input(0, 10, 2), &attempts, 1);
        assert_eq!(s.decision, ScaleDecision::Up { create: 1 });
        assert_eq!(s.desired, 3, "the published desired count is the ledger's");
        // Everything presumed taken: steady, not down.
        let with_idle = [a("b", Busy), idle("i", 5)];
        let s = decide_holding(input(0, 10, 2), &with_idle, 2);
        assert_eq!(s.decision, ScaleDecision::Steady);
        // No presumption: as decide.
        assert_eq!(
            decide_holding(input(0, 10, 2), &attempts, 0),
            decide(input(0, 10, 2), &attempts)
        );
    }
}
