//! The runner account pool (DESIGN §6 "Native provider"): numeric uids `<first>..=<last>` in one
//! group, each used by one runner at a time. The pool is the agent's memory, rebuilt at start
//! from the owners of the runtimes of uncleaned attempts (the runtime is chowned to its account
//! before anything runs in it), so a restart never hands a live runner's account to another.
//! A persistent slot's account is bound to its (policy, slot): the slot directory is owned by
//! it, and the same uid is handed out again for that slot, never to another slot while bound.

use std::collections::BTreeMap;

use crate::account::RunnerAccount;

/// Who holds a uid.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Holder {
    /// A running (or not yet cleaned) attempt, by uid of the attempt object.
    Attempt(String),
}

/// The pool.
#[derive(Clone, Debug)]
pub struct AccountPool {
    first: u32,
    last: u32,
    gid: u32,
    held: BTreeMap<u32, Holder>,
    /// uid → "<policy uid>/s<slot>": accounts bound to persistent slots.
    bound: BTreeMap<u32, String>,
}

/// Every account of the pool is in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("every runner account of the pool is in use")]
pub struct PoolExhausted;

impl AccountPool {
    pub fn new((first, last): (u32, u32), gid: u32) -> Self {
        Self {
            first,
            last,
            gid,
            held: BTreeMap::new(),
            bound: BTreeMap::new(),
        }
    }

    pub fn contains(&self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }

    fn account(&self, uid: u32) -> RunnerAccount {
        RunnerAccount { uid, gid: self.gid }
    }

    /// Records that `attempt` holds `uid` (rebuilt at start). Uids outside the pool are ignored.
    pub fn restore(&mut self, uid: u32, attempt: &str) {
        if self.contains(uid) {
            self.held.insert(uid, Holder::Attempt(attempt.to_owned()));
        }
    }

    /// Records a persistent slot's binding (from the slot directory's owner).
    pub fn restore_binding(&mut self, uid: u32, slot: &str) {
        if self.contains(uid) {
            self.bound.insert(uid, slot.to_owned());
        }
    }

    /// The account for an ephemeral attempt: the lowest uid neither held nor bound to a slot.
    pub fn assign(&mut self, attempt: &str) -> Result<RunnerAccount, PoolExhausted> {
        if let Some((uid, _)) = self
            .held
            .iter()
            .find(|(_, h)| **h == Holder::Attempt(attempt.to_owned()))
        {
            return Ok(self.account(*uid));
        }
        let uid = (self.first..=self.last)
            .find(|u| !self.held.contains_key(u) && !self.bound.contains_key(u))
            .ok_or(PoolExhausted)?;
        self.held.insert(uid, Holder::Attempt(attempt.to_owned()));
        Ok(self.account(uid))
    }

    /// The account bound to a persistent slot (`slot` = "<policy uid>/s<n>"): the one already
    /// bound to it, or the lowest free uid, bound from now on.
    pub fn assign_for_slot(
        &mut self,
        attempt: &str,
        slot: &str,
    ) -> Result<RunnerAccount, PoolExhausted> {
        let uid = match self.bound.iter().find(|(_, s)| *s == slot) {
            Some((uid, _)) => *uid,
            None => (self.first..=self.last)
                .find(|u| !self.held.contains_key(u) && !self.bound.contains_key(u))
                .ok_or(PoolExhausted)?,
        };
        if let Some(Holder::Attempt(other)) = self.held.get(&uid)
            && other != attempt
        {
            return Err(PoolExhausted);
        }
        self.bound.insert(uid, slot.to_owned());
        self.held.insert(uid, Holder::Attempt(attempt.to_owned()));
        Ok(self.account(uid))
    }

    /// Frees what `attempt` held (a slot binding stays). Idempotent.
    pub fn release(&mut self, attempt: &str) {
        self.held
            .retain(|_, h| *h != Holder::Attempt(attempt.to_owned()));
    }

    pub fn in_use(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_runner_per_account_and_a_restart_keeps_what_is_held() {
        let mut p = AccountPool::new((20001, 20002), 20000);
        p.restore(20001, "a");
        p.restore(1000, "ignored");
        let b = p.assign("b").unwrap();
        assert_eq!(
            b,
            RunnerAccount {
                uid: 20002,
                gid: 20000
            }
        );
        assert_eq!(p.assign("b").unwrap(), b, "idempotent per attempt");
        assert_eq!(p.assign("c"), Err(PoolExhausted));
        p.release("a");
        assert_eq!(p.assign("c").unwrap().uid, 20001);
    }

    #[test]
    fn a_slot_keeps_its_account_and_it_never_crosses_to_another_slot() {
        let mut p = AccountPool::new((20001, 20003), 20000);
        let s1 = p.assign_for_slot("a", "pol/s1").unwrap();
        p.release("a");
        // The bound uid is not handed to an ephemeral runner or to another slot.
        assert_ne!(p.assign("e").unwrap().uid, s1.uid);
        assert_ne!(p.assign_for_slot("b", "other/s1").unwrap().uid, s1.uid);
        assert_eq!(p.assign_for_slot("c", "pol/s1").unwrap(), s1);
        assert_eq!(p.in_use(), 3);
    }
}
