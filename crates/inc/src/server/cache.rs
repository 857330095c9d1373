//! Which keys live in data-plane cells: installs, evictions and the
//! periodic-counting decision ([`CachePolicy`]).

use super::*;

impl ServerAgent {
    /// Gives key `l` a cell now if the policy allows.
    pub(super) fn maybe_install(&mut self, l: u32) {
        let Some((base, len)) = self.plan.memory else { return };
        if self.keys.get(&l).is_none_or(|k| k.installing || k.cell.is_some()) {
            return;
        }
        let addr = match self.plan.cache {
            CachePolicy::Hashing => {
                let s = u32::from(self.plan.switches.max(1));
                let g = u32::from(self.plan.groups);
                let addr = Addr::new(
                    (l % s) as u8,
                    ((l / s) % g) as u8,
                    (base + (l / (s * g)) % len) as u16,
                );
                if self.resident.contains_key(&addr) {
                    return;
                }
                addr
            }
            CachePolicy::Fcfs | CachePolicy::PeriodicCounting => match self.free_cells.pop() {
                Some(a) => a,
                None => return,
            },
        };
        self.install(l, addr);
    }

    pub(super) fn install(&mut self, l: u32, addr: Addr) {
        self.installed_in.insert(l, self.period);
        if let Some(k) = self.keys.get_mut(&l) {
            k.installing = true;
        }
        self.resident.insert(addr, l);
        let control = Control::Swap { app: self.plan.app, addr, tag: l, value: 0 };
        self.control(addr.switch(), control, Pending::Install { l, addr });
    }

    /// Moves the key in `addr` back to the host; `reused` when another
    /// key is installed there right after.
    pub(super) fn evict(&mut self, addr: Addr, reused: bool) {
        let Some(l) = self.resident.remove(&addr) else { return };
        if let Some(k) = self.keys.get_mut(&l) {
            k.cell = None;
        }
        self.evicting.insert(l, addr);
        self.last_cell_values.remove(&addr);
        let control = Control::Swap { app: self.plan.app, addr, tag: 0, value: 0 };
        self.control(addr.switch(), control, Pending::Evict { addr, l, reused });
    }

    /// The periodic-counting decision: `reads` are (cell, value) of every
    /// resident cell now.
    pub(super) fn rebalance(&mut self, reads: &[(Addr, i32)]) {
        self.period += 1;
        // A resident's heat: how much its cell moved plus what still reached
        // the host for it (clients that have not learned its cell yet).
        // Keys installed last period are not judged yet.
        let mut residents: Vec<(u64, Addr)> = reads
            .iter()
            .filter_map(|(a, v)| {
                let before = self.last_cell_values.insert(*a, *v).unwrap_or(0);
                let l = *self.resident.get(a)?;
                let young = self.installed_in.get(&l).is_some_and(|p| *p + 1 >= self.period);
                let host = self.heat.get(&l).copied().unwrap_or(0);
                (!young).then_some((u64::from(v.abs_diff(before)) + host, *a))
            })
            .collect();
        residents.sort_unstable();
        let mut candidates: Vec<(u64, u32)> = self
            .heat
            .iter()
            .filter(|(l, _)| self.keys.get(l).is_some_and(|k| k.cell.is_none() && !k.installing))
            .filter(|(l, _)| !self.evicting.contains_key(l))
            .map(|(l, h)| (*h, *l))
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        self.heat.clear();
        let mut coldest = residents.into_iter();
        for (heat, l) in candidates.into_iter().take(self.tuning.moves_per_period) {
            if let Some(addr) = self.free_cells.pop() {
                self.install(l, addr);
                continue;
            }
            // Move only for a clear gain (twice as hot), so keys of similar
            // heat do not trade places every period.
            match coldest.next() {
                Some((cold, addr)) if heat > 2 * cold => {
                    self.stats.evictions += 1;
                    self.evict(addr, true);
                    self.install(l, addr);
                }
                _ => break,
            }
        }
    }
}
