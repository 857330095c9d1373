//! Members' accounts: how `Map.addTo` survives the loss of the data plane.
//!
//! A key with a cell has its value split between the host part and the
//! cell. When the switch dies the cells die with it, and the host part
//! alone is short by whatever the cells had counted. Reading the cells
//! now and then cannot close that gap: a read does not say which of the
//! packets in flight it includes. So the value is rebuilt from the other
//! end instead, from what is known exactly:
//!
//! - the server agent's own part: every pair *it* added (the pairs the
//!   data plane left, and everything sent to it directly), kept apart from
//!   what evictions moved out of cells (`folded`, which is dropped);
//! - each member's **account**: the sum, per key, of its pairs the data
//!   plane applied. A member learns exactly which those are from the
//!   acknowledgement of each packet (its `mask`; a retransmission carries
//!   the mask of the first pass, at the switch and here, see `Seen`), so
//!   an account counts each applied pair once, in whichever cell and
//!   whichever install of the key it landed.
//!
//! Every applied pair is in exactly one account and every other pair in
//! the agent's own part, so their sum is the value — whatever the cells
//! held, whenever the switch died. A member gives its account when it
//! leaves (it adds nothing through the data plane after) and when the
//! server agent tells it the data plane is gone (after every packet it
//! sent before has been acknowledged, so the account is final). Until
//! every member the agent has seen has given its account, the map is not
//! read; a member that does not within [`ACCOUNT_WAIT_US`] (it died), or
//! one that restarted without giving the account of its earlier life,
//! makes the application fail with the reason instead of answering with a
//! value that could be short. `Map.clear` with cells in use voids the
//! accounts (what a member added before the clear is counted in them but
//! is no longer in the map): losing the data plane after such a clear
//! fails as before.
//!
//! Accounts arrive as batches of [`WideOp::Account`] items, each batch
//! acknowledged; a batch seen twice is counted once.

use std::collections::{HashMap, HashSet};

use crate::packet::{Header, Kind, Packet, Wide, WideOp};

use super::ServerAgent;

/// How long after losing the data plane the server agent waits for every
/// member's account before the application fails, µs.
pub const ACCOUNT_WAIT_US: u64 = 2_000_000;

/// The most batches an account may have (16 bits of `aux`).
const MAX_BATCHES: usize = u16::MAX as usize;

/// One incarnation of one member.
type Life = (u16, u8);

#[derive(Debug, Default)]
pub(super) struct Accounts {
    /// Accounts partly received: the batches seen, and their items.
    partial: HashMap<Life, Partial>,
    /// Lives whose account is complete.
    given: HashSet<Life>,
    /// The complete accounts, summed per logical key.
    sums: HashMap<u32, i64>,
    /// Why the accounts cannot rebuild the map, if they cannot.
    void: Option<String>,
    /// After the data plane was lost: until when to wait for the rest.
    pub(super) waiting_until: Option<u64>,
    /// When the wait began.
    waiting_since: u64,
    /// The map was rebuilt: how long after the loss (µs), from how many
    /// accounts.
    pub(super) rebuilt: Option<(u64, usize)>,
}

#[derive(Debug)]
struct Partial {
    seen: Vec<bool>,
    left: usize,
    /// Per logical key of this agent's map (others could never be added:
    /// bounded by the map, whatever a member sends).
    items: HashMap<u32, i64>,
}

impl Accounts {
    /// The accounts can no longer rebuild the map (`why`).
    pub(super) fn void(&mut self, why: String) {
        self.void.get_or_insert(why);
    }

    /// A member's newer life began: the partial accounts of its earlier
    /// ones will never complete.
    pub(super) fn forget_partial(&mut self, member: u16) {
        self.partial.retain(|(m, _), _| *m != member);
    }

    /// Whether `life` gave its whole account.
    pub(super) fn given(&self, life: Life) -> bool {
        self.given.contains(&life)
    }
}

impl ServerAgent {
    /// One batch of a member's account (`life`); acknowledged either way.
    pub(super) fn on_account(&mut self, h: &Header, life: Life, items: &[Wide]) {
        let index = (h.aux & 0xffff) as usize;
        let count = (h.aux >> 16) as usize;
        if count == 0 || index >= count || count > MAX_BATCHES {
            self.stats.ignored += 1;
            return;
        }
        let mut ack = self.header(Kind::Wide, h.src);
        ack.flow = h.flow;
        ack.aux = h.aux;
        ack.ext = h.ext & 0xff00;
        let item = Wide { op: WideOp::Account, key: Vec::new(), value: index as i64 };
        self.send(Packet::wide(ack, vec![item]));
        if self.accounts.given.contains(&life) {
            return;
        }
        let p = self.accounts.partial.entry(life).or_insert_with(|| Partial {
            seen: vec![false; count],
            left: count,
            items: HashMap::new(),
        });
        if p.seen.len() != count || p.seen[index] {
            return;
        }
        p.seen[index] = true;
        p.left -= 1;
        for i in items.iter().filter(|i| i.op == WideOp::Account) {
            if let Ok(b) = <[u8; 4]>::try_from(i.key.as_slice()) {
                let l = u32::from_be_bytes(b);
                if self.keys.contains_key(&l) {
                    let s = p.items.entry(l).or_insert(0);
                    *s = s.saturating_add(i.value);
                } else {
                    self.stats.unknown_keys += 1;
                }
            }
        }
        if p.left > 0 {
            return;
        }
        let Some(done) = self.accounts.partial.remove(&life) else { return };
        self.accounts.given.insert(life);
        if self.accounts_applied() {
            // The map was rebuilt already: this life (a member that joined
            // after the data plane was gone) had nothing applied there.
            return;
        }
        for (l, v) in done.items {
            let s = self.accounts.sums.entry(l).or_insert(0);
            *s = s.saturating_add(v);
        }
    }

    /// Whether the accounts were added to the map already (the data plane
    /// is gone and every account arrived).
    fn accounts_applied(&self) -> bool {
        self.accounts.waiting_until.is_none() && self.fallback.as_ref().is_some_and(|f| !f.failed)
    }

    /// The lives whose account the map still needs: the newest life of
    /// every member seen, and why the map cannot be rebuilt, if it cannot.
    fn missing_accounts(&self) -> Result<Vec<Life>, String> {
        if let Some(why) = &self.accounts.void {
            return Err(why.clone());
        }
        Ok((0..self.plan.members)
            .filter(|m| self.seen_members.get(usize::from(*m)).copied().unwrap_or(false))
            .map(|m| (m, self.incarnations[usize::from(m)]))
            .filter(|life| !self.accounts.given.contains(life))
            .collect())
    }

    /// The data plane held values: drops what evictions moved from cells
    /// and waits for the accounts (see the module docs), or fails the
    /// application if the map cannot be rebuilt.
    pub(super) fn start_rebuild(&mut self, now: u64) {
        if let Err(why) = self.missing_accounts() {
            return self.fail_rebuild(now, why);
        }
        for (k, v) in std::mem::take(&mut self.folded) {
            let h = self.host.entry(k).or_insert(0);
            *h = h.saturating_sub(v);
        }
        self.accounts.waiting_until = Some(now + ACCOUNT_WAIT_US);
        self.accounts.waiting_since = now;
        self.try_finish_rebuild(now);
    }

    /// Adds the accounts to the map once all are in; fails the
    /// application once the wait is over.
    pub(super) fn try_finish_rebuild(&mut self, now: u64) {
        let Some(until) = self.accounts.waiting_until else { return };
        let missing = match self.missing_accounts() {
            Ok(m) => m,
            Err(why) => return self.fail_rebuild(now, why),
        };
        if missing.is_empty() {
            self.accounts.waiting_until = None;
            let took = now.saturating_sub(self.accounts.waiting_since);
            self.accounts.rebuilt = Some((took, self.accounts.given.len()));
            for (l, v) in std::mem::take(&mut self.accounts.sums) {
                match self.keys.get(&l) {
                    Some(k) => {
                        let h = self.host.entry(k.key.clone()).or_insert(0);
                        *h = h.saturating_add(v);
                    }
                    None => self.stats.unknown_keys += 1,
                }
            }
            return;
        }
        if now >= until {
            let names: Vec<String> = missing.iter().map(|(m, _)| m.to_string()).collect();
            self.fail_rebuild(
                now,
                format!(
                    "member(s) {} did not say what the data plane applied for them within {} ms",
                    names.join(", "),
                    ACCOUNT_WAIT_US / 1000
                ),
            );
        }
    }

    fn fail_rebuild(&mut self, now: u64, why: String) {
        self.accounts.waiting_until = None;
        self.fallback_failure.get_or_insert(why);
        if let Some(fb) = &mut self.fallback {
            fb.failed = true;
            // Everyone is told again, with the failure this time.
            fb.heard = 0;
            fb.next_at = now;
        }
        self.notify_fallback(now);
    }

    /// After the data plane died holding values: how long after it the map
    /// was rebuilt (µs) and from how many members' accounts.
    pub fn map_rebuilt(&self) -> Option<(u64, usize)> {
        self.accounts.rebuilt
    }

    /// Whether the map may be read or cleared now (not while accounts are
    /// awaited: the value would be short).
    pub(super) fn map_ready(&self) -> bool {
        self.accounts.waiting_until.is_none()
    }
}
