//! Status conditions with closed vocabularies: a condition's type and reason are enums, so what
//! reaches `kubectl describe`, events and logs is a word we chose, never free text from outside.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `True`, `False` or `Unknown`, as Kubernetes conditions spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// One condition. `T` is the closed set of types, `R` the closed set of reasons.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition<T, R> {
    /// What this condition is about.
    #[serde(rename = "type")]
    pub type_: T,
    /// Whether the condition holds.
    pub status: ConditionStatus,
    /// One word for why, from a closed list.
    pub reason: R,
    /// A sentence for people: names the field or object to fix and how. Never carries a
    /// credential or a value chosen by a workflow.
    pub message: String,
    /// When `status` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// The `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Set `new` in `conditions`, keeping `lastTransitionTime` when the status did not change, so a
/// condition re-asserted every pass is not a status write every pass.
pub fn upsert<T: PartialEq + Copy, R: PartialEq>(
    conditions: &mut Vec<Condition<T, R>>,
    mut new: Condition<T, R>,
) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            *old = new;
        }
        None => conditions.push(new),
    }
}

/// The condition of type `t`, if present.
pub fn find<T: PartialEq, R>(conditions: &[Condition<T, R>], t: T) -> Option<&Condition<T, R>> {
    conditions.iter().find(|c| c.type_ == t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum T {
        A,
        B,
    }

    fn cond(t: T, status: ConditionStatus, at: i64) -> Condition<T, &'static str> {
        Condition {
            type_: t,
            status,
            reason: "r",
            message: String::new(),
            last_transition_time: Some(Time(Timestamp::from_second(at).unwrap())),
            observed_generation: None,
        }
    }

    #[test]
    fn upsert_keeps_transition_time_while_status_holds() {
        let mut cs = vec![cond(T::A, ConditionStatus::True, 10)];
        upsert(&mut cs, cond(T::A, ConditionStatus::True, 20));
        assert_eq!(cs.len(), 1);
        assert_eq!(
            cs[0].last_transition_time.as_ref().unwrap().0.as_second(),
            10
        );
        upsert(&mut cs, cond(T::A, ConditionStatus::False, 30));
        assert_eq!(
            cs[0].last_transition_time.as_ref().unwrap().0.as_second(),
            30
        );
        upsert(&mut cs, cond(T::B, ConditionStatus::True, 40));
        assert_eq!(cs.len(), 2);
        assert!(find(&cs, T::B).is_some());
    }
}
